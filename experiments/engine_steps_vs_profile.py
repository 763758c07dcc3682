"""The engine's own steps under a benchmark's load, against the simulator's.

    .venv/bin/autellix bench sweep --workload mixed --rates 0.5 --programs 26 --systems vllm,client-plas,autellix \\
        --seed 4 --isolate-cores --keep-stacks --trace-steps --out runs/mixed-traced
    .venv/bin/python experiments/engine_steps_vs_profile.py runs/mixed-traced/mixed.json [--profile NAME] [--out FILE]

For every run of a sweep report made with ``--trace-steps``
(``autellix.engine.step_trace``):

1. the profile's cost of the very steps the engine ran, against their measured
   time: in total, for pure decode steps by batch size, and for steps with
   prefill by its size. This says whether the step cost model holds under load.
   The measured time over the profile's is the run's own slowness: set side
   by side within a round it says whether one system's engine ran slower for
   the same work (the machine, or what its stack runs beside the engine);
2. the simulator's run of the same programs, arrivals and settings on the
   profile, step totals against the engine's: how many steps, how long, how
   much prefill and decode work, how many admissions. This says whether the
   simulated engine does the same work;
3. the step cost fitted to the engine's own steps (``autellix.sim.profiling.
   profile_from_steps``: runs of 32 steps summed into one sample), each
   system's and all of them together; with ``--fit-out`` that profile is
   written, and every run is simulated again on it, its program token latency
   set beside the engine's.

The simulator put `mixed` at 0.5/s at about twice the engine's load
(docs/results/2026-12-03-3x-point-kept-reference.md); this finds which of the two is off.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from autellix.core import SchedulerConfig
from autellix.engine.step_trace import read_trace, step_cycles, summarize_steps
from autellix.loadgen.stack_sweep import ENGINE_SETTINGS
from autellix.sim.cost_model import fit_step_cost
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.profiling import profile_from_steps, samples_from_steps
from autellix.sim.serving import sim_summary, simulate_programs
from autellix.workloads import make_programs

#: Prefill sizes the steps with prefill are grouped by (upper bounds, tokens).
PREFILL_BINS = (64, 256, 1024, 2048, 1 << 30)
TOTALS = ("steps", "busy_seconds", "prefill_tokens", "decode_seq_steps", "new_requests")


def predicted(profile: EngineProfile, step: dict[str, float]) -> float:
    return profile.step_seconds(int(step["prefill_tokens"]), int(step["decode_seqs"]), int(step["kv_tokens"]),
                                int(step["new_requests"]))


def kind_of(step: dict[str, float]) -> str:
    if not step["prefill_tokens"]:
        return f"decode x{int(step['decode_seqs'])}"
    bound = next(b for b in PREFILL_BINS if step["prefill_tokens"] <= b)
    return f"prefill <= {bound}" if bound < PREFILL_BINS[-1] else f"prefill > {PREFILL_BINS[-2]}"


def cost_check(steps: list[dict[str, float]], profile: EngineProfile) -> dict[str, Any]:
    """Measured against the profile's cost of the same steps: in total and by kind of step."""
    cycles = step_cycles(steps)
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for step, cycle in zip(steps, cycles, strict=True):
        groups[kind_of(step)].append((cycle, predicted(profile, step)))
    by_kind = {kind: {"steps": len(rows), "measured_ms": 1e3 * sum(m for m, _ in rows) / len(rows),
                      "profile_ms": 1e3 * sum(p for _, p in rows) / len(rows),
                      "share_of_time": sum(m for m, _ in rows) / sum(cycles)}
               for kind, rows in sorted(groups.items())}
    cost = sum(predicted(profile, s) for s in steps)
    # the run's own speed: how much longer than the profile its steps took; runs
    # of one round differ in it by what the machine (or the stack beside the engine) did
    return {"measured_s": sum(cycles), "profile_s": cost, "slowness": sum(cycles) / cost if cost else 0.0,
            "by_kind": by_kind}


def simulated(report: dict[str, Any], system: str, rate: float, index: int, profile: EngineProfile, *,
              seed: int) -> dict[str, float]:
    """The simulator's engine totals and program token latency, for the same
    programs and arrivals as the run (of a round that ran ``seed``)."""
    workload = report["workload"]
    settings = ENGINE_SETTINGS[workload]
    seed += index
    count = report["programs"][str(rate)]
    programs = make_programs(workload, count, seed=seed, calibration=report.get("calibration", "paper"))
    run = simulate_programs(programs, profile=profile, system=system, rate=rate, seed=seed,
                            config=settings.scheduler or SchedulerConfig())
    (stats,) = run.engines.values()
    summary = sim_summary(run)
    return {key: stats[key] for key in TOTALS} | {
        "prefix_hits_tokens": stats["prefix_hits_tokens"], "preemptions": stats["preemptions"],
        "mean_token_latency": summary["mean_token_latency"], "p99_token_latency": summary["p99_token_latency"]}


