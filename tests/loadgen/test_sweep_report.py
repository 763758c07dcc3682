"""The sweep's report arithmetic: sustained rates, ratios, the loaded comparison."""

from __future__ import annotations

import pytest

from autellix.workloads.run_metrics import loaded_comparison, paired_rounds, sustained_rates


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


def test_paired_rounds_compare_systems_within_each_round() -> None:
    # the machine is twice as slow in round 2: every system's latency doubles, the ratios do not
    rounds = [{"client-plas": {"2.0": row(10.0, 40.0)}, "autellix": {"2.0": row(8.0, 20.0)}},
              {"client-plas": {"2.0": row(20.0, 80.0)}, "autellix": {"2.0": row(22.0, 48.0)}}]
    paired = paired_rounds(rounds, [2.0], reference="client-plas")
    assert paired["reference"] == "client-plas" and paired["rounds"] == 2
    ours = paired["by_rate"]["2.0"]["autellix"]
    assert ours["mean_vs_reference"]["rounds"] == pytest.approx([0.8, 1.1])
    assert ours["mean_vs_reference"]["geomean"] == pytest.approx((0.8 * 1.1) ** 0.5)
    assert (ours["mean_vs_reference"]["min"], ours["mean_vs_reference"]["max"]) == pytest.approx((0.8, 1.1))
    assert ours["p99_vs_reference"]["rounds"] == pytest.approx([0.5, 0.6])
    # each system's own spread from run to run: here the machine's, 2x
    assert ours["mean"]["rounds"] == [8.0, 22.0] and ours["mean"]["geomean"] == pytest.approx((8.0 * 22.0) ** 0.5)
    reference = paired["by_rate"]["2.0"]["client-plas"]
    assert reference["mean"]["max"] / reference["mean"]["min"] == pytest.approx(2.0)
    assert "mean_vs_reference" not in reference


def test_the_sweep_offers_the_baselines_of_issue_15() -> None:
    from autellix.loadgen.stack_sweep import SYSTEMS

    assert SYSTEMS["client-plas"].policy is None and SYSTEMS["client-plas"].client_priority
    assert SYSTEMS["client-plas"].engine_scheduler == "vllm-priority"  # stock vLLM, --scheduling-policy priority
    assert SYSTEMS["vllm-priority"].policy == "plas" and SYSTEMS["vllm-priority"].engine_scheduler == "vllm-priority"
    assert SYSTEMS["plas"].policy == "plas" and SYSTEMS["plas"].engine_scheduler == "autellix"


def test_the_loaded_check_merges_only_sweeps_that_ran_the_same_draw() -> None:
    from tests.live import load_experiment

    check = load_experiment("heavy_load_check")

    def sweep(seed: int, rates: list[float], results: dict[str, dict[str, dict[str, float]]]) -> dict:
        return {"workload": "fanout", "seed": seed, "rates": rates, "results": results}

    # vllm at the low rate and X (seed 1: X is draw 2), the others at X alone with seed 2: one draw
    base = sweep(1, [0.2, 0.65], {"vllm": {"0.2": row(2.0), "0.65": row(8.0)}})
    others = sweep(2, [0.65], {"client-plas": {"0.65": row(3.0)}, "autellix": {"0.65": row(2.4)}})
    merged = check.merge([base, others])
    assert merged["draws"] == {"0.2": 1, "0.65": 2} and merged["rates"] == [0.2, 0.65]
    out = check.row(merged)
    assert out["vllm_load"] == pytest.approx(4.0) and out["draw"] == 2
    assert out["autellix/client-plas"] == pytest.approx(0.8) and out["autellix/vllm"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="draws 2 and 1 differ"):  # --seed 1 again: other programs at X
        check.merge([base, sweep(1, [0.65], others["results"])])
