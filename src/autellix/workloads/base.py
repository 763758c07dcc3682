"""What every workload shares: the ``LLM`` a program drives, ``AgentProgram``,
the context budget and the message helpers, seeded draws, and the
``client-plas`` baseline's priority.

The engine under test emits random tokens with a byte-level tokenizer, so:

* output lengths are set by ``max_tokens`` (the runner sends ``ignore_eos``);
* the returned text is junk and never steers a program: branch choices, tree
  values and early stops come from the program's own seeded RNG;
* one token is one UTF-8 byte: every prompt (content bytes plus
  :data:`MESSAGE_OVERHEAD` per message) plus ``max_tokens`` stays within
  :data:`CONTEXT_LIMIT`, dropping old history (never the system message) when needed.

Two calibrations: ``"paper"`` sizes prompts and outputs to the paper's per-workload
statistics (:data:`PAPER_STATS`, measured there in real tokens, here in bytes);
``"raw"`` feeds the real text (ShareGPT turns, full BFCL tool docs and results,
LATS-size few-shot templates), cut only to fit the context.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

Message = dict[str, str]

#: Prompt tokens plus max_tokens stay within this (the engine's context is 8192).
CONTEXT_LIMIT = 8000
#: Chat-template tokens counted per message on top of its content bytes.
MESSAGE_OVERHEAD = 40

CALIBRATIONS: tuple[str, ...] = ("paper", "raw")

#: Thread name of the single-threaded programs (sharegpt, bfcl).
MAIN_THREAD = "main"


@dataclass(frozen=True)
class WorkloadStats:
    calls_mean: float
    calls_max: int
    prefill_mean: float
    decode_mean: float


#: The paper's per-workload measurements (tokens; README of the workload data).
PAPER_STATS: dict[str, WorkloadStats] = {
    "sharegpt": WorkloadStats(6.66, 80, 255.65, 276.81),
    "bfcl": WorkloadStats(10.75, 70, 735.06, 34.14),
    "lats": WorkloadStats(159.71, 400, 467.24, 72.64),
}


class LLM(Protocol):
    async def chat(self, messages: list[dict[str, str]], *, max_tokens: int, thread: str | None = None) -> str: ...

    def subagent(self, name: str) -> LLM:
        """The LLM of a subagent this program spawns, named ``name`` within it: its calls belong to a program
        of its own, linked to this one as its parent (a gateway ranks the two as one). Its tokens count in
        this program's."""
        ...

    async def tool(self, seconds: float) -> None:
        """A simulated tool call: ``seconds`` spent outside the engine."""
        ...


@dataclass(frozen=True)
class AgentProgram:
    workload: str  # "sharegpt" | "bfcl" | "lats"
    program_id: str
    run: Callable[[LLM], Awaitable[None]]  # the program; all randomness fixed at construction (seeded)
    expected_calls: int | None = None  # when known in advance (sharegpt, bfcl); None for lats
    #: The tokens it will generate in all, when its plan fixes them (its calls' output budgets: ``bfcl``,
    #: ``tool-pause``): what a harness that knows its plan can declare (``autellix.control.size_hints``).
    expected_tokens: int | None = None
    #: Whose program it is (an API key's tenant): engines are shared between tenants by weight
    #: (``autellix.core.TenantShares``). None: one tenant for all.
    tenant: str | None = None


# --------------------------------------------------------------------------- helpers


def prompt_tokens(messages: Sequence[Message]) -> int:
    """Prompt size in tokens of the byte-level engine: content bytes plus template overhead."""
    return sum(len(m["content"].encode("utf-8")) + MESSAGE_OVERHEAD for m in messages)


def nbytes(text: str) -> int:
    return len(text.encode("utf-8"))


def clip_head(text: str, max_bytes: int) -> str:
    """The first ``max_bytes`` bytes of ``text`` (never splitting a character)."""
    return text.encode("utf-8")[: max(0, max_bytes)].decode("utf-8", errors="ignore")


def clip_tail(text: str, max_bytes: int) -> str:
    """The last ``max_bytes`` bytes of ``text`` (never splitting a character)."""
    data = text.encode("utf-8")
    return data[max(0, len(data) - max(0, max_bytes)) :].decode("utf-8", errors="ignore")


