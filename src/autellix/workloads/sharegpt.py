"""ShareGPT: multi-turn chats, one call per turn over the growing history."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autellix.workloads.base import (
    LLM,
    MAIN_THREAD,
    AgentProgram,
    Message,
    assistant_message,
    draw,
    fit_messages,
    program_rng,
    system_message,
    user_message,
)
from autellix.workloads.data import (
    ShareGPTConversation,
    load_sharegpt,
)

#: Turns per program: mean 6.66 on 1..80 with a long tail (paper: mean 6.66, max 80).
SHAREGPT_TURNS = (6.66, 1, 80, 1.0)
#: Output tokens per call: paper mean 276.81, clipped to 1..1024.
SHAREGPT_DECODE = (276.81, 1, 1024, 0.8)
#: "paper": bytes of new user text per turn, so that a call's uncached prefill
#: (its user message plus template overhead; the rest of the history is the
#: thread's previous prompt and reply) averages the paper's 255.65.
SHAREGPT_USER_BYTES = (145.0, 8, 2048, 0.7)


@dataclass(frozen=True)
class ChatTurn:
    text: str
    max_tokens: int


def _snap_cut(text: str, start: int, end: int) -> int:
    """``end`` moved back to a whitespace after the middle of text[start:end] when there is one."""
    if end >= len(text):
        return len(text)
    cut = max(text.rfind("\n", (start + end) // 2, end), text.rfind(" ", (start + end) // 2, end))
    return cut if cut > start else end


def sharegpt_texts(
    rng: random.Random, convs: Sequence[ShareGPTConversation], turns: int, calibration: str
) -> list[str]:
    conv = rng.randrange(len(convs))
    text = convs[conv].text
    if calibration == "raw":
        # The whole real conversation, spread over the program's turns at whitespace.
        out: list[str] = []
        start = 0
        for k in range(1, turns + 1):
            end = _snap_cut(text, start, round(k * len(text) / turns))
            out.append(text[start:end].strip() or "...")
            start = end
        return out
    # "paper": short consecutive slices of real text, continuing in the next conversation when one runs out.
    out = []
    pos = text.find("\n", rng.randrange(len(text))) + 1  # from a line start (0 when none is left)
    for _ in range(turns):
        length = draw(rng, *SHAREGPT_USER_BYTES)
        if pos >= len(text):
            conv = (conv + 1) % len(convs)
            text, pos = convs[conv].text, 0
        end = _snap_cut(text, pos, pos + length)
        out.append(text[pos:end].strip() or "...")
        pos = end
    return out


def chat(workload: str, program_id: str, plan: Sequence[ChatTurn], system: str | None = None) -> AgentProgram:
    """A program that plays ``plan``: one call per turn over the growing history (cut to fit), after
    ``system`` as its system message when one is given."""

    async def run(llm: LLM) -> None:
        history: list[Message] = [] if system is None else [system_message(system)]
        for turn in plan:
            history = fit_messages([*history, user_message(turn.text)], turn.max_tokens)
            reply = await llm.chat(list(history), max_tokens=turn.max_tokens, thread=MAIN_THREAD)
            history.append(assistant_message(reply))

    return AgentProgram(workload, program_id, run, expected_calls=len(plan))


def sharegpt_program(
    program_id: str, rng: random.Random, convs: Sequence[ShareGPTConversation], calibration: str
) -> AgentProgram:
    turns = draw(rng, *SHAREGPT_TURNS)
    texts = sharegpt_texts(rng, convs, turns, calibration)
    plan = tuple(ChatTurn(t, draw(rng, *SHAREGPT_DECODE)) for t in texts)
    return chat("sharegpt", program_id, plan)


def build(indices: Sequence[int], seed: int, calibration: str, root: Path) -> list[AgentProgram]:
    convs = load_sharegpt(root)
    return [sharegpt_program(f"sharegpt-{seed}-{i}", program_rng(seed, "sharegpt", i)[1], convs, calibration)
            for i in indices]
