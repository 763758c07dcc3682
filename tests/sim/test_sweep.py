"""``autellix sim sweep`` and ``sim fidelity`` on tiny loads: reports, plots and ratios are well formed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autellix.cli import app
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.fidelity import compare, compare_file
from autellix.sim.sweep import Load, figure12, figure14, write_report
from autellix.workloads.data import workloads_available

pytestmark = pytest.mark.skipif(not workloads_available(), reason="workload data not found")
A100 = EngineProfile.load("a100-llama3.1-8b")


def test_figure12_and_14_reports_and_plots(tmp_path: Path) -> None:
    fig12 = figure12(A100, workloads=["bfcl"], systems=["vllm", "autellix"],
                     loads={"bfcl": Load((0.5, 2.0), 10.0, min_programs=6)}, progress=lambda _: None)
    bfcl = fig12["bfcl"]
    assert set(bfcl["results"]) == {"vllm", "autellix"}
    low, high = (bfcl["results"]["vllm"][r]["mean_token_latency"] for r in ("0.5", "2.0"))
    assert high > low  # load raises latency
    assert "autellix/vllm" in bfcl["sustained"]["ratios"]
    fig14 = figure14(A100, workloads=["sharegpt"], engine_counts=[1, 2], balancers=["round_robin", "autellix"],
                     loads={"sharegpt": Load((0.5, 1.0), 8.0, min_programs=4)}, progress=lambda _: None)
    scaling = fig14["sharegpt"]["scaling"]
    assert set(scaling) == {"round_robin", "autellix"} and set(scaling["autellix"]) == {"1", "2"}
    paths = write_report({"profile": A100.name, "figure12": fig12, "figure14": fig14}, tmp_path)
    assert {p.name for p in paths} == {"sim-sweep.json", "sim-figure12.png", "sim-figure14.png"}
    assert json.loads((tmp_path / "sim-sweep.json").read_text())["figure12"]["bfcl"]["rates"] == [0.5, 2.0]


def test_fidelity_replays_a_bench_report_with_its_seeds(tmp_path: Path) -> None:
    report = {"workload": "bfcl", "calibration": "paper", "rates": [0.5], "seed": 1, "programs": {"0.5": 5},
              "results": {"vllm-opt": {"0.5": {"mean_token_latency": 0.01, "p99_token_latency": 0.02}}}}
    rows = compare(report, EngineProfile.load("cpu-tiny"))
    assert len(rows) == 1 and rows[0]["system"] == "vllm-opt" and rows[0]["programs"] == 5
    assert rows[0]["error"] == pytest.approx(rows[0]["simulated"]["mean_token_latency"] / 0.01 - 1)
    assert rows == compare(report, EngineProfile.load("cpu-tiny"))  # deterministic
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="not an"):
        compare_file(bad, A100)
    report["results"] = {"sglang": report["results"]["vllm-opt"]}
    with pytest.raises(ValueError, match="sglang"):
        compare(report, A100)


def test_fidelity_replays_with_the_reports_engine_slots_and_scheduler() -> None:
    report = {"workload": "mixed", "calibration": "paper", "rates": [2.0], "seed": 3, "programs": {"2.0": 6},
              "results": {"autellix": {"2.0": {"mean_token_latency": 0.01, "p99_token_latency": 0.02}}}}
    profile = EngineProfile.load("cpu-tiny")  # 4 slots
    four = compare(report, profile)[0]["simulated"]
    eight = compare(report | {"engine": {"max_num_seqs": 8}}, profile)[0]["simulated"]
    assert eight["mean_token_latency"] < four["mean_token_latency"]  # twice the slots under a burst
    with pytest.raises(ValueError, match="unknown scheduler parameter"):
        compare(report | {"scheduler": {"betta": 8}}, profile)


def test_sweep_cli_refuses_bad_arguments() -> None:
    runner = CliRunner()
    out = runner.invoke(app, ["sim", "sweep", "--figures", "13"])
    assert out.exit_code == 2 and "figures" in out.output
    out = runner.invoke(app, ["sim", "sweep", "--workloads", "chess"])
    assert out.exit_code == 2 and "chess" in out.output
    out = runner.invoke(app, ["sim", "fidelity", "--measured", "/nonexistent.json"])
    assert out.exit_code == 2 and "cannot read" in out.output
    out = runner.invoke(app, ["sim", "sweep", "--figures", "check", "--slots", "64"])
    assert out.exit_code == 2 and "slots" in out.output
    out = runner.invoke(app, ["sim", "sweep", "--figures", "check", "--workloads", "chess"])
    assert out.exit_code == 2 and "chess" in out.output


def _summary(mean: float, p99: float) -> dict[str, float]:
    return {"mean_token_latency": mean, "p99_token_latency": p99}


def test_check_point_holds_autellix_to_the_best_baseline_on_the_mean_and_on_the_p99() -> None:
    from autellix.sim.sweep import check_point

    point = {"vllm-opt": _summary(10.0, 40.0), "plas": _summary(8.0, 30.0), "client-plas": _summary(7.0, 50.0),
             "llmd-fairness": _summary(9.0, 29.0), "autellix": _summary(7.3, 30.0)}
    result = check_point(point)
    assert result["best_mean_rival"] == "client-plas" and result["mean_vs_best"] == pytest.approx(7.3 / 7.0)
    assert result["best_p99_rival"] == "llmd-fairness" and result["p99_vs_best"] == pytest.approx(30 / 29)
    assert result["passed"] and result["mean_vs_llmd_fairness"] == pytest.approx(7.3 / 9.0)
    assert not check_point(point | {"autellix": _summary(7.4, 30.0)})["mean_ok"]  # 1.057x the best mean
    assert not check_point(point | {"autellix": _summary(7.0, 30.5)})["p99_ok"]  # 1.052x the best P99
    # another system can be held to the same baselines
    assert check_point(point | {"mine": _summary(7.0, 29.0)}, ours="mine")["passed"]


def test_check_runs_every_point_and_tables_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import autellix.sim.sweep as sweep

    monkeypatch.setitem(sweep.CHECK_LOADS, 32, {"bfcl": Load((1.0,), 4.0, min_programs=3)})
    report = sweep.check("a100-llama3.1-8b", slots=(32,), workloads=("bfcl",), seeds=(1, 2), jobs=1,
                         progress=lambda _: None)
    points = report["slots"]["32"]["bfcl"]["points"]
    assert [(p["seed"], p["rate"]) for p in points] == [(1, 1.0), (2, 1.0)]
    assert set(points[0]["results"]) == set(sweep.CHECK_SYSTEMS) and "passed" in points[0]["check"]
    table = sweep.check_table(report)
    assert len(table) == 3 and table[2].startswith("| 32 | bfcl | 1.0 |")
    assert sweep.plot_check(report, tmp_path).stat().st_size > 0
