"""The real-engine benchmark's settings, simulated on the CPU engine's profiles.

    .venv/bin/python experiments/cpu_engine_settings_in_simulator.py [--workloads mixed,fanout] [--draws 5] [--jobs 2] \
        [--rates 0.5 --programs 26 --first-draw 4 --profile NAME --backlog-factor inf]

For every workload of ``autellix bench sweep`` and every rate of its engine
settings (``autellix.loadgen.stack_sweep.ENGINE_SETTINGS``: slots, token budget,
programs per rate, the scheduler settings), runs client-plas, vllm-opt, plas
and autellix in the simulator on the profile of this machine's CPU engine at
those settings (``EngineSettings.sim_profile``: cpu-tiny for the light ones,
cpu-tiny-heavy for the heavy ones; ``--profile`` for another), over several
draws (draw d at the rate of index i uses seed d + i, as the sweep does),
and prints autellix's mean and P99 program token latency against
client-plas's and vllm-opt's: geometric mean over the draws, with the range.
What the simulator says the real engine would show, at a fraction of its
time (docs/simulation.md, "The benchmark's settings on the CPU
profiles" and "The engine's own steps"); about five minutes on two cores.
"""

from __future__ import annotations

import argparse
import math
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from autellix.core import SchedulerConfig
from autellix.loadgen.stack_sweep import ENGINE_SETTINGS
from autellix.sim.serving import sim_summary, simulate_programs
from autellix.workloads import make_programs

SYSTEMS = ("client-plas", "vllm-opt", "plas", "autellix")


Task = tuple[str, float, int, int, str, int | None, str | None, float | None]


def run_point(task: Task) -> tuple[tuple[str, float, int, str], dict[str, Any]]:
    workload, rate, index, draw, system, count, profile_name, backlog_factor = task
    settings = ENGINE_SETTINGS[workload]
    profile = settings.sim_profile(profile_name)
    seed = draw + index
    programs = make_programs(workload, count or settings.programs_at(rate), seed=seed)
    config = (settings.scheduler or SchedulerConfig()).with_overrides(backlog_factor=backlog_factor)
    run = simulate_programs(programs, profile=profile, system=system, rate=rate, seed=seed, config=config)
    return (workload, rate, draw, system), sim_summary(run)


def ratios(results: dict, workload: str, rate: float, draws: range, metric: str, rival: str) -> list[float]:
    """autellix's ``metric`` over the rival's, draw by draw."""
    return [results[(workload, rate, d, "autellix")][metric] / results[(workload, rate, d, rival)][metric]
            for d in draws]


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default=",".join(ENGINE_SETTINGS))
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--first-draw", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rates", default=None, help="comma-separated (default: each workload's sweep rates)")
    parser.add_argument("--programs", type=int, default=None, help="programs a run (default: the sweep's)")
    parser.add_argument("--profile", default=None, help="a profile's name or JSON (default: the settings' own)")
    parser.add_argument("--backlog-factor", type=float, default=None, help="the scheduler's (default: the settings')")
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    draws = range(args.first_draw, args.first_draw + args.draws)
    chosen = [float(r) for r in args.rates.split(",")] if args.rates else None
    rates = {w: chosen or list(ENGINE_SETTINGS[w].rates) for w in workloads}
    tasks = [(w, rate, i, d, s, args.programs, args.profile, args.backlog_factor)
             for w in workloads for i, rate in enumerate(rates[w]) for d in draws for s in SYSTEMS]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = dict(pool.map(run_point, tasks, chunksize=4))
    print("autellix against client-plas and vllm-opt, geometric mean over draws (range); ms per token")
    for w in workloads:
        for rate in rates[w]:
            line = [f"{w:8} {rate:>4}/s"]
            for metric, label in (("mean_token_latency", "mean"), ("p99_token_latency", "P99")):
                for rival in ("client-plas", "vllm-opt"):
                    r = ratios(results, w, rate, draws, metric, rival)
                    line.append(f"{label}/{rival} {geomean(r):.2f} ({min(r):.2f}-{max(r):.2f})")
            cp = geomean([results[(w, rate, d, "client-plas")]["mean_token_latency"] for d in draws])
            line.append(f"client-plas {1e3 * cp:.1f}")
            print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