def fit_messages(messages: list[Message], max_tokens: int) -> list[Message]:
    """Messages whose prompt plus ``max_tokens`` fits :data:`CONTEXT_LIMIT`.

    Unchanged when they fit. Otherwise the oldest messages after a leading system
    message are dropped, down to half of the room the system message leaves, so
    that the next calls append to a stable prefix again (a prefix cache keeps
    working between two compactions); the kept history starts with a user message
    and always ends with the last message. Content is cut only if the system
    message and the last message alone do not fit (the last one loses its head).
    """
    if prompt_tokens(messages) + max_tokens <= CONTEXT_LIMIT:
        return messages
    head = messages[:1] if messages and messages[0]["role"] == "system" else []
    rest = messages[len(head) :]
    room = CONTEXT_LIMIT - prompt_tokens(head)
    target = room // 2
    while len(rest) > 1 and (prompt_tokens(rest) + max_tokens > target or rest[0]["role"] != "user"):
        rest = rest[1:]
    out = head + rest
    excess = prompt_tokens(out) + max_tokens - CONTEXT_LIMIT
    if excess > 0 and rest:
        last = rest[-1]
        keep = max(0, nbytes(last["content"]) - excess)
        out[-1] = {"role": last["role"], "content": clip_tail(last["content"], keep)}
        excess = prompt_tokens(out) + max_tokens - CONTEXT_LIMIT
    if excess > 0 and head:
        keep = max(0, nbytes(head[0]["content"]) - excess)
        out[0] = {"role": "system", "content": clip_head(head[0]["content"], keep)}
    return out


@functools.cache
def _discrete_lognormal(mean: float, lo: int, hi: int, sigma: float) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """A lognormal shape on the integers lo..hi whose mean is exactly ``mean``: (values, cumulative weights)."""
    values = tuple(range(lo, hi + 1))
    logs = [math.log(v) for v in values]

    def weights(mu: float) -> list[float]:
        return [math.exp(-((lv - mu) ** 2) / (2 * sigma * sigma)) / v for lv, v in zip(logs, values, strict=True)]

    def mean_of(mu: float) -> float:
        w = weights(mu)
        return sum(v * x for v, x in zip(values, w, strict=True)) / sum(w)

    a, b = math.log(lo) - 3 * sigma, math.log(hi) + 3 * sigma
    for _ in range(80):
        mid = (a + b) / 2
        if mean_of(mid) < mean:
            a = mid
        else:
            b = mid
    return values, tuple(accumulate(weights((a + b) / 2)))


def draw(rng: random.Random, mean: float, lo: int, hi: int, sigma: float) -> int:
    values, cum = _discrete_lognormal(mean, lo, hi, sigma)
    return rng.choices(values, cum_weights=cum)[0]


def system_message(text: str) -> Message:
    return {"role": "system", "content": text}


def user_message(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant_message(text: str) -> Message:
    return {"role": "assistant", "content": text}


# --------------------------------------------------------------------------- seeds


def program_rng(seed: int, workload: str, index: int) -> tuple[str, random.Random]:
    key = f"{seed}:{workload}:{index}"
    return key, random.Random(key)



#: ``client-plas``: tokens a program may generate before its calls drop to the
#: second priority bucket; each later bucket starts at twice the tokens.
CLIENT_PRIORITY_FIRST_BUCKET = 64


def declarations(tokens: Mapping[str, int], error: float, seed: int) -> dict[str, int]:
    """What programs declare of ``tokens`` (each program's generated tokens in all) when each knows its
    own within a fixed log-normal factor e^N(0, ``error``) (0: exactly), drawn per program from ``seed``
    in the order of their ids: the same declarations wherever the same sizes are known."""
    rng = random.Random(seed)
    return {key: max(1, round(tokens[key] * math.exp(rng.gauss(0.0, error)))) for key in sorted(tokens)}


def client_priority(generated_tokens: int) -> int:
    """The ``client-plas`` baseline, what a user can do without Autellix: the
    program sends, as stock vLLM's ``priority`` (engine run with
    ``--scheduling-policy priority``, lower first), the tokens it has generated
    so far, bucketed by doubling (0 below 64 tokens, 1 below 128, 2 below 256,
    ...), so its calls fall behind younger programs' as it grows. No gateway,
    no session: the client counts only its own output tokens, so it knows
    neither prefill work nor model time, has no anti-starvation and no view of
    other engines."""
    if generated_tokens < CLIENT_PRIORITY_FIRST_BUCKET:
        return 0
    return 1 + int(math.log2(generated_tokens / CLIENT_PRIORITY_FIRST_BUCKET))

