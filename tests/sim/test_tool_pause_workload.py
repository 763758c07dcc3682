"""The tool-pause workload: BFCL programs with log-normal tool latencies over long shared tool docs."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from autellix.workloads import WORKLOADS, make_programs
from autellix.workloads.data import workloads_available
from autellix.workloads.tool_pause import (
    SYSTEM_BYTES,
    TOOL_LATENCY,
    WORKLOAD,
    ToolLatency,
    tool_pauses,
)


class Recorder:
    """An ``LLM`` that records every call's messages and every pause."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[dict[str, str]], int]] = []
        self.pauses: list[float] = []

    async def chat(self, messages: list[dict[str, str]], *, max_tokens: int, thread: str | None = None) -> str:
        self.calls.append((messages, max_tokens))
        return f"reply {len(self.calls)}"

    async def tool(self, seconds: float) -> None:
        self.pauses.append(seconds)


def record(program) -> Recorder:
    llm = Recorder()
    coroutine = program.run(llm)
    with pytest.raises(StopIteration):
        coroutine.send(None)
    return llm


def test_the_latency_distribution_has_its_median_and_spread() -> None:
    for latency in (TOOL_LATENCY, ToolLatency(median_s=0.3, sigma=0.5, min_s=0.001, max_s=100.0)):
        rng = random.Random(11)
        draws = [latency.draw(rng) for _ in range(20000)]
        assert statistics.median(draws) == pytest.approx(latency.median_s, rel=0.05)
        logs = [math.log(d) for d in draws if latency.min_s < d < latency.max_s]
        assert statistics.pstdev(logs) == pytest.approx(latency.sigma, rel=0.06)
        assert latency.min_s <= min(draws) and max(draws) <= latency.max_s
    clipped = ToolLatency(median_s=1.0, sigma=3.0, min_s=0.5, max_s=2.0)
    draws = [clipped.draw(random.Random(i)) for i in range(200)]
    assert min(draws) == 0.5 and max(draws) == 2.0
    with pytest.raises(ValueError):
        ToolLatency(median_s=0.01, min_s=0.02)
    with pytest.raises(ValueError):
        ToolLatency(sigma=-1.0)


needs_data = pytest.mark.skipif(not workloads_available(), reason="the shared workload data is not here")


@needs_data
def test_programs_are_deterministic_in_the_seed_and_registered() -> None:
    assert WORKLOAD in WORKLOADS
    first = make_programs(WORKLOAD, 6, seed=5)
    again = make_programs(WORKLOAD, 6, seed=5)
    other = make_programs(WORKLOAD, 6, seed=6)
    assert [p.program_id for p in first] == [f"tool-pause-5-{i}" for i in range(6)]
    runs = [(record(a).calls, record(a).pauses) for a in first]
    assert runs == [(record(b).calls, record(b).pauses) for b in again]
    assert [tool_pauses(p) for p in first] == [r[1] for r in runs]
    assert [tool_pauses(p) for p in other] != [r[1] for r in runs]
    for program, (calls, _) in zip(first, runs, strict=True):
        assert program.workload == WORKLOAD and program.expected_calls == len(calls)
    # the calibration does not change this workload
    assert [tool_pauses(p) for p in make_programs(WORKLOAD, 6, seed=5, calibration="raw")] == [r[1] for r in runs]


@needs_data
def test_programs_pause_between_calls_over_a_long_shared_prefix() -> None:
    programs = make_programs(WORKLOAD, 40, seed=2)
    systems: dict[str, set[str]] = {}
    pauses: list[float] = []
    for program in programs:
        llm = record(program)
        pauses += llm.pauses
        system = llm.calls[0][0][0]
        assert system["role"] == "system" and len(system["content"].encode()) == SYSTEM_BYTES
        systems.setdefault(system["content"][:1000], set()).add(system["content"])
        # a pause follows every call that asked for a tool, so there is one pause fewer than
        # calls for each turn's reply
        assert 0 < len(llm.pauses) < len(llm.calls)
        for (before, _), (after, _) in zip(llm.calls, llm.calls[1:], strict=False):
            assert after[0] == before[0]  # the tool docs lead every prompt
            if len(after) > len(before):  # no compaction between them: the history extends
                assert after[:len(before)] == before
    # programs whose tool docs begin alike share them whole (the first class's docs exceed the cut)
    assert all(len(texts) == 1 for texts in systems.values()) and len(systems) > 1
    assert statistics.median(pauses) == pytest.approx(TOOL_LATENCY.median_s, rel=0.25)
    calls = [p.expected_calls for p in programs]
    assert 5 <= statistics.mean(calls) <= 16
