"""The helpers of the experiment scripts in experiments/ (the scripts themselves need the real engine or minutes)."""

from __future__ import annotations

import pytest

from autellix.loadgen.stack_sweep import ENGINE_SETTINGS
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import simulate_programs
from autellix.workloads import make_programs
from autellix.workloads.data import workloads_available
from autellix.workloads.systems import SYSTEMS
from tests.live import load_experiment

needs_data = pytest.mark.skipif(not workloads_available(), reason="workload data not found")


def test_the_cpu_check_reads_the_sweeps_token_budget() -> None:
    check = load_experiment("cpu_engine_settings_in_simulator")
    assert ENGINE_SETTINGS["mixed"].max_num_batched_tokens == 2048
    # each engine setting is simulated on its own profile, with its slots and budget
    heavy = ENGINE_SETTINGS["mixed"].sim_profile()
    assert (heavy.name, heavy.max_num_seqs, heavy.max_num_batched_tokens) == ("cpu-tiny-heavy", 8, 2048)
    light = ENGINE_SETTINGS["bfcl"].sim_profile()
    assert (light.name, light.max_num_seqs, light.max_num_batched_tokens) == ("cpu-tiny", 4, 1024)
    results = {("w", 1.0, 0, "autellix"): {"m": 2.0}, ("w", 1.0, 0, "x"): {"m": 4.0},
               ("w", 1.0, 1, "autellix"): {"m": 1.0}, ("w", 1.0, 1, "x"): {"m": 4.0}}
    assert check.ratios(results, "w", 1.0, range(2), "m", "x") == [0.5, 0.25]
    assert check.geomean([0.5, 2.0]) == pytest.approx(1.0)


def test_a_budget_is_autellix_under_another_name() -> None:
    name = load_experiment("preemption_budget").budget_system(0)
    try:
        assert name == "autellix-p0"
        assert SYSTEMS[name].engine_scheduler == SYSTEMS["autellix"].engine_scheduler
        assert SYSTEMS[name].policy == SYSTEMS["autellix"].policy
    finally:
        SYSTEMS.pop(name, None)


@needs_data
def test_kinds_split_a_runs_programs_and_calls() -> None:
    fidelity = load_experiment("engine_vs_simulator_by_kind")
    profile = EngineProfile.load("cpu-tiny").with_overrides(max_num_seqs=8)
    run = simulate_programs(make_programs("mixed", 8, seed=1), profile=profile, system="autellix", rate=2.0,
                            seed=1).result
    kinds = fidelity.by_kind(run)
    assert set(kinds) == {p.workload for p in run.programs} and len(kinds) > 1
    assert sum(k["programs"] for k in kinds.values()) == len(run.programs)
    assert sum(k["calls"] for k in kinds.values()) == len(run.calls)
    for kind in kinds.values():
        assert kind["call_latency_s"] == pytest.approx(kind["queue_s"] + kind["in_engine_s"])
        assert kind["prompt_tokens"] > 0 and kind["token_latency_ms"] > 0
        assert kind["transport_s"] == 0.0  # simulated calls have no transport
    for call in run.calls:  # as the runner records vLLM's own timings: 10 ms spent outside the engine
        call.engine_s = call.finished - call.submitted - 0.01
    assert all(k["transport_s"] == pytest.approx(0.01) for k in fidelity.by_kind(run).values())
