"""The benchmark's agent programs, driven by a recording fake LLM.

The fake stands in for the engine under test: it answers at once with a reply of
exactly ``max_tokens`` bytes (the engine's byte-level tokenizer and ``ignore_eos``
make every reply that long), records each call and tool delay, and counts the
calls in flight. Statistics are compared with the paper's table in the workload
README (real tokens there; bytes here, one engine token per byte).
"""

from __future__ import annotations

import asyncio
import functools
import statistics
from collections.abc import Sequence
from pathlib import Path

import pytest

from autellix.workloads import CONTEXT_LIMIT, AgentProgram, make_programs
from autellix.workloads.data import ENV_VAR, workloads_available, workloads_dir

#: From /work/shared/workloads/README.md: calls per program, prefill and decode tokens per call.
PAPER = {
    "sharegpt": {"calls": 6.66, "prefill": 255.65, "decode": 276.81},
    "bfcl": {"calls": 10.75, "prefill": 735.06, "decode": 34.14},
    "lats": {"calls": 159.71, "prefill": 467.24, "decode": 72.64},
}
TEMPLATE_OVERHEAD = 40  # per message, as the programs budget it
COUNT = 60
SEED = 1
Call = tuple[tuple[tuple[str, str], ...], int, str | None]  # (messages as (role, content)), max_tokens, thread




needs_data = pytest.mark.skipif(not workloads_available(), reason=f"no workload data (set {ENV_VAR})")


class RecordingLLM:
    """Records every call; replies with ``max_tokens`` copies of ``char`` without waiting."""

    def __init__(self, char: str = "x") -> None:
        self.char = char
        self.events: list[tuple[str, object]] = []  # ("chat", Call) or ("tool", seconds)
        self.in_flight = 0
        self.max_in_flight = 0

    async def chat(self, messages: list[dict[str, str]], *, max_tokens: int, thread: str | None = None) -> str:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        call: Call = (tuple((m["role"], m["content"]) for m in messages), max_tokens, thread)
        self.events.append(("chat", call))
        try:
            await asyncio.sleep(0)  # let the program's other coroutines start their calls
        finally:
            self.in_flight -= 1
        return self.char * max_tokens

    async def tool(self, seconds: float) -> None:
        self.events.append(("tool", seconds))

    @property
    def calls(self) -> list[Call]:
        return [e[1] for e in self.events if e[0] == "chat"]  # type: ignore[misc]


def _prompt_tokens(messages: Sequence[tuple[str, str]]) -> int:
    return sum(len(content.encode("utf-8")) + TEMPLATE_OVERHEAD for _, content in messages)


def _drive(program: AgentProgram, char: str = "x") -> RecordingLLM:
    llm = RecordingLLM(char)
    asyncio.run(program.run(llm))
    return llm


@functools.cache
def _runs(workload: str, calibration: str = "paper", seed: int = SEED, char: str = "x") -> tuple[RecordingLLM, ...]:
    programs = make_programs(workload, COUNT, seed=seed, calibration=calibration)
    return tuple(_drive(p, char) for p in programs)


def _new_prefill(calls: Sequence[Call]) -> list[int]:
    """Per call, the prompt tokens not cached from the same thread's previous call (its prompt and reply)."""
    last: dict[str | None, tuple[tuple[str, str], ...]] = {}
    out = []
    for messages, max_tokens, thread in calls:
        cached = last.get(thread, ())
        k = 0
        while k < min(len(cached), len(messages)) and cached[k] == messages[k]:
            k += 1
        out.append(_prompt_tokens(messages) - _prompt_tokens(messages[:k]))
        last[thread] = (*messages, ("assistant", "x" * max_tokens))
    return out


def _stats(runs: Sequence[RecordingLLM]) -> dict[str, float]:
    calls = [c for r in runs for c in r.calls]
    return {
        "calls": statistics.mean(len(r.calls) for r in runs),
        "decode": statistics.mean(c[1] for c in calls),
        "prompt": statistics.mean(_prompt_tokens(c[0]) for c in calls),
        "new_prefill": statistics.mean(p for r in runs for p in _new_prefill(r.calls)),
    }


def _log(runs: Sequence[RecordingLLM]) -> list[list[tuple[str, object]]]:
    return [r.events for r in runs]


# --------------------------------------------------------------------------- arguments and data


