"""The sweep's report arithmetic: sustained rates, ratios, the loaded comparison."""

from __future__ import annotations

import pytest

from autellix.workloads.metrics import loaded_comparison, sustained_rates


def row(mean: float, p99: float | None = None) -> dict[str, float]:
    return {"mean_token_latency": mean, "p99_token_latency": p99 if p99 is not None else 2 * mean}


RATES = [1.0, 2.0, 3.0, 4.0]
RESULTS = {
    "vllm": {"1.0": row(1.0), "2.0": row(2.0), "3.0": row(4.0), "4.0": row(8.0)},
    "vllm-opt": {"1.0": row(1.0), "2.0": row(1.5), "3.0": row(3.0), "4.0": row(6.0, p99=12.0)},
    "autellix": {"1.0": row(1.0), "2.0": row(1.2), "3.0": row(1.5), "4.0": row(2.0, p99=9.0)},
}


def test_sustained_rate_is_interpolated_where_latency_crosses_the_bound() -> None:
    report = sustained_rates(RESULTS, RATES, bound_factor=3.0)  # bound = 3 x 1.0
    assert report["latency_bound"] == 3.0
    assert report["rates"]["autellix"] == 4.0  # never above the bound
    assert report["rates"]["vllm-opt"] == 3.0  # exactly at the bound at 3/s
    assert report["rates"]["vllm"] == pytest.approx(2.5)  # 2 -> 4 crosses 3 halfway
    assert report["ratios"] == {"autellix/vllm": pytest.approx(1.6), "autellix/vllm-opt": pytest.approx(4 / 3)}


def test_loaded_comparison_only_where_the_baseline_is_loaded() -> None:
    rows = loaded_comparison(RESULTS, RATES, load_factor=3.0)
    assert [r["rate"] for r in rows] == [3.0, 4.0]  # vllm at 4x and 8x its unloaded latency
    assert rows[1]["latency_cut_vs_vllm"] == pytest.approx(4.0)
    assert rows[1]["p99_vs_vllm_opt"] == pytest.approx(0.75)


def test_loaded_comparison_sets_autellix_against_every_baseline_that_ran() -> None:
    results = RESULTS | {"client-plas": {"1.0": row(1.0), "2.0": row(1.3), "3.0": row(1.4), "4.0": row(4.0)}}
    rows = loaded_comparison(results, RATES, load_factor=3.0)
    assert rows[0]["mean_vs_client_plas"] == pytest.approx(1.5 / 1.4)
    assert rows[1]["mean_vs_client_plas"] == pytest.approx(0.5)
    assert rows[1]["mean_vs_vllm_opt"] == pytest.approx(2.0 / 6.0)
    assert "mean_vs_plas" not in rows[1]
    # client-plas crosses the bound of 3 between 3/s (1.4) and 4/s (4.0)
    assert sustained_rates(results, RATES)["ratios"]["autellix/client-plas"] == pytest.approx(4.0 / (3 + 1.6 / 2.6))


def test_the_sweep_offers_the_baselines_of_issue_15() -> None:
    from autellix.bench.sweep import SYSTEMS

    assert SYSTEMS["client-plas"].policy is None and SYSTEMS["client-plas"].client_priority
    assert SYSTEMS["client-plas"].engine_scheduler == "vllm-priority"  # stock vLLM, --scheduling-policy priority
    assert SYSTEMS["vllm-priority"].policy == "plas" and SYSTEMS["vllm-priority"].engine_scheduler == "vllm-priority"
    assert SYSTEMS["plas"].policy == "plas" and SYSTEMS["plas"].engine_scheduler == "autellix"
