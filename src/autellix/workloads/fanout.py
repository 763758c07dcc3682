"""Fan-out: multi-agent programs (rounds of parallel calls over one long shared prompt) among short chats."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from pathlib import Path

from autellix.workloads.base import (
    LLM,
    AgentProgram,
    clip_head,
    clip_tail,
    draw,
    fit_messages,
    nbytes,
    program_rng,
    system_message,
    user_message,
)
from autellix.workloads.data import (
    ShareGPTConversation,
    load_sharegpt,
)
from autellix.workloads.sharegpt import ChatTurn, chat, sharegpt_texts

#: ``fanout``: this share of programs are multi-agent rounds, the rest short chats.
FANOUT_MULTIAGENT_SHARE = 0.2
#: Rounds per multi-agent program, and agents (parallel calls) per round.
FANOUT_ROUNDS = (2, 4)
FANOUT_AGENTS = (4, 16)
#: Bytes of the long prompt every agent of a program shares (real ShareGPT text).
FANOUT_SHARED_BYTES = (2500, 3500)
#: Output tokens per agent call: up to 400, mean about 250.
FANOUT_DECODE = (250.0, 32, 400, 0.5)
#: Bytes of the previous round's replies shown to every agent of the next round.
FANOUT_DIGEST_BYTES = 1200
#: Short chats beside them: turns, and output tokens per turn.
CHAT_TURNS = (2, 4)
CHAT_DECODE = (30, 120)
FANOUT_TOOL_DELAY = (0.05, 0.3)


def _long_text(rng: random.Random, convs: Sequence[ShareGPTConversation], size: int) -> str:
    """``size`` bytes of consecutive real text, from a line start of a random conversation onwards."""
    conv = rng.randrange(len(convs))
    text, out = convs[conv].text, ""
    pos = text.find("\n", rng.randrange(len(text))) + 1
    while nbytes(out) < size:
        if pos >= len(text):
            conv = (conv + 1) % len(convs)
            text, pos = convs[conv].text, 0
        piece = text[pos : pos + size]
        out += piece
        pos += len(piece)
    return clip_head(out, size)


def multiagent_program(program_id: str, rng: random.Random, convs: Sequence[ShareGPTConversation], *,
                       subagents: bool = False) -> AgentProgram:
    """A multi-agent debate: each round, ``k`` agents answer in parallel over one
    long shared document (the same prefix), then the next round shows every agent
    a digest of the last round's answers. Its critical path is one call a round;
    its engine use is ``k`` calls a round. With ``subagents`` each agent is a
    subagent the program spawns (``LLM.subagent``) rather than a thread of its
    own calls: the same calls, made by programs linked to it."""
    rounds = rng.randint(*FANOUT_ROUNDS)
    agents = rng.randint(*FANOUT_AGENTS)
    document = _long_text(rng, convs, rng.randint(*FANOUT_SHARED_BYTES))
    plan = tuple(tuple(draw(rng, *FANOUT_DECODE) for _ in range(agents)) for _ in range(rounds))
    delay = round(rng.uniform(*FANOUT_TOOL_DELAY), 3)
    system = "You are one of several agents debating the document below. Be concise.\n" + document

    async def run(llm: LLM) -> None:
        digest = ""
        members = [llm.subagent(f"agent{i}") for i in range(agents)] if subagents else [llm] * agents
        for r, tokens in enumerate(plan):
            async def agent(i: int, max_tokens: int, r: int = r, digest: str = digest) -> str:
                task = (f"Round {r + 1}. " + (f"The other agents said:\n{digest}\n" if digest else "")
                        + f"You are agent {i + 1}: give your position.")
                messages = fit_messages([system_message(system), user_message(task)], max_tokens)
                return await members[i].chat(messages, max_tokens=max_tokens, thread=f"agent{i}")

            replies = await asyncio.gather(*(agent(i, n) for i, n in enumerate(tokens)))
            digest = clip_tail("\n".join(replies), FANOUT_DIGEST_BYTES)
            await llm.tool(delay)  # the coordinator merges the round

    return AgentProgram("multiagent", program_id, run, expected_calls=rounds * agents)


def chat_program(program_id: str, rng: random.Random, convs: Sequence[ShareGPTConversation]) -> AgentProgram:
    """A short chat: 2-4 turns of real ShareGPT text, 30-120 output tokens a turn."""
    turns = rng.randint(*CHAT_TURNS)
    texts = sharegpt_texts(rng, convs, turns, "paper")
    plan = tuple(ChatTurn(t, rng.randint(*CHAT_DECODE)) for t in texts)
    return chat("chat", program_id, plan)


def build(indices: Sequence[int], seed: int, calibration: str, root: Path, *,
          subagents: bool = False) -> list[AgentProgram]:
    """Multi-agent programs among short chats, each program's kind drawn (``calibration`` does not apply);
    ``subagents``: the multi-agent programs' agents are subagents (the same programs otherwise)."""
    convs = load_sharegpt(root)
    out: list[AgentProgram] = []
    for i in indices:
        _, rng = program_rng(seed, "fanout", i)
        if rng.random() < FANOUT_MULTIAGENT_SHARE:
            out.append(multiagent_program(f"fanout-{seed}-{i}", rng, convs, subagents=subagents))
        else:
            out.append(chat_program(f"chat-{seed}-{i}", rng, convs))
    return out


def build_multiagent(indices: Sequence[int], seed: int, calibration: str, root: Path) -> list[AgentProgram]:
    """Fanout's multi-agent programs alone (one of the kinds "mixed" interleaves)."""
    convs = load_sharegpt(root)
    return [multiagent_program(f"multiagent-{seed}-{i}", program_rng(seed, "multiagent", i)[1], convs)
            for i in indices]


def build_with_subagents(indices: Sequence[int], seed: int, calibration: str, root: Path) -> list[AgentProgram]:
    """``fanout`` written as subagents: each multi-agent program's agents are subagents it spawns."""
    return build(indices, seed, calibration, root, subagents=True)