def test_unknown_workload_or_calibration_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="sharegpt, bfcl, lats, fanout, mixed"):
        make_programs("chess", 1, seed=0)
    with pytest.raises(ValueError, match="paper, raw"):
        make_programs("bfcl", 1, seed=0, calibration="tokens")


def test_missing_data_folder_names_the_env_var(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match=ENV_VAR):
        make_programs("sharegpt", 1, seed=0)
    with pytest.raises(FileNotFoundError, match=ENV_VAR):
        make_programs("lats", 1, seed=0, data_dir=tmp_path / "absent")


@needs_data
def test_env_var_points_at_the_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(workloads_dir()))
    assert workloads_dir() == workloads_dir(data_dir=str(workloads_dir()))
    assert len(make_programs("lats", 2, seed=0)) == 2


# --------------------------------------------------------------------------- per workload

WORKLOADS = ["sharegpt", "bfcl", "lats"]


@needs_data
@pytest.mark.parametrize("workload", WORKLOADS)
def test_same_seed_same_calls_other_seed_other_calls(workload: str) -> None:
    first = _runs(workload)
    again = [_drive(p) for p in make_programs(workload, COUNT, seed=SEED)]
    assert _log(first) == _log(again)
    assert _log(first) != _log(_runs(workload, seed=SEED + 1))
    program = make_programs(workload, 1, seed=SEED)[0]
    assert _drive(program).events == _drive(program).events  # a program replays identically


@needs_data
@pytest.mark.parametrize("workload", WORKLOADS)
def test_calls_per_program_match_the_paper(workload: str) -> None:
    runs = _runs(workload)
    assert _stats(runs)["calls"] == pytest.approx(PAPER[workload]["calls"], rel=0.35)
    for program, run in zip(make_programs(workload, COUNT, seed=SEED), runs, strict=True):
        assert program.workload == workload
        if workload == "lats":
            assert program.expected_calls is None
        else:
            assert program.expected_calls == len(run.calls)
    assert len({p.program_id for p in make_programs(workload, COUNT, seed=SEED)}) == COUNT


@needs_data
@pytest.mark.parametrize("workload", WORKLOADS)
def test_decode_tokens_match_the_paper(workload: str) -> None:
    runs = _runs(workload)
    assert _stats(runs)["decode"] == pytest.approx(PAPER[workload]["decode"], rel=0.25)
    cap = {"sharegpt": 1024, "bfcl": 256, "lats": 100}[workload]
    assert all(1 <= c[1] <= cap for r in runs for c in r.calls)


@needs_data
@pytest.mark.parametrize("workload", ["bfcl", "lats"])
def test_prompt_tokens_match_the_paper(workload: str) -> None:
    assert _stats(_runs(workload))["prompt"] == pytest.approx(PAPER[workload]["prefill"], rel=0.40)


@needs_data
def test_sharegpt_new_prefill_matches_the_paper() -> None:
    """A chat call's prompt is the whole history, so its size grows with the turn (thousands of
    tokens); the paper's 255.65 matches the part not cached from the previous turn."""
    stats = _stats(_runs("sharegpt"))
    assert stats["new_prefill"] == pytest.approx(PAPER["sharegpt"]["prefill"], rel=0.40)
    assert stats["prompt"] > 3 * stats["new_prefill"]


@needs_data
@pytest.mark.parametrize("calibration", ["paper", "raw"])
@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("char", ["x", "\ufffd"])  # junk decoded to replacement characters is 3 bytes a token
def test_every_prompt_fits_the_context(workload: str, calibration: str, char: str) -> None:
    for run in _runs(workload, calibration, char=char):
        for messages, max_tokens, _ in run.calls:
            assert _prompt_tokens(messages) + max_tokens <= CONTEXT_LIMIT
            assert messages and all(content for _, content in messages)


@needs_data
def test_raw_prompts_are_larger_than_paper_ones() -> None:
    for workload in WORKLOADS:
        raw, paper = _stats(_runs(workload, "raw")), _stats(_runs(workload, "paper"))
        assert raw["prompt"] > 1.3 * paper["prompt"]
        assert raw["new_prefill"] > 3 * paper["new_prefill"]


@needs_data
@pytest.mark.parametrize("calibration", ["paper", "raw"])
def test_sharegpt_is_one_thread_that_extends_its_history(calibration: str) -> None:
    calls = [c for r in _runs("sharegpt", calibration) for c in r.calls]
    assert {c[2] for c in calls} == {"main"}
    for run in _runs("sharegpt", calibration):
        for i, (messages, _, _) in enumerate(run.calls):
            assert messages[-1][0] == "user"
            assert len(messages) <= 2 * i + 1
            assert messages[0][0] == "user"  # compaction never leaves a reply first