def analyse(report: dict[str, Any], profile: EngineProfile, *, refit: bool = False) -> dict[str, Any]:
    """``refit``: also fit a profile to all the runs' steps and simulate every run again on it."""
    if not report.get("trace_steps"):
        raise SystemExit("the report has no step traces: run the sweep with --trace-steps")
    rounds = report.get("rounds") or [report["results"]]
    out: dict[str, Any] = {"workload": report["workload"], "profile": profile.name, "runs": [], "fits": {}}
    traces: dict[str, list[list[dict[str, float]]]] = defaultdict(list)
    sims: dict[tuple[str, float, int], dict[str, float]] = {}
    seeds = report.get("round_seeds") or [report["seed"]] * len(rounds)
    for number, (results, seed) in enumerate(zip(rounds, seeds, strict=True), start=1):
        for system, by_rate in results.items():
            for index, rate in enumerate(report["rates"]):
                row = by_rate[str(rate)]
                meta = row["engine_steps"]
                steps = read_trace(Path(meta["trace"]), *meta["window"])
                if (system, rate, seed) not in sims:
                    sims[(system, rate, seed)] = simulated(report, system, rate, index, profile, seed=seed)
                traces[system].append(steps)
                out["runs"].append({"round": number, "seed": seed, "system": system, "rate": rate,
                                    "mean_token_latency": row["mean_token_latency"],
                                    "engine": summarize_steps(steps), "simulated": sims[(system, rate, seed)],
                                    "cost": cost_check(steps, profile)})
    for system, runs in traces.items():
        fit = fit_step_cost([s for steps in runs for s in samples_from_steps(steps)])
        out["fits"][system] = {"cost": fit.cost.to_dict(), **fit.quality()}
    if refit:
        fitted, fit = profile_from_steps([steps for runs in traces.values() for steps in runs],
                                         profile.with_overrides(name=f"{profile.name}-from-steps", provenance={}))
        out["fitted_profile"] = fitted.to_dict() | {
            "description": f"{profile.name}'s capacity and call overhead; the step cost fitted to the engine's own "
                           f"steps in a {report['workload']} sweep at {report['rates']}/s "
                           "(experiments/engine_steps_vs_profile.py)",
            "fit": fit.quality() | {"method": "non-negative least squares of relative errors over sums of 32 "
                                              "consecutive engine steps (autellix.sim.profiling.profile_from_steps)"}}
        out["refitted"] = {f"{system} @ {rate} seed {seed}": simulated(report, system, rate, index, fitted, seed=seed)
                           for system in traces for index, rate in enumerate(report["rates"])
                           for seed in sorted(set(seeds))}
    return out


def print_analysis(analysis: dict[str, Any]) -> None:
    print(f"{analysis['workload']}, profile {analysis['profile']}")
    for run in analysis["runs"]:
        engine, sim, cost = run["engine"], run["simulated"], run["cost"]
        print(f"\nround {run['round']} {run['system']} @ {run['rate']}/s: "
              f"{1e3 * run['mean_token_latency']:.2f} ms/token")
        print("  engine / simulated: " + ", ".join(f"{k} {engine[k]:.0f} / {sim[k]:.0f}" if k != "busy_seconds" else
                                                 f"busy {engine[k]:.1f} / {sim[k]:.1f} s" for k in TOTALS))
        print(f"  the engine's steps at the profile's cost: {cost['profile_s']:.1f} s, "
              f"measured {cost['measured_s']:.1f} s ({cost['slowness']:.2f}x)")
        for kind, row in cost["by_kind"].items():
            if row["share_of_time"] >= 0.02:
                print(f"    {kind:16} {row['steps']:6} steps  {row['measured_ms']:6.2f} ms measured  "
                      f"{row['profile_ms']:6.2f} ms profile  {100 * row['share_of_time']:4.0f}% of the time")
    fits = dict(analysis["fits"])
    if "fitted_profile" in analysis:
        fits["all systems"] = analysis["fitted_profile"] | analysis["fitted_profile"]["fit"]
    for system, fit in fits.items():
        cost = fit["cost"]
        print(f"\nfitted to {system}'s steps (R^2 {fit['r2']:.2f}, {fit['samples']} samples): overhead "
              f"{1e3 * cost['overhead']:.2f} ms, prefill {1e6 * cost['per_prefill_token']:.1f} us/token, decode "
              f"{1e6 * cost['per_decode_seq']:.0f} us/seq, kv {1e9 * cost['per_kv_token']:.0f} ns/token, admission "
              f"{1e3 * cost['per_new_request']:.2f} ms")
    measured: dict[str, list[float]] = defaultdict(list)
    for run in analysis["runs"]:
        measured[f"{run['system']} @ {run['rate']} seed {run['seed']}"].append(run["mean_token_latency"])
    for key, sim in analysis.get("refitted", {}).items():
        engine = ", ".join(f"{1e3 * v:.2f}" for v in measured[key])
        print(f"{key}: engine {engine} ms/token; simulated on the steps' profile {1e3 * sim['mean_token_latency']:.2f}"
              f" (P99 {1e3 * sim['p99_token_latency']:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("report", type=Path, help="a sweep report made with --trace-steps")
    parser.add_argument("--profile", default=None,
                        help="a bundled profile's name or a profile JSON (default: the workload's engine settings')")
    parser.add_argument("--out", type=Path, default=None, help="write the analysis as JSON")
    parser.add_argument("--fit-out", type=Path, default=None,
                        help="write the profile fitted to the runs' steps, and simulate every run again on it")
    args = parser.parse_args()
    report = json.loads(args.report.read_text())
    profile = ENGINE_SETTINGS[report["workload"]].sim_profile(args.profile)
    analysis = analyse(report, profile, refit=args.fit_out is not None)
    print_analysis(analysis)
    if args.out is not None:
        args.out.write_text(json.dumps(analysis, indent=2))
    if args.fit_out is not None:
        args.fit_out.write_text(json.dumps(analysis["fitted_profile"], indent=2) + "\n")


if __name__ == "__main__":
    main()
