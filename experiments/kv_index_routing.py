"""Routing by what the engines hold: Algorithm 2 with the KV event index against the balancers a user would pick.

    nice -n 5 .venv/bin/python experiments/kv_index_routing.py [--engines 4,8] [--seeds 1,2,3] [--rates ...]
        [--workload shared-context] [--weights 1024,4096,16384] [--jobs 2]

In the simulator (A100 profile, ``autellix``'s scheduling on every engine), the ``shared-context``
workload (64 teams, each team's programs over its own 6K-token system prompt) on 4 and 8 engines, each
balancer in turn:

* ``index``: Algorithm 2 weighing the engines' cached prefixes (``cached_tokens_per_call``, the default);
* ``algorithm2``: Algorithm 2 without the index (``cached_tokens_per_call`` 0: the paper's rule);
* ``least_used``: every call to the engine with the fewest calls in flight;
* ``prefix_score``: llm-d's rule (prefix-cache score weight 3, queue score weight 2, per call).

Per engine count, rate and balancer: the mean program token latency (geomean over seeds, and each
seed's), the P99, the prefix cache hit rate (tokens found cached over tokens looked up), and each mean
over ``algorithm2``'s. ``--weights``: ``index`` at each ``cached_tokens_per_call``.
Deterministic per seed (virtual time).
"""

from __future__ import annotations

import argparse
import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from autellix.core import SchedulerConfig
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import sim_summary, simulate_programs
from autellix.workloads import make_programs

PROFILE = "a100-llama3.1-8b"
#: Programs per second per engine, from light to past the engines' saturation.
RATES_PER_ENGINE = (0.5, 1.0, 2.0)
PROGRAMS_PER_ENGINE = 60
BALANCERS: dict[str, dict[str, Any]] = {
    "index": {"balancer": "autellix"},
    "algorithm2": {"balancer": "autellix", "cached_tokens_per_call": 0},
    "least_used": {"balancer": "least_used"},
    "prefix_score": {"balancer": "prefix_score"},
}

Task = tuple[str, int, float, str, int, int | None]


def run(task: Task) -> tuple[Task, dict[str, float]]:
    workload, engines, rate, balancer, seed, weight = task
    config = SchedulerConfig(**BALANCERS[balancer])
    if weight is not None:
        config = config.with_overrides(cached_tokens_per_call=weight)
    programs = make_programs(workload, PROGRAMS_PER_ENGINE * engines, seed=seed)
    summary = sim_summary(simulate_programs(programs, profile=EngineProfile.load(PROFILE), system="autellix",
                                            rate=rate * engines, seed=seed, engines=engines, config=config))
    return task, {"mean": summary["mean_token_latency"], "p99": summary["p99_token_latency"],
                  "hit_rate": summary["prefix_cache_hit_rate"] or 0.0, "failed": summary["failed"]}


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="shared-context")
    parser.add_argument("--engines", default="4,8")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--rates", default=",".join(map(str, RATES_PER_ENGINE)), help="programs/s per engine")
    parser.add_argument("--balancers", default=",".join(BALANCERS))
    parser.add_argument("--weights", default="", help="cached_tokens_per_call values for 'index'")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rates = [float(r) for r in args.rates.split(",")]
    counts = [int(n) for n in args.engines.split(",")]
    variants: list[tuple[str, int | None]] = [(b, None) for b in args.balancers.split(",")]
    if args.weights:
        variants += [("index", int(w)) for w in args.weights.split(",")]
    tasks = [(args.workload, n, r, b, s, w) for n in counts for r in rates for b, w in variants for s in seeds]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = dict(pool.map(run, tasks))
    for n in counts:
        for r in rates:
            print(f"\n{args.workload}, {n} engines, {r:g}/s per engine ({r * n:g}/s)")
            base = [results[(args.workload, n, r, "algorithm2", s, None)]["mean"] for s in seeds] \
                if "algorithm2" in args.balancers else None
            for b, w in variants:
                rows = [results[(args.workload, n, r, b, s, w)] for s in seeds]
                means = [row["mean"] for row in rows]
                rel = "" if base is None else "  /algorithm2 " + " ".join(
                    f"{m / b0:.3f}" for m, b0 in zip(means, base, strict=True))
                name = b if w is None else f"{b}@{w}"
                print(f"  {name:18s} mean {geomean(means) * 1e3:8.2f} ms/token  p99 "
                      f"{geomean([row['p99'] for row in rows]) * 1e3:8.2f}  hit "
                      f"{statistics.fmean(row['hit_rate'] for row in rows):.3f}  failed "
                      f"{sum(row['failed'] for row in rows)}{rel}")


if __name__ == "__main__":
    main()
