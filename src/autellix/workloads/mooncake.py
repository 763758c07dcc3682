"""Mooncake: the multi-turn chats of Mooncake's production chat trace, every length scaled down alike.

The trace (``../shared/workloads/mooncake``) gives each request's input and
output lengths and its 512-token prefix blocks; ``data.mooncake_conversations``
joins the requests into conversations (8,057 in the hour: three in four of one
turn, up to 43 turns). A program replays one conversation drawn uniformly: a
system message (the trace's first block, which every request shares), then one
call per turn over the whole history, each turn adding the trace's new input
tokens as a user message (real ShareGPT text of that many bytes: the tiny engine
reads one byte as one token) and asking for the trace's output tokens. Every
length is divided by :data:`SCALE`, so that the trace's median request (6,909
input tokens, 350 output) runs on the CPU engine as ShareGPT's calls do; the
history is cut to the engine's context as in every chat (``fit_messages``).
Turns follow each other at once: the trace's users paused minutes between
turns, which would only stretch a run.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from autellix.workloads.base import AgentProgram, clip_head, program_rng
from autellix.workloads.data import (
    MOONCAKE_BLOCK_TOKENS,
    MooncakeConversation,
    ShareGPTConversation,
    load_mooncake,
    load_sharegpt,
)
from autellix.workloads.sharegpt import ChatTurn, chat

WORKLOAD = "mooncake"
#: The trace's tokens per token here.
SCALE = 8


def real_text(rng: random.Random, texts: Sequence[ShareGPTConversation], size: int) -> str:
    """``size`` bytes of ShareGPT text from a line start drawn by ``rng``, continued in the next conversations."""
    conversation = rng.randrange(len(texts))
    text = texts[conversation].text
    parts = [text[text.find("\n", rng.randrange(len(text))) + 1:]]
    length = len(parts[0].encode("utf-8"))
    while length < size:
        conversation = (conversation + 1) % len(texts)
        parts.append(texts[conversation].text)
        length += len(parts[-1].encode("utf-8")) + 1
    return clip_head("\n".join(parts), size)


def system_prompt(texts: Sequence[ShareGPTConversation]) -> str:
    """The system message every program shares: the trace's first block, scaled (the same in every run)."""
    return real_text(random.Random(f"{WORKLOAD}:system"), texts, MOONCAKE_BLOCK_TOKENS // SCALE)


def mooncake_program(program_id: str, rng: random.Random, conversations: Sequence[MooncakeConversation],
                     texts: Sequence[ShareGPTConversation], system: str) -> AgentProgram:
    """One conversation drawn by ``rng``, replayed turn by turn after ``system``."""
    turns = conversations[rng.randrange(len(conversations))].turns
    plan = []
    for index, turn in enumerate(turns):
        new_tokens = turn.new_tokens - (MOONCAKE_BLOCK_TOKENS if index == 0 else 0)  # the first carries the system's
        plan.append(ChatTurn(real_text(rng, texts, max(1, round(new_tokens / SCALE))),
                             max(1, round(turn.output_tokens / SCALE))))
    return chat(WORKLOAD, program_id, plan, system=system)


def build(indices: Sequence[int], seed: int, calibration: str, root: Path) -> list[AgentProgram]:
    """Programs ``indices`` (one calibration: the trace's own lengths, scaled)."""
    conversations, texts = load_mooncake(root), load_sharegpt(root)
    system = system_prompt(texts)
    return [mooncake_program(f"{WORKLOAD}-{seed}-{i}", program_rng(seed, WORKLOAD, i)[1], conversations, texts,
                             system) for i in indices]
