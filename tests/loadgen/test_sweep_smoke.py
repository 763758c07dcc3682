"""A small sweep on real engines: the benchmark's whole path, end to end."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from autellix.loadgen.stack_sweep import ENGINE_SETTINGS, SYSTEMS, engine_args, rotated, run_sweep, write_report
from autellix.workloads.data import ENV_VAR, workloads_available
from tests.live import TEST_ENGINE_ARGS, load_experiment

pytest.importorskip("matplotlib")


def test_each_system_gets_the_workloads_scheduler_settings_with_its_own_policy() -> None:
    heavy = ENGINE_SETTINGS["mixed"]
    assert heavy.scheduler is not None
    autellix, mlfq, bare = (heavy.config_for(SYSTEMS[n]) for n in ("autellix", "mlfq", "vllm"))
    assert (autellix.policy, mlfq.policy, bare.policy) == ("atlas", "mlfq", "fcfs")
    assert autellix.boundaries == mlfq.boundaries == heavy.scheduler.boundaries
    assert autellix.beta == heavy.scheduler.beta
    # what the engine plugin and the gateway read from their environment
    env = autellix.to_env()
    assert env["AUTELLIX_POLICY"] == "atlas"
    assert env["AUTELLIX_BOUNDARIES"] == ",".join(map(str, heavy.scheduler.boundaries))
    # workloads without their own settings keep the defaults
    light = ENGINE_SETTINGS["bfcl"]
    assert light.scheduler is None and light.config_for(SYSTEMS["autellix"]).beta == 4.0


def test_only_the_bare_baseline_runs_without_prefix_caching() -> None:
    settings = ENGINE_SETTINGS["mixed"]
    for name, system in SYSTEMS.items():
        args = engine_args(system, settings)
        assert args[: len(settings.args)] == list(settings.args)
        assert ("--no-enable-prefix-caching" in args) == (name == "vllm"), name


@pytest.mark.skipif(not workloads_available(), reason=f"no workload data (set {ENV_VAR})")
def test_rounds_on_a_kept_stack_run_programs_through_the_gateway(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole path of the system with the most parts (an engine with the
    plugin, a gateway, cores split, the report and plots), in two rounds on one
    kept stack. One system: each stack costs most of a minute on CI's 2 cores,
    and the bare engine's path (no sessions) is run by
    tests/loadgen/test_runner_on_engine.py."""
    # the workload's own settings, with the test engines' flags (eager: torch.compile costs each start ~12 s)
    mixed = ENGINE_SETTINGS["mixed"]
    monkeypatch.setitem(ENGINE_SETTINGS, "mixed", replace(mixed, args=(*mixed.args, *TEST_ENGINE_ARGS)))
    cores = os.sched_getaffinity(0)
    report = run_sweep("mixed", [2.0], programs=3, seed=3, systems=["autellix"], isolate_cores=True, rounds=2,
                       keep_stacks=True, trace_steps=True, log_dir=tmp_path / "logs", progress=lambda _: None)
    rows = [round_["autellix"]["2.0"] for round_ in report["rounds"]]
    for row in rows:
        assert row["completed"] == 3 and row["failed"] == 0, row["errors"]
        assert row["calls"] > 20 and row["mean_token_latency"] > 0
        assert row["max_parallel_calls"] >= 5  # one of the three is a LATS program
        assert row["prefix_cache_hit_rate"] > 0.2  # Autellix runs with prefix caching on
        programs = row["per_program"]  # each program's own figures: they make up the run's
        assert len(programs) == 3 and sum(p["calls"] for p in programs) == row["calls"]
        assert sum(p["token_latency"] for p in programs) / 3 == pytest.approx(row["mean_token_latency"])
        # the plugin traced its steps, and each run's steps are its own (the kept engine's one trace, cut by time)
        steps = row["engine_steps"]
        assert steps["new_requests"] >= row["calls"] and steps["decode_seq_steps"] > 0
        assert 0 < steps["model_seconds"] < steps["busy_seconds"] < row["programs"] / row["programs_per_s"]
        # where the CPU went during the run: every part of the stack, and this client, used some
        cpu = row["cpu_seconds"]
        assert {"client", "gateway", "api_server", "engine_core", "worker"} <= set(cpu)
        assert all(cpu[role] > 0 for role in ("client", "gateway", "api_server", "engine_core", "worker")), cpu
        assert cpu["worker"] >= steps["model_seconds"] * 0.5  # the model's steps ran in the worker
    # the same programs again on the kept engine: as many prefix-cache hits as the first time, because each
    # run starts on an emptied cache (kept, it would have held the whole first round's prompts)
    assert rows[1]["prefix_cache_hit_rate"] == pytest.approx(rows[0]["prefix_cache_hit_rate"], abs=0.02)
    # the same programs twice: the same prompt tokens to compute or serve from the cache
    totals = [r["engine_steps"]["prefill_tokens"] + r["engine_steps"]["cached_tokens"] for r in rows]
    assert totals[1] == pytest.approx(totals[0], rel=0.3)  # not both rounds: that would be 2x
    assert report["kept_stacks"] and report["paired"]["rounds"] == 2
    assert set(report["sustained"]["rates"]) == {"autellix"}
    if len(cores) > 1:  # the model worker kept its cores; everything else ran on the others
        split = report["cores"]["autellix"]
        assert split["engine"] and split["others"] and set(split["engine"]) | set(split["others"]) == cores
        assert not set(split["engine"]) & set(split["others"])
    assert os.sched_getaffinity(0) == cores  # given back: the next engine binds its worker afresh
    # experiments/engine_steps_vs_profile.py reads the traces back: the profile's cost of each run's steps
    # and the simulator's run
    step_trace = load_experiment("engine_steps_vs_profile")
    analysis = step_trace.analyse(report, ENGINE_SETTINGS["mixed"].sim_profile(), refit=True)
    for run, row in zip(analysis["runs"], rows, strict=True):
        assert run["cost"]["measured_s"] == pytest.approx(row["engine_steps"]["busy_seconds"])
        assert run["cost"]["profile_s"] > 0 and run["simulated"]["steps"] > 0
        assert sum(k["steps"] for k in run["cost"]["by_kind"].values()) == row["engine_steps"]["steps"]
    assert analysis["fits"]["autellix"]["samples"] >= sum(r["engine_steps"]["steps"] for r in rows) / 32
    # the profile fitted to these steps runs the same programs in the simulator
    assert analysis["refitted"]["autellix @ 2.0 seed 3"]["mean_token_latency"] > 0
    paths = write_report(report, tmp_path / "out")
    assert [p.suffix for p in paths] == [".json", ".png", ".png"]
    written = json.loads(paths[0].read_text())
    assert written["workload"] == "mixed"
    assert written["scheduler"]["beta"] == ENGINE_SETTINGS["mixed"].config_for(SYSTEMS["autellix"]).beta


def test_kept_stacks_take_turns_in_an_order_rotated_every_round() -> None:
    systems = ["vllm", "client-plas", "autellix"]
    assert [rotated(systems, n) for n in range(4)] == [
        ["vllm", "client-plas", "autellix"], ["client-plas", "autellix", "vllm"],
        ["autellix", "vllm", "client-plas"], ["vllm", "client-plas", "autellix"]]
