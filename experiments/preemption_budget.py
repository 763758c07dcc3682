"""The engine plugin's preemption budget on the real CPU engine.

    .venv/bin/python experiments/preemption_budget.py --workload mixed --budgets 0,2 --rounds 2 --out DIR

``autellix bench sweep`` with client-plas and autellix at each budget
(``max_preemptions``) as systems of their own, run in turn within each round,
so that every budget is compared with client-plas on the same machine minutes
(this machine's throughput moves by a third between runs). The workload's
engine settings and scheduler otherwise (``autellix.loadgen.stack_sweep.ENGINE_SETTINGS``),
cores isolated. Writes ``DIR/<workload>.json`` (the sweep's report, with
``rounds`` and ``paired``) and prints each budget against client-plas.
Results in docs/results/2026-12-02-preemption-budget.md; about 10 minutes a round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import autellix.loadgen.stack_sweep as sweep
from autellix.core import SchedulerConfig
from autellix.engine.cores import CoreSplit
from autellix.loadgen.stack_sweep import EngineSettings
from autellix.workloads.systems import SYSTEMS, System


def budget_system(budget: int) -> str:
    """Register autellix at this budget as a system of its own; returns its name."""
    name = f"autellix-p{budget}"
    SYSTEMS[name] = replace(SYSTEMS["autellix"], name=name)
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="mixed", choices=sorted(sweep.ENGINE_SETTINGS))
    parser.add_argument("--rate", type=float, default=1.8)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--budgets", default="0,2", help="max_preemptions values, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench-results/preemption-budget"))
    args = parser.parse_args()
    budgets = {budget_system(int(b)): int(b) for b in args.budgets.split(",")}
    start_stack = sweep.local_stack

    @contextlib.contextmanager
    def local_stack(system: System, settings: EngineSettings, log_dir: Path, isolate_cores: bool = False,
                    **options: bool) -> Iterator[tuple[str, str, CoreSplit | None]]:
        if system.name in budgets:
            config = (settings.scheduler or SchedulerConfig()).with_overrides(max_preemptions=budgets[system.name])
            settings = replace(settings, scheduler=config)
        with start_stack(system, settings, log_dir, isolate_cores, **options) as stack:
            yield stack

    sweep.local_stack = local_stack
    report = sweep.run_sweep(args.workload, [args.rate], programs=None, seed=args.seed,
                             systems=["client-plas", *budgets], isolate_cores=True, rounds=args.rounds)
    report["budgets"] = budgets
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.workload}.json").write_text(json.dumps(report, indent=2, default=str))
    if args.rounds > 1:
        for name, paired in report["paired"]["by_rate"][str(args.rate)].items():
            if name in budgets:
                mean, p99 = paired["mean_vs_reference"], paired["p99_vs_reference"]
                print(f"{name}: mean {mean['geomean']:.3f}x client-plas ({mean['min']:.2f}-{mean['max']:.2f}), "
                      f"P99 {p99['geomean']:.3f}x ({p99['min']:.2f}-{p99['max']:.2f})")


if __name__ == "__main__":
    main()
