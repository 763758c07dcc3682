"""Where the CPU engine's ``tool-pause`` tail comes from, in the simulator, and what changes it.

    nice -n 5 .venv/bin/python experiments/tool_pause_tail.py [--seeds 1-8] [--variants ...] [--trace SEED]
    nice -n 5 .venv/bin/python experiments/tool_pause_tail.py --check ORDER [--against REPORT]

The point is the real CPU engine's (``cpu-tiny``, 4 slots, 60 ``tool-pause`` programs at 4/s), where
autellix's P99 program token latency trails client-plas's on the engine and in the simulator
(``declared_sizes.py --cpu-tail``). Each variant runs as ``autellix`` (admission on) and
``autellix-no-admission``; it prints each one's mean and P99 over client-plas's, the geometric mean over
the seeds and their range. Variants:

* ``default``: as it ships;
* ``beta=B``, ``backlog_factor=F`` (``;`` between several): scheduler settings;
* ``tail``: a promoted call joins Q1's tail (by when it was promoted) instead of the place its arrival gives it;
* ``ratio``: at each sweep the promoted calls waiting in Q1 are ordered by their program's wait over its
  service, the most starved first (highest response ratio next), in the places they hold;
* ``las``: the same, by their program's charged service, the least first: since 2026-12-07 the queue's own
  order (``MultiLevelQueue._order_promoted``), so the same as ``default``.

The last three patch ``core.mlq.MultiLevelQueue`` here (nothing else changes); the engine's planner may skip a
sweep that would move no call, so a reorder waits for the next sweep that runs. ``--trace SEED`` prints the
programs with the worst token latency under autellix beside client-plas: when each program arrived, when its
first call was sent (the wait in admission), and each call's queueing. ``--check ORDER`` runs the simulator's
check (``autellix sim sweep --figures check``, no ceiling) with promoted calls placed by ``ORDER``: only the
systems that run the queue (autellix and plas) run again, the others' results are read from ``--against``,
a check report of the same tree (theirs do not depend on the queue), and each point is checked as the sweep
checks it; it prints the points whose verdict or autellix's numbers moved. Deterministic (virtual time).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import autellix.core.mlq as mlq
from autellix.core import SchedulerConfig
from autellix.sim import sweep
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import SimRun, sim_summary, simulate_programs
from autellix.workloads import make_programs

WORKLOAD, PROGRAMS, RATE, SLOTS = "tool-pause", 60, 4.0, 4
#: The check report the queue's orders are held to, and the systems of the check that run the queue.
AGAINST, QUEUED = "docs/img/declared-check/sim-check.json", ("autellix", "plas")
SYSTEMS = ("autellix", "autellix-no-admission")
DEFAULT_VARIANTS = "default,tail,ratio,las,beta=8,beta=16,beta=inf,backlog_factor=inf"
ORDERS = ("tail", "ratio", "las")


def _reorder_promoted(queue: mlq.MultiLevelQueue, order: str, moved: list[mlq.QueuedCall]) -> None:
    """The promoted calls waiting in Q1, reordered among the places they hold."""
    q1 = queue._queues[0]
    calls = [c for c in q1 if c.promoted and not c.running]
    if len(calls) < 2:
        return
    clock = queue._shared_clock[0]

    def key(call: mlq.QueuedCall) -> float:
        view = queue._lookup(call.program_id)
        service = view.charged + call.model_time
        if order == "las":
            return service
        wait = view.wait + max(0.0, clock - call.wait_origin - call.model_time)
        return -wait / service if service > 0 else -math.inf

    places = sorted(c.entered for c in calls)
    for call in calls:
        q1.discard(call)
    for call, place in zip(sorted(calls, key=key), places, strict=True):
        if call.entered != place:
            call.entered = place
            moved.append(call)
        q1.insert(call)
    queue.changes += 1


@contextmanager
def promoted_order(order: str | None) -> Iterator[None]:
    """``MultiLevelQueue`` with promoted calls placed by ``order`` (None: unchanged)."""
    if order is None:
        yield
        return
    queue_sweep, queue_move = mlq.MultiLevelQueue._sweep, mlq.MultiLevelQueue._move

    def patched_move(self: mlq.MultiLevelQueue, call: mlq.QueuedCall, level: int, *, by_arrival: bool = False) -> None:
        queue_move(self, call, level, by_arrival=by_arrival and not (order == "tail" and call.promoted and level == 0))

    def patched_sweep(self: mlq.MultiLevelQueue, now: float) -> list[mlq.QueuedCall]:
        moved = queue_sweep(self, now)
        if order != "tail" and not math.isinf(self.spec.beta):
            _reorder_promoted(self, order, moved)
        return moved

    mlq.MultiLevelQueue._sweep, mlq.MultiLevelQueue._move = patched_sweep, patched_move
    try:
        yield
    finally:
        mlq.MultiLevelQueue._sweep, mlq.MultiLevelQueue._move = queue_sweep, queue_move


def run(seed: int, system: str, variant: str = "default") -> SimRun:
    order = variant if variant in ORDERS else None
    config = SchedulerConfig()
    if variant not in ORDERS and variant != "default":
        config = config.with_overrides(**{k: float(v) for k, v in (s.split("=") for s in variant.split(";"))})
    profile = EngineProfile.load("cpu-tiny").with_overrides(max_num_seqs=SLOTS)
    with promoted_order(order):
        return simulate_programs(make_programs(WORKLOAD, PROGRAMS, seed=seed), profile=profile, system=system,
                                 rate=RATE, seed=seed, config=config)


Task = tuple[int, str, str]


def task(t: Task) -> tuple[Task, tuple[float, float]]:
    summary = sim_summary(run(*t))
    return t, (summary["mean_token_latency"], summary["p99_token_latency"])


def spread(ratios: list[float]) -> str:
    return f"{statistics.geometric_mean(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def print_variants(seeds: list[int], variants: list[str], jobs: int) -> None:
    tasks = [(s, "client-plas", "default") for s in seeds]
    tasks += [(s, system, v) for v in variants for system in SYSTEMS for s in seeds]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        results = dict(pool.map(task, tasks))
    print("| variant | " + " | ".join(f"{s}: mean / P99 over client-plas's" for s in SYSTEMS) + " |")
    print("|---" * (len(SYSTEMS) + 1) + "|")
    for variant in variants:
        cells = []
        for system in SYSTEMS:
            base = [results[(s, "client-plas", "default")] for s in seeds]
            mine = [results[(s, system, variant)] for s in seeds]
            cells.append(f"{spread([m[0] / b[0] for m, b in zip(mine, base, strict=True)])} / "
                         f"{spread([m[1] / b[1] for m, b in zip(mine, base, strict=True)])}")
        print(f"| {variant} | " + " | ".join(cells) + " |")


def print_trace(seed: int, worst: int = 6) -> None:
    runs = {system: run(seed, system) for system in ("client-plas", "autellix")}
    programs = {system: {p.program_id: p for p in r.result.programs} for system, r in runs.items()}
    calls: dict[str, dict[str, list[Any]]] = {system: {} for system in runs}
    for system, r in runs.items():
        for call in sorted(r.result.calls, key=lambda c: c.submitted):
            calls[system].setdefault(call.program_id, []).append(call)
    ranked = sorted(programs["autellix"].values(), key=lambda p: -p.token_latency)[:worst]
    print("| program | arrived (s) | tokens / calls | system | token latency (ms) | first call sent after (s) "
          "| each call's queueing (s) |")
    print("|---|---|---|---|---|---|---|")
    for stat in ranked:
        for system in runs:
            p, mine = programs[system][stat.program_id], calls[system][stat.program_id]
            queueing = ", ".join(f"{c.queue_s:.2f}" for c in mine if c.queue_s is not None)
            print(f"| {p.program_id} | {p.arrival:.1f} | {p.tokens} / {p.calls} | {system} | "
                  f"{p.token_latency * 1000:.0f} | {mine[0].submitted - p.arrival:.1f} | {queueing} |")


def print_check(order: str, against: str, jobs: int) -> None:
    before = json.loads(Path(against).read_text())
    with promoted_order(order):  # the check's worker processes are forked with it
        after = sweep.check(before["profile"], slots=[int(n) for n in before["slots"]], seeds=before["seeds"],
                            systems=QUEUED, jobs=jobs, ceiling=False, progress=lambda _: None)
    passed = [0, 0]
    logs: list[tuple[float, float]] = []
    print("| slots | workload | rate | seed | overloaded | mean / P99 over the best rival's: before, after | "
          "autellix after / before: mean, P99 | passes after |")
    print("|---|---|---|---|---|---|---|---|")
    for n, workloads in before["slots"].items():
        for workload, data in workloads.items():
            for old, new in zip(data["points"], after["slots"][n][workload]["points"], strict=True):
                results = old["results"] | new["results"]
                check = sweep.check_point(results)
                passed[0] += old["check"]["passed"]
                passed[1] += check["passed"]
                mine, was = new["results"]["autellix"], old["results"]["autellix"]
                mean = mine["mean_token_latency"] / was["mean_token_latency"]
                p99 = mine["p99_token_latency"] / was["p99_token_latency"]
                if old["overloaded"]:
                    logs.append((math.log(mean), math.log(p99)))
                if check["passed"] != old["check"]["passed"] or not check["passed"] or max(
                        abs(mean - 1), abs(p99 - 1)) > 0.03:
                    print(f"| {n} | {workload} | {old['rate']:g} | {old['seed']} | {old['overloaded']} | "
                          f"{old['check']['mean_vs_best']:.3f} / {old['check']['p99_vs_best']:.3f}, "
                          f"{check['mean_vs_best']:.3f} / {check['p99_vs_best']:.3f} | {mean:.3f}, {p99:.3f} | "
                          f"{check['passed']} |")
    points = sum(len(w["points"]) for by_workload in before["slots"].values() for w in by_workload.values())
    mean_ratio = math.exp(statistics.mean(m for m, _ in logs))
    p99_ratio = math.exp(statistics.mean(p for _, p in logs))
    print(f"\npoints passed: {passed[0]} before, {passed[1]} after, of {points}; autellix at the overloaded "
          f"points, after / before (geometric mean): mean {mean_ratio:.3f}, P99 {p99_ratio:.3f}")


def seeds_of(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last) + 1)) if last else [int(s) for s in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seeds", default="1-8", help="1-8 or 1,2,3")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--trace", type=int, default=None, help="the worst programs of this seed instead")
    parser.add_argument("--check", choices=ORDERS, default=None, help="the check with this order instead")
    parser.add_argument("--against", default=AGAINST, help="the check report held to")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if args.check is not None:
        print_check(args.check, args.against, args.jobs)
        return
    if args.trace is not None:
        print_trace(args.trace)
        return
    print_variants(seeds_of(args.seeds), args.variants.split(","), args.jobs)


if __name__ == "__main__":
    main()
