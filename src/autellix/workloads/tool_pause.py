"""Tool-pause: BFCL v3 multi-turn ReAct programs that wait for real-looking tool latencies over long shared contexts.

What makes it differ from ``bfcl``: a program's whole history stays in its
prompt across turns (the full ReAct transcript, compacted only at the context
limit), its system prompt is the BFCL tool documentation itself
(:data:`SYSTEM_BYTES`, several thousand tokens, the same for every program
whose first API class is the same), and between a call that asked for a tool
and the next call the program sleeps for the tool's latency, drawn per call
from a log-normal distribution. So each program comes back to the engine,
after a pause of about a second, with a prompt that extends the one it sent
before: the case where keeping its KV blocks through the pause saves the
recompute of a long prefix (``autellix.core.kv_retention``).

Tool latency: log-normal, median :data:`TOOL_MEDIAN_S` = 1.0 s, log-space
standard deviation :data:`TOOL_SIGMA` = 1.0 (so the middle 90% of pauses lie
between 0.19 s and 5.2 s, and the mean is 1.65 s), clipped to
[:data:`TOOL_MIN_S`, :data:`TOOL_MAX_S`]. What it is based on:

* the BFCL classes stand for services an agent reaches over the network
  (messaging, posting, ticketing, trading, travel booking) or locally (a
  file system, a calculator, a vehicle's controls);
* InferCept (Abhyankar et al., "InferCept: Efficient Intercept Support for
  Augmented Large Language Model Inference", ICML 2024, arXiv:2402.01869)
  measured its augmentations' pause times: from well under a millisecond
  (arithmetic) through about 0.1 s (a simulated environment) and about
  0.7 s (a Wikipedia API question) to tens of seconds (image generation,
  text to speech, a human in the loop): heavy-tailed, spanning orders of
  magnitude, which a log-normal with a spread of e^1 per standard deviation
  reproduces around a median of a network call plus the agent framework's
  round trip;
* the gaps between an agent's turns follow a log-normal distribution
  whose parameters depend on the deployment (SAECache, arXiv:2605.18825, as
  used by llm-d's inter-turn latency producer, llm-d/llm-d-router pull
  request 2928), and tool calls in agent traces are frequent and mostly
  short, so that keeping the KV cache for a predicted time to live pays
  (Continuum, Li et al., arXiv:2511.02230, on SWE-bench and BFCL).

The parameters are :class:`ToolLatency`; ``build`` uses :data:`TOOL_LATENCY`.
Calls and lengths: every ground-truth call of a BFCL turn is one LLM call
that emits the call's text (one token per byte, at most 256) and is followed
by a tool pause and an observation (the tool's response fields with seeded
values, as ``bfcl``'s "raw" calibration); each turn ends with a reply drawn
as ``bfcl``'s (mean 34 tokens). Over the 800 entries that is 5.9 tool calls
and 4.2 replies per program, near the paper's 10.75 calls for BFCL. Both
calibrations give the same programs: this workload is defined by the raw
text.

Check loads on the A100 profile (``a100-llama3.1-8b``, one engine, the
simulator): :data:`A100_CHECK_LOADS`, per ``max_num_seqs`` the arrival rates
(programs per second) from unloaded to past saturation, each run for
:data:`A100_CHECK_ARRIVAL_SECONDS` seconds of arrivals (programs = rate x
that, at least :data:`A100_CHECK_MIN_PROGRAMS`). At the top two rates the
paused programs' contexts outgrow the KV cache, so what the engine does with
them during the pauses decides how much it recomputes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autellix.workloads.base import AgentProgram, clip_head, draw, nbytes, program_rng
from autellix.workloads.bfcl import (
    BFCL_DECODE,
    BFCL_INSTRUCTIONS,
    ReactTurn,
    ToolStep,
    call_name,
    entry_functions,
    entry_turns,
    react_program,
    tool_result,
)
from autellix.workloads.data import BFCL_CLASS_FILES, BfclEntry, BfclFunction, load_bfcl, load_bfcl_functions

WORKLOAD = "tool-pause"
#: Bytes (tokens) of the system prompt: the instructions and the involved
#: classes' JSON tool docs in file order, cut here. Every class's docs are
#: longer than this, so programs whose first class is the same share it whole.
SYSTEM_BYTES = 4096
#: Output tokens of a call that emits a tool call: its text, at most this.
MAX_CALL_TOKENS = 256
TOOL_MEDIAN_S = 1.0
TOOL_SIGMA = 1.0
TOOL_MIN_S = 0.02
TOOL_MAX_S = 30.0

#: Arrival rates (programs/s) per ``max_num_seqs`` on the A100 profile.
A100_CHECK_LOADS: dict[int, tuple[float, ...]] = {
    32: (0.5, 1.0, 2.0, 3.0),
    256: (1.0, 2.0, 4.0, 6.0),
}
A100_CHECK_ARRIVAL_SECONDS = 60.0
A100_CHECK_MIN_PROGRAMS = 20


@dataclass(frozen=True)
class ToolLatency:
    """A log-normal tool latency: ``median_s`` x e^(``sigma`` x N(0, 1)), clipped to [``min_s``, ``max_s``]."""

    median_s: float = TOOL_MEDIAN_S
    sigma: float = TOOL_SIGMA
    min_s: float = TOOL_MIN_S
    max_s: float = TOOL_MAX_S

    def __post_init__(self) -> None:
        if not (0 < self.min_s <= self.median_s <= self.max_s < math.inf):
            raise ValueError(f"tool latency needs 0 < min <= median <= max < inf, got {self}")
        if not 0 <= self.sigma < math.inf:
            raise ValueError(f"tool latency sigma must be >= 0, got {self.sigma!r}")

    def draw(self, rng: random.Random) -> float:
        """One pause in seconds, to the millisecond."""
        seconds = rng.lognormvariate(math.log(self.median_s), self.sigma)
        return round(min(self.max_s, max(self.min_s, seconds)), 3)


TOOL_LATENCY = ToolLatency()


def system_prompt(classes: Sequence[str], functions: dict[str, tuple[BfclFunction, ...]]) -> str:
    """The instructions and the JSON docs of ``classes`` (in the data's class order), cut to :data:`SYSTEM_BYTES`."""
    ordered = [cls for cls in BFCL_CLASS_FILES if cls in classes]
    docs = "\n".join(f.doc for cls in ordered for f in functions.get(cls, ()))
    return clip_head(BFCL_INSTRUCTIONS + docs, SYSTEM_BYTES)


def tool_pause_program(program_id: str, rng: random.Random, entries: Sequence[BfclEntry],
                       functions: dict[str, tuple[BfclFunction, ...]], latency: ToolLatency = TOOL_LATENCY, *,
                       system: str | None = None, workload: str = WORKLOAD) -> AgentProgram:
    """One program over a seeded BFCL entry; every choice is drawn here, none when it runs. ``system``:
    its system prompt (default: the entry's classes' docs, ``system_prompt``)."""
    entry = entries[rng.randrange(len(entries))]
    by_name = {f.name: f for f in entry_functions(entry, functions)}
    if system is None:
        system = system_prompt(entry.involved_classes, functions)
    turns: list[ReactTurn] = []
    for text, truth in entry_turns(entry, by_name, "raw"):
        steps = tuple(
            ToolStep(min(max(1, nbytes(call)), MAX_CALL_TOKENS), latency.draw(rng),
                     "Observation: " + tool_result(rng, by_name.get(call_name(call)), True, entry.category, "raw"))
            for call in truth)
        turns.append(ReactTurn(text, steps, draw(rng, *BFCL_DECODE)))
    # the whole history stays in the prompt across turns
    return react_program(workload, program_id, system, tuple(turns))


def tool_pauses(program: AgentProgram) -> list[float]:
    """The pauses ``program`` will take, in order (tests and reports read them without running it)."""
    pauses: list[float] = []

    class _Recorder:
        async def chat(self, messages: list[dict[str, str]], *, max_tokens: int, thread: str | None = None) -> str:
            return ""

        async def tool(self, seconds: float) -> None:
            pauses.append(seconds)

    coroutine = program.run(_Recorder())
    try:  # nothing in a program awaits anything but its LLM, so one send runs it to the end
        coroutine.send(None)
    except StopIteration:
        return pauses
    coroutine.close()
    raise RuntimeError(f"program {program.program_id} awaited something other than its LLM")


def build(indices: Sequence[int], seed: int, calibration: str, root: Path) -> list[AgentProgram]:
    """Programs ``indices`` (both calibrations give the same programs)."""
    entries, functions = load_bfcl(root), load_bfcl_functions(root)
    return [tool_pause_program(f"{WORKLOAD}-{seed}-{i}", program_rng(seed, WORKLOAD, i)[1], entries, functions)
            for i in indices]