@needs_data
@pytest.mark.parametrize("calibration", ["paper", "raw"])
def test_bfcl_shares_the_system_prompt_and_calls_tools_between_steps(calibration: str) -> None:
    for run in _runs("bfcl", calibration):
        calls = run.calls
        assert calls[0][0][0][0] == "system"
        assert {c[0][0] for c in calls} == {calls[0][0][0]}  # the identical first message on every call
        events = run.events
        tools = [i for i, e in enumerate(events) if e[0] == "tool"]
        assert tools, "every entry has at least one tool step"
        for i in tools:
            assert events[i - 1][0] == "chat"  # a tool runs after the step that called it
            assert 0.05 <= events[i][1] <= 0.5  # type: ignore[operator]
            after = events[i + 1]
            assert after[0] == "chat"
            assert after[1][0][-1][1].startswith("Observation: ")  # type: ignore[index]
    if calibration == "paper":
        sizes = {len(r.calls[0][0][0][1].encode()) for r in _runs("bfcl", "paper")}
        assert max(sizes) <= 400


@needs_data
@pytest.mark.parametrize("calibration", ["paper", "raw"])
def test_lats_runs_samples_in_parallel_threads(calibration: str) -> None:
    runs = _runs("lats", calibration)
    assert min(r.max_in_flight for r in runs) >= 5
    for run in runs:
        threads = [c[2] for c in run.calls]
        assert {t for t in threads if t and t.startswith("n0-s")} == {f"n0-s{i}" for i in range(5)}
        assert len(run.calls) <= 400
        assert all(c[1] <= 100 for c in run.calls)


@needs_data
def test_mixed_interleaves_equal_shares() -> None:
    kinds_all = [*WORKLOADS, "multiagent"]
    programs = make_programs("mixed", COUNT, seed=SEED)
    kinds = [p.workload for p in programs]
    assert {k: kinds.count(k) for k in kinds_all} == dict.fromkeys(kinds_all, COUNT // 4)
    for end in range(4, COUNT + 1, 4):  # every block of four holds one of each
        assert sorted(kinds[end - 4 : end]) == sorted(kinds_all)
    assert [p.program_id for p in programs] == [p.program_id for p in make_programs("mixed", COUNT, seed=SEED)]
    assert kinds != [p.workload for p in make_programs("mixed", COUNT, seed=SEED + 1)]
    singles = {p.program_id for w in kinds_all for p in make_programs(w, COUNT // 4, seed=SEED)}
    assert {p.program_id for p in programs} == singles
    assert len(make_programs("mixed", 7, seed=SEED)) == 7


@needs_data
def test_fanout_runs_rounds_of_parallel_calls_over_one_shared_prompt_beside_short_chats() -> None:
    programs = make_programs("fanout", COUNT, seed=SEED)
    kinds = [p.workload for p in programs]
    assert set(kinds) == {"multiagent", "chat"}
    assert 0.05 * COUNT <= kinds.count("multiagent") <= 0.4 * COUNT  # about a fifth
    runs = _runs("fanout")
    assert [r.calls for r in runs] == [_drive(p).calls for p in programs]  # deterministic
    for program, run in zip(programs, runs, strict=True):
        calls = run.calls
        assert len(calls) == program.expected_calls
        if program.workload == "chat":
            assert 2 <= len(calls) <= 4 and run.max_in_flight == 1
            assert all(30 <= c[1] <= 120 for c in calls)
            continue
        assert 4 <= run.max_in_flight <= 16
        width = run.max_in_flight
        assert len(calls) % width == 0 and 2 <= len(calls) // width <= 4  # rounds of k parallel calls
        assert all(c[1] <= 400 for c in calls)
        systems = {c[0][0] for c in calls}
        assert len(systems) == 1  # one long shared prompt, the same prefix for every agent and round
        (role, document), = systems
        assert role == "system" and len(document.encode()) >= 2500
        rounds = [calls[i : i + width] for i in range(0, len(calls), width)]
        assert {c[2] for c in rounds[0]} == {f"agent{i}" for i in range(width)}
        assert all("The other agents said" in c[0][1][1] for c in rounds[1])
