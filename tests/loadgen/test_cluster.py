"""The multi-engine benchmark: emulated engines behind the real gateway."""

from __future__ import annotations

from pathlib import Path

import pytest

from autellix.loadgen.cluster import ClusterSettings, latency_ratios, run_balancers, run_scaling
from autellix.workloads.data import ENV_VAR, workloads_available
from autellix.workloads.run_metrics import highest_rate_under

needs_data = pytest.mark.skipif(not workloads_available(), reason=f"no workload data (set {ENV_VAR})")
#: Fast and small: few programs, engines four times faster than the profile.
SMALL = ClusterSettings(profile="cpu-tiny", time_scale=0.5, max_num_seqs=4, arrival_seconds=1.0, min_programs=3)


def row(mean: float) -> dict[str, float]:
    return {"mean_token_latency": mean}


def test_highest_rate_under_interpolates_and_stops_at_the_first_crossing() -> None:
    rates = [1.0, 2.0, 3.0]
    assert highest_rate_under({"1.0": row(1), "2.0": row(2), "3.0": row(4)}, rates, 3.0) == pytest.approx(2.5)
    assert highest_rate_under({"1.0": row(1), "2.0": row(2), "3.0": row(2.5)}, rates, 3.0) == 3.0
    assert highest_rate_under({"1.0": row(5), "2.0": row(1), "3.0": row(1)}, rates, 3.0) == 0.0
    # a dip back under the bound after a crossing does not count
    assert highest_rate_under({"1.0": row(1), "2.0": row(5), "3.0": row(1)}, rates, 3.0) == pytest.approx(1.5)


def test_latency_ratios_against_the_baseline() -> None:
    results = {"round_robin": {"1.0": row(2.0)}, "autellix": {"1.0": row(1.0)}, "least_used": {"1.0": row(4.0)}}
    assert latency_ratios(results, [1.0], baseline="round_robin") == {
        "autellix": {"1.0": 2.0}, "least_used": {"1.0": 0.5}}


@needs_data
def test_balancers_study_runs_programs_through_the_gateway_on_emulated_engines(tmp_path: Path) -> None:
    report = run_balancers("sharegpt", engines=2, rates=[1.0, 4.0], balancers=["round_robin", "autellix"],
                           settings=SMALL, seed=2, log_dir=tmp_path, progress=lambda _: None)
    for balancer in ("round_robin", "autellix"):
        for rate in ("1.0", "4.0"):
            summary = report["results"][balancer][rate]
            assert summary["failed"] == 0 and summary["completed"] == summary["programs"], summary["errors"]
            assert summary["calls"] >= summary["programs"] and summary["mean_token_latency"] > 0
            assert summary["prefix_cache_hit_rate"] is not None  # read from both engines' /metrics
    assert set(report["sustained"]["rates"]) == {"round_robin", "autellix"}
    assert "autellix/round_robin" in report["sustained"]["ratios"]


@needs_data
def test_scaling_study_gives_each_count_its_own_rates(tmp_path: Path) -> None:
    report = run_scaling("sharegpt", engine_counts=(1, 2), rates_per_engine=(0.5, 2.0), settings=SMALL, seed=2,
                         log_dir=tmp_path, progress=lambda _: None)
    assert set(report["results"]) == {"1", "2"}
    one, two = report["results"]["1"], report["results"]["2"]
    assert len(one) == len(two) == 2
    assert max(map(float, two)) == pytest.approx(2 * max(map(float, one)))  # rates scale with the count
    assert report["latency_bound"] > 0 and set(report["speedup"]) == {"1", "2"}
