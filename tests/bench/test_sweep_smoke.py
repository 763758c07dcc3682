"""A small sweep on real engines: the benchmark's whole path, end to end."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from autellix.bench.sweep import ENGINE_SETTINGS, SYSTEMS, engine_args, rotated, run_sweep, write_report
from autellix.workloads.data import ENV_VAR, workloads_available
from tests.live import TEST_ENGINE_ARGS

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
    tests/bench/test_runner_on_engine.py."""
    # the workload's own settings, with the test engines' flags (eager: torch.compile costs each start ~12 s)
    mixed = ENGINE_SETTINGS["mixed"]
    monkeypatch.setitem(ENGINE_SETTINGS, "mixed", replace(mixed, args=(*mixed.args, *TEST_ENGINE_ARGS)))
    cores = os.sched_getaffinity(0)
    report = run_sweep("mixed", [2.0], programs=3, seed=3, systems=["autellix"], isolate_cores=True, rounds=2,
                       keep_stacks=True, log_dir=tmp_path / "logs", progress=lambda _: None)
    rows = [round_["autellix"]["2.0"] for round_ in report["rounds"]]
    for row in rows:
        assert row["completed"] == 3 and row["failed"] == 0, row["errors"]
        assert row["calls"] > 20 and row["mean_token_latency"] > 0
        assert row["max_parallel_calls"] >= 5  # one of the three is a LATS program
        assert row["prefix_cache_hit_rate"] > 0.2  # Autellix runs with prefix caching on
    # the same programs again on the kept engine: as many prefix-cache hits as the first time, because each
    # run starts on an emptied cache (kept, it would have held the whole first round's prompts)
    assert rows[1]["prefix_cache_hit_rate"] == pytest.approx(rows[0]["prefix_cache_hit_rate"], abs=0.02)
    assert report["kept_stacks"] and report["paired"]["rounds"] == 2
    assert set(report["sustained"]["rates"]) == {"autellix"}
    if len(cores) > 1:  # the model worker kept its cores; everything else ran on the others
        split = report["cores"]["autellix"]
        assert split["engine"] and split["others"] and set(split["engine"]) | set(split["others"]) == cores
        assert not set(split["engine"]) & set(split["others"])
    assert os.sched_getaffinity(0) == cores  # given back: the next engine binds its worker afresh
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
