"""Declared sizes in the simulator: what declaring buys, and a program that lies about its size gains nothing."""

from __future__ import annotations

import statistics

import pytest

from autellix.sim.clairvoyant import LEARNING_SYSTEM, Clairvoyance
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import simulate_programs
from autellix.workloads import make_programs
from autellix.workloads.data import workloads_available

needs_data = pytest.mark.skipif(not workloads_available(), reason="workload data not found")
RATE, SEED = 1.2, 3


def _latencies(programs, profile, declared: dict[str, int] | None) -> dict[str, float]:
    run = simulate_programs(programs, profile=profile, system="autellix", rate=RATE, seed=SEED, declared=declared)
    assert all(p.error is None for p in run.result.programs)
    return {p.program_id: p.token_latency for p in run.result.programs}


@needs_data
def test_truthful_declarations_lower_the_mean_and_a_liar_gains_nothing() -> None:
    profile = EngineProfile.load("a100-llama3.1-8b").with_overrides(max_num_seqs=32)
    programs = make_programs("mixed", 80, seed=SEED)
    seen = Clairvoyance()
    simulate_programs(programs, profile=profile, system=LEARNING_SYSTEM, rate=RATE, seed=SEED, ranks=seen)
    truth = dict(seen.tokens)
    # the liars: the five largest programs, which have the most to gain by passing for small ones
    liars = sorted(truth, key=truth.__getitem__)[-5:]
    silent = {p: t for p, t in truth.items() if p not in liars}  # the liars say nothing ...
    lying = silent | {p: max(1, truth[p] // 50) for p in liars}  # ... or a fiftieth of their size
    plain = _latencies(programs, profile, None)
    honest = _latencies(programs, profile, truth)
    quiet, lied = _latencies(programs, profile, silent), _latencies(programs, profile, lying)

    assert statistics.mean(honest.values()) < 0.95 * statistics.mean(plain.values())
    mean_liars = {name: statistics.mean(run[p] for p in liars) for name, run in (("quiet", quiet), ("lied", lied))}
    # lying ranks a program at the larger of its service and its claim: never ahead of saying nothing
    assert mean_liars["lied"] >= 0.98 * mean_liars["quiet"], mean_liars


@needs_data
@pytest.mark.parametrize("workload", ["tool-pause", "bfcl"])
def test_a_plan_declares_exactly_what_its_program_generates(workload: str) -> None:
    """What the benchmark's load generator declares for ``autellix-declared`` on a real engine (the plan's
    output budgets, ``AgentProgram.expected_tokens``) is what the program generates."""
    profile = EngineProfile.load("a100-llama3.1-8b").with_overrides(max_num_seqs=32)
    programs = make_programs(workload, 12, seed=SEED)
    seen = Clairvoyance()
    simulate_programs(programs, profile=profile, system=LEARNING_SYSTEM, rate=RATE, seed=SEED, ranks=seen)
    assert all(p.expected_tokens for p in programs)
    assert {p.program_id: p.expected_tokens for p in programs} == dict(seen.tokens)
