"""What declared sizes are worth to autellix, how exact they must be, and what lying about them gains, in the simulator.

    nice -n 5 .venv/bin/python experiments/declared_sizes.py [--points mixed:32:1.2,tool-pause:32:3.0] \
        [--seeds 1,2,3] [--errors 0,0.5,1] [--jobs 2] [--boundaries 0.5,1,2,4,8,16,32,64,128,256]
    nice -n 5 .venv/bin/python experiments/declared_sizes.py --points overloaded [--check REPORT] --no-liars \
        [--errors 0,0.25,0.5] [--out FILE.json]
    nice -n 5 .venv/bin/python experiments/declared_sizes.py --cpu-tail [--seeds 1,2,3]

At overloaded points of the check (A100 profile; the check's programs and arrivals) it runs, per seed:

* ``autellix``: no program declares;
* ``declared-S`` for each sigma S of ``--errors``: every program declares the tokens it will generate in all
  (``autellix.control.size_hints``: what ``POST /v1/sessions``' ``expected_tokens`` says), off by a fixed
  log-normal factor e^N(0, S) per program; what each generates is learnt by a first run, as the clairvoyant
  order learns it (``autellix.sim.clairvoyant``);
* ``clairvoyant``: the ceiling;
* the liars: the tenth of the programs that generate the most (they have the most to gain by passing for
  small ones) say nothing, then a fiftieth of their size, every other program declaring exactly. Their mean
  program token latency lying over saying nothing: at least 1 means lying gained nothing.

``--cpu-tail`` runs instead the real CPU engine's ``tool-pause`` point in the simulator (``cpu-tiny``, 4 slots,
60 programs at 4/s), where autellix's P99 trails client-plas's on the engine, as ``client-plas``, ``autellix``
and ``autellix-declared`` (sigma 0.5): each one's mean and P99 over client-plas's per seed.

``--points overloaded`` runs every overloaded point of a check report (``--check``; each point with the seeds
at which it is overloaded there), and the last lines count, per error, the runs within the ceiling's factor
(``autellix.sim.sweep.CEILING_FACTOR``) and the worst. ``--no-liars`` skips the liars' two runs a point.

``--boundaries`` runs autellix with other queue boundaries (unbounded quanta) than the default's: how
finely the queues must tell sizes apart. Prints each system's mean program token latency over the
clairvoyant order's per point and seed, and the liars' ratio. Every run is deterministic (virtual time).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import tool_pause_tail  # this folder's run of the CPU engine's tool-pause point in the simulator

from autellix.core import SchedulerConfig
from autellix.sim.clairvoyant import LEARNING_SYSTEM, Clairvoyance
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import sim_summary, simulate_programs
from autellix.sim.sweep import CEILING_FACTOR, CHECK_LOADS
from autellix.workloads import make_programs
from autellix.workloads.base import declarations

PROFILE = "a100-llama3.1-8b"
DEFAULT_POINTS = ("bfcl:32:6.0,sharegpt:32:3.0,tool-pause:32:3.0,lats:32:0.6,mixed:32:1.2,mixed:32:0.8,"
                  "tool-pause:256:6.0")
#: The check report whose overloaded points ``--points overloaded`` runs.
CHECK_REPORT = "docs/img/declared-check/sim-check.json"
#: The share of programs, the largest, that lie, and the fraction of their size they claim.
LIARS_SHARE, LIE = 0.1, 50


Task = tuple[str, int, float, int, tuple[float, ...], tuple[float, ...] | None, bool]


def overloaded_runs(report: dict[str, Any]) -> list[tuple[str, int, float, int]]:
    """Every (workload, slots, rate, seed) a check report found overloaded."""
    return [(workload, int(slots), float(point["rate"]), int(point["seed"]))
            for slots, workloads in report["slots"].items() for workload, found in workloads.items()
            for point in found["points"] if point["overloaded"]]


def run(task: Task) -> tuple[tuple[str, int, float, int], dict[str, Any]]:
    workload, slots, rate, seed, errors, boundaries, with_liars = task
    config = SchedulerConfig()
    if boundaries is not None:
        config = config.with_overrides(boundaries=boundaries, quanta=(math.inf,) * (len(boundaries) + 1))
    load = CHECK_LOADS[slots][workload]
    draw = seed + load.rates.index(rate)  # the check's programs and arrivals at this rate
    programs = make_programs(workload, load.programs_at(rate), seed=draw)
    profile = EngineProfile.load(PROFILE).with_overrides(max_num_seqs=slots)

    def simulate(system: str = "autellix", declared: dict[str, int] | None = None) -> Any:
        return simulate_programs(programs, profile=profile, system=system, rate=rate, seed=draw, config=config,
                                 declared=declared)

    seen = Clairvoyance()
    simulate_programs(programs, profile=profile, system=LEARNING_SYSTEM, rate=rate, seed=draw, ranks=seen)
    means = {"autellix": sim_summary(simulate())["mean_token_latency"],
             "clairvoyant": sim_summary(simulate("clairvoyant"))["mean_token_latency"]}
    for error in errors:
        means[f"declared-{error:g}"] = sim_summary(simulate(declared=declarations(seen.tokens, error, draw)))[
            "mean_token_latency"]
    if not with_liars:
        return (workload, slots, rate, seed), {"means": means}
    truth = declarations(seen.tokens, 0.0, draw)
    liars = sorted(truth, key=truth.__getitem__)[-max(1, round(LIARS_SHARE * len(truth))):]
    silent = {p: t for p, t in truth.items() if p not in liars}
    lying = silent | {p: max(1, truth[p] // LIE) for p in liars}
    liar_means = {}
    for name, declared in (("quiet", silent), ("lied", lying)):
        latencies = {p.program_id: p.token_latency for p in simulate(declared=declared).result.programs}
        liar_means[name] = statistics.mean(latencies[p] for p in liars)
    return (workload, slots, rate, seed), {"means": means, "liars": liar_means}


def cpu_tail(task: tuple[int, str]) -> tuple[tuple[int, str], tuple[float, float]]:
    summary = sim_summary(tool_pause_tail.run(*task))
    return task, (summary["mean_token_latency"], summary["p99_token_latency"])


def print_cpu_tail(seeds: list[int], jobs: int) -> None:
    systems = ("client-plas", "autellix", "autellix-declared")
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        results = dict(pool.map(cpu_tail, [(seed, system) for seed in seeds for system in systems]))
    print("| seed | " + " | ".join(f"{s}: mean / P99 over client-plas's" for s in systems[1:]) + " |")
    print("|---" * len(systems) + "|")
    for seed in seeds:
        mean, p99 = results[(seed, "client-plas")]
        cells = [f"{results[(seed, s)][0] / mean:.2f} / {results[(seed, s)][1] / p99:.2f}" for s in systems[1:]]
        print(f"| {seed} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--points", default=DEFAULT_POINTS,
                        help="workload:slots:rate,... or `overloaded` (every overloaded point of --check)")
    parser.add_argument("--check", default=CHECK_REPORT, help="the check report of --points overloaded")
    parser.add_argument("--no-liars", action="store_true", help="skip the liars' runs")
    parser.add_argument("--out", default=None, help="also write every run's means here (JSON)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--errors", default="0,0.5,1", help="sigmas of the declarations' log-normal error")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--boundaries", default=None, help="autellix's queue boundaries (default: the default's)")
    parser.add_argument("--cpu-tail", action="store_true", help="the CPU engine's tool-pause point instead")
    args = parser.parse_args()
    if args.cpu_tail:
        print_cpu_tail([int(s) for s in args.seeds.split(",")], args.jobs)
        return
    boundaries = tuple(float(b) for b in args.boundaries.split(",")) if args.boundaries else None
    if args.points == "overloaded":
        with open(args.check) as report:
            runs = overloaded_runs(json.load(report))
    else:
        points = [(w, int(n), float(r)) for w, n, r in (p.split(":") for p in args.points.split(","))]
        runs = [(*point, int(seed)) for point in points for seed in args.seeds.split(",")]
    errors = tuple(float(e) for e in args.errors.split(","))
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = dict(pool.map(run, [(*key, errors, boundaries, not args.no_liars) for key in runs]))
    systems = ["autellix", *(f"declared-{e:g}" for e in errors)]
    print("| point | seed | clairvoyant (ms/token) | " + " | ".join(f"{s} / clairvoyant" for s in systems)
          + ("" if args.no_liars else " | liars: lying / saying nothing") + " |")
    print("|---" * (len(systems) + 3 + (not args.no_liars)) + "|")
    for key in runs:
        workload, slots, rate, seed = key
        out = results[key]
        ceiling = out["means"]["clairvoyant"]
        cells = [f"{out['means'][s] / ceiling:.2f}" for s in systems]
        if "liars" in out:
            cells.append(f"{out['liars']['lied'] / out['liars']['quiet']:.3f}")
        print(f"| {workload} {rate:g}/s, {slots} slots | {seed} | {1e3 * ceiling:.1f} | " + " | ".join(cells) + " |")
    for system in systems:
        ratios = [results[key]["means"][system] / results[key]["means"]["clairvoyant"] for key in runs]
        within = sum(r <= CEILING_FACTOR for r in ratios)
        print(f"{system}: within {CEILING_FACTOR}x of the clairvoyant order at {within} of {len(ratios)} runs, "
              f"worst {max(ratios):.2f}x")
    if args.out:
        with open(args.out, "w") as out_file:
            json.dump([{"workload": w, "slots": n, "rate": r, "seed": seed, **results[(w, n, r, seed)]}
                       for w, n, r, seed in runs], out_file, indent=1)


if __name__ == "__main__":
    main()
