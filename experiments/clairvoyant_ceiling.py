"""How far below llm-d's mean any order of programs can go: the clairvoyant ceiling at the overloaded points.

    nice -n 5 .venv/bin/python experiments/clairvoyant_ceiling.py [--jobs 2]

At each overloaded point of the simulator's check (A100 profile, seeds 1-3) it runs llm-d's rule
(``llmd-fairness``), autellix and the ``clairvoyant`` system (``autellix.sim.clairvoyant``: every program
ranked by its whole work, learnt by a first run of the same programs, Smith's rule over 103 levels, no
anti-starvation). Nothing here is a system to ship: it says which targets an order of programs can reach
at all. It prints llm-d's mean over each system's, per seed and the geometric mean, autellix's mean over
the clairvoyant order's, and the clairvoyant order's P99 over autellix's. About 5 minutes on two cores.
"""

from __future__ import annotations

import argparse
import statistics
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from autellix.core import SchedulerConfig
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.sweep import CHECK_LOADS, _run

PROFILE = "a100-llama3.1-8b"
#: The check's overloaded points (vllm-opt at 3x or more its unloaded latency, as in
#: ``autellix_vs_llmd.py``) on mixed, fan-out and tool-pause.
POINTS = ((32, "mixed", 0.8), (32, "mixed", 1.2), (32, "fanout", 2.0), (32, "tool-pause", 3.0),
          (256, "mixed", 1.6), (256, "fanout", 2.0), (256, "fanout", 4.0), (256, "tool-pause", 4.0),
          (256, "tool-pause", 6.0))
SEEDS = (1, 2, 3)
SYSTEMS = ("llmd-fairness", "autellix", "clairvoyant")


def run(task: tuple[int, str, float, int, str]) -> tuple[tuple[int, str, float, int, str], dict[str, Any]]:
    slots, workload, rate, seed, system = task
    load = CHECK_LOADS[slots][workload]
    profile = EngineProfile.load(PROFILE).with_overrides(max_num_seqs=slots)
    return task, _run(workload, load, rate, profile=profile, system=system, engines=1, config=SchedulerConfig(),
                      seed=seed, index=load.rates.index(rate))


Results = dict[tuple[int, str, float, int, str], dict[str, Any]]


def ratios(results: Results, point: tuple[int, str, float], system: str, metric: str = "mean_token_latency",
           over: str = "llmd-fairness") -> list[float]:
    """``over``'s ``metric`` over ``system``'s at ``point``, one per seed."""
    return [results[(*point, seed, over)][metric] / results[(*point, seed, system)][metric] for seed in SEEDS]


def cell(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values) + f"; **{statistics.geometric_mean(values):.2f}x**"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    tasks = [(n, w, r, seed, s) for n, w, r in POINTS for seed in SEEDS for s in SYSTEMS]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results: Results = dict(pool.map(run, tasks))
    print("| slots | workload | rate | llm-d / autellix, mean (seeds; geomean) | llm-d / clairvoyant "
          "| autellix / clairvoyant, mean | clairvoyant's P99 over autellix's |")
    print("|---|---|---|---|---|---|---|")
    for point in POINTS:
        behind = ratios(results, point, "clairvoyant", over="autellix")
        tail = 1 / statistics.geometric_mean(ratios(results, point, "clairvoyant", "p99_token_latency",
                                                    over="autellix"))
        print(f"| {point[0]} | {point[1]} | {point[2]} | {cell(ratios(results, point, 'autellix'))} | "
              f"{cell(ratios(results, point, 'clairvoyant'))} | {cell(behind)} | {tail:.2f} |", flush=True)


if __name__ == "__main__":
    main()
