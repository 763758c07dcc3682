"""A small sweep on real engines: the benchmark's whole path, end to end."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from autellix.bench.sweep import ENGINE_SETTINGS, SYSTEMS, run_sweep, write_report
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


@pytest.mark.skipif(not workloads_available(), reason=f"no workload data (set {ENV_VAR})")
def test_a_two_rate_sweep_runs_programs_on_both_systems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the workload's own settings, with the test engines' flags (eager: torch.compile costs each start ~12 s)
    mixed = ENGINE_SETTINGS["mixed"]
    monkeypatch.setitem(ENGINE_SETTINGS, "mixed", replace(mixed, args=(*mixed.args, *TEST_ENGINE_ARGS)))
    cores = os.sched_getaffinity(0)
    report = run_sweep("mixed", [0.5, 2.0], programs=3, seed=3, systems=["vllm", "autellix"], isolate_cores=True,
                       log_dir=tmp_path / "logs", progress=lambda _: None)
    for system in ("vllm", "autellix"):
        for rate in ("0.5", "2.0"):
            row = report["results"][system][rate]
            assert row["completed"] == 3 and row["failed"] == 0, row["errors"]
            assert row["calls"] > 20 and row["mean_token_latency"] > 0
            assert row["max_parallel_calls"] >= 5  # one of the three is a LATS program
    # the baseline runs with prefix caching off, Autellix with it on
    assert not report["results"]["vllm"]["2.0"]["prefix_cache_hit_rate"]
    assert report["results"]["autellix"]["2.0"]["prefix_cache_hit_rate"] > 0.2
    assert set(report["sustained"]["rates"]) == {"vllm", "autellix"}
    if len(cores) > 1:  # the model worker kept its cores; everything else ran on the others
        for split in report["cores"].values():
            assert split["engine"] and split["others"] and set(split["engine"]) | set(split["others"]) == cores
            assert not set(split["engine"]) & set(split["others"])
    assert os.sched_getaffinity(0) == cores  # given back: the next engine binds its worker afresh
    paths = write_report(report, tmp_path / "out")
    assert [p.suffix for p in paths] == [".json", ".png", ".png"]
    written = json.loads(paths[0].read_text())
    assert written["workload"] == "mixed"
    assert written["scheduler"]["beta"] == ENGINE_SETTINGS["mixed"].config_for(SYSTEMS["autellix"]).beta
