"""The clairvoyant order: ranks by whole work, runs twice in the simulator, bounds the others, and the
check runs it where the load makes order matter."""

from __future__ import annotations

import pytest

from autellix.loadgen.stack_sweep import run_sweep
from autellix.sim.clairvoyant import Clairvoyance
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import sim_summary, simulate_programs
from autellix.sim.sweep import CEILING, DECLARED, Load, check, check_table, overloaded
from autellix.workloads import make_programs
from autellix.workloads.data import workloads_available

needs_data = pytest.mark.skipif(not workloads_available(), reason="workload data not found")


def test_a_program_ranks_by_its_remaining_work_times_its_tokens() -> None:
    seen = Clairvoyance()
    seen.finished("short", 1.0, 10)
    seen.finished("long", 4.0, 10)
    seen.finished("long/helper", 4.0, 30)  # a subagent's work is its root's
    seen.finished("chatty", 1.0, 100)
    seen.learning = False
    assert seen.rank("short") == pytest.approx(10.0)
    assert seen.rank("long") == pytest.approx(8.0 * 40) == pytest.approx(seen.rank("long/helper"))
    assert seen.rank("chatty") == pytest.approx(100.0)  # as much work, but many tokens to spread it over
    seen.finished("long", 6.0, 30)  # pass two: what is served no longer counts
    assert seen.rank("long") == pytest.approx(2.0 * 40)
    seen.finished("long", 5.0, 0)  # served more than learnt: the least rank, not a negative one
    assert 0 < seen.rank("long") < seen.rank("short")


@needs_data
def test_the_clairvoyant_order_runs_twice_and_keeps_first_come_first_served_far_behind() -> None:
    profile = EngineProfile.load("a100-llama3.1-8b").with_overrides(max_num_seqs=32)
    programs = make_programs("mixed", 40, seed=3)
    runs = {system: sim_summary(simulate_programs(programs, profile=profile, system=system, rate=1.2, seed=3))
            for system in ("vllm-opt", "llmd-fairness", "clairvoyant")}
    means = {system: run["mean_token_latency"] for system, run in runs.items()}
    assert all(run["completed"] == len(programs) for run in runs.values()), means
    # a batch of 32 slots is no single machine, where Smith's order is optimal: a ceiling to measure
    # against, not a bound (an online order can come level with it)
    assert means["clairvoyant"] < 0.5 * means["vllm-opt"] and means["clairvoyant"] < means["llmd-fairness"], means


def test_real_engines_refuse_the_clairvoyant_order() -> None:
    with pytest.raises(ValueError, match="simulator's alone"):
        run_sweep("bfcl", [1.0], programs=1, seed=1, systems=["clairvoyant"])


def _summary(mean: float) -> dict[str, float]:
    return {"mean_token_latency": mean, "p99_token_latency": mean}


def test_a_point_is_overloaded_where_vllm_opt_is_three_times_its_unloaded_latency() -> None:
    results = {("mixed", 32, 1, "0.2", "vllm-opt"): _summary(1.0), ("mixed", 32, 1, "0.8", "vllm-opt"): _summary(3.0),
               ("mixed", 32, 1, "0.4", "vllm-opt"): _summary(2.9)}
    rates = (0.2, 0.4, 0.8)
    assert overloaded(results, rates, ("mixed", 32, 1, 0.8))
    assert not overloaded(results, rates, ("mixed", 32, 1, 0.4))
    assert not overloaded(results, rates, ("mixed", 32, 2, 0.8))  # that seed's vllm-opt never ran


@needs_data
def test_the_check_runs_the_ceiling_at_the_overloaded_points_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import autellix.sim.sweep as sweep

    monkeypatch.setitem(sweep.CHECK_LOADS, 32, {"mixed": Load((0.05, 2.0), 20.0, min_programs=12)})
    report = check("a100-llama3.1-8b", slots=(32,), workloads=("mixed",), seeds=(1,), jobs=1,
                   systems=("vllm-opt", "llmd-fairness", "autellix"), progress=lambda _: None)
    light, heavy = report["slots"]["32"]["mixed"]["points"]
    assert not light["overloaded"] and not {CEILING, DECLARED} & set(light["results"])
    assert heavy["overloaded"] and {CEILING, DECLARED} <= set(heavy["results"]), heavy["results"]["vllm-opt"]
    ceiling = heavy["results"][CEILING]["mean_token_latency"]
    assert heavy["check"]["mean_vs_clairvoyant"] == pytest.approx(
        heavy["results"]["autellix"]["mean_token_latency"] / ceiling)
    assert heavy["check"]["declared_vs_clairvoyant"] == pytest.approx(
        heavy["results"][DECLARED]["mean_token_latency"] / ceiling)
    table = "\n".join(check_table(report))
    assert "autellix's mean over the clairvoyant order's at 1 overloaded points" in table
    assert f"{DECLARED}'s mean over the clairvoyant order's at 1 overloaded points" in table
