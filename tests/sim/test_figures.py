"""The paper's toy figures on the unit-step simulator (docs/scheduling.md records the numbers)."""

import json

from typer.testing import CliRunner

from autellix.cli import app
from autellix.core import policy_by_name
from autellix.sim import UNIT_STEP_CONFIG
from autellix.sim.unit import simulate
from autellix.sim.workloads import figure2, figure9

runner = CliRunner()


def run(workload, policy):
    return simulate(workload(), policy_by_name(policy), UNIT_STEP_CONFIG, batch_size=2)


def test_figure2_fcfs_matches_the_paper_gantt_chart():
    result = run(figure2, "fcfs")
    assert result.total_wait == 18 and result.makespan == 14  # as in the paper's Figure 2(b)
    starts = {cid: rec.runs[0][0] for cid, rec in result.calls.items()}
    assert starts == {"A1": 0, "B1": 0, "C1": 3, "D1": 4, "B2": 4, "A2": 7, "C2": 8, "B3": 10, "A3": 10, "A4": 11}


def test_figure2_plas_waits_less_than_fcfs_and_mlfq():
    waits = {p: run(figure2, p).total_wait for p in ("fcfs", "mlfq", "plas")}
    assert waits["plas"] < waits["fcfs"] and waits["plas"] < waits["mlfq"]


def test_figure2_short_programs_finish_first_under_plas():
    plas, fcfs = run(figure2, "plas"), run(figure2, "fcfs")
    assert plas.programs["C"].finish < fcfs.programs["C"].finish
    assert plas.programs["D"].finish <= fcfs.programs["D"].finish


def test_figure9_atlas_reaches_the_best_makespan():
    atlas = run(figure9, "atlas")
    assert atlas.makespan == 11  # the critical path 2 + 4 + 4 + 1: no schedule can do better
    assert run(figure9, "mlfq").makespan > 11  # demotion splits the critical path


def test_cli_json_has_every_policy_and_metric():
    out = runner.invoke(app, ["sim", "--workload", "figure2", "--batch-size", "2",
                              "--policies", "fcfs,mlfq,plas,atlas", "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert list(data) == ["fcfs", "mlfq", "plas", "atlas"]
    for row in data.values():
        assert {"total_wait", "makespan", "mean_token_latency", "p95_token_latency", "p99_token_latency"} <= set(row)
    assert data["fcfs"]["total_wait"] == 18 and data["plas"]["total_wait"] < 18


def test_cli_random_workload_table_and_errors():
    out = runner.invoke(app, ["sim", "--workload", "random", "--programs", "10", "--rate", "0.5", "--seed", "3"])
    assert out.exit_code == 0 and "atlas" in out.output
    bad = runner.invoke(app, ["sim", "--policies", "sjf"])
    assert bad.exit_code == 2 and "unknown policy 'sjf'" in bad.output
    bad = runner.invoke(app, ["sim", "--quanta", "1,2"])
    assert bad.exit_code == 2 and "quanta" in bad.output
