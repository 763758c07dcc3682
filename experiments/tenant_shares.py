"""What tenant shares do for a tenant's lone agent beside another tenant's swarm, and how weights split the engine.

    nice -n 5 .venv/bin/python experiments/tenant_shares.py [--seeds 1,2,3] [--swarms 1,8,32,128] [--jobs 2]

In the simulator (A100 profile), two tenants of equal weight:

* ``lone``: one long agent, a multi-agent program (rounds of 4-16 parallel calls over one long shared
  prompt: it can fill the engine's ``SWARM_SLOTS`` slots, so half of them is a share it can use); with
  ``--lone lats --slots 32``, a tree search on a larger engine;
* ``swarm``: N fresh ``bfcl`` programs arriving after it at ``SWARM_RATE``; N = 1 is the baseline instead:
  the other tenant runs one program like the lone agent, and each tenant holds half.

For each system it prints the lone agent's latency (arrival to finish) over its latency in the baseline
run of the same system, and the run's throughput (tokens per second until nine tenths were generated) over
the same run without tenants (every program one tenant's: no shares). ``autellix`` shares by tenant;
``autellix-one-tenant`` is it with no tenants named; ``lone-first`` is autellix with the lone tenant's
weight a million (the most any share could do for it: what is left is the batch the swarm keeps full);
``llmd-fairness`` is llm-d's queue per program; ``vllm`` is bare vLLM.

``--equal``: two tenants of equal weight running the same workload (every other program of 200 ``mixed`` at
2/s, or ``bfcl`` at 8/s, 32 slots): the mean program token latency of all with shares over without, which
should be 1: tenants alike have nothing to take from each other.

Then ``--weights``: two tenants, each ``WEIGHTS_PROGRAMS`` ``bfcl`` programs arriving together on a
32-slot engine, with the weights 3:1 (and 1:1): each tenant's model time over the contended interval
(from the last tenant's first arrival until the first tenant has fewer programs live than the engine
has slots), its ratio, and the throughput over no shares'. Deterministic per seed (virtual time).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import SimRun, simulate_programs
from autellix.workloads import AgentProgram, make_programs
from autellix.workloads.run_metrics import steady_throughput

PROFILE = "a100-llama3.1-8b"
LONE_WORKLOAD, SWARM_WORKLOAD, SWARM_RATE, SWARM_SLOTS = "multiagent", "bfcl", 20.0, 8
WEIGHTS_WORKLOAD, WEIGHTS_PROGRAMS, WEIGHTS_RATE, WEIGHTS_SLOTS = "bfcl", 150, 20.0, 32
SYSTEMS = ("autellix", "autellix-one-tenant", "lone-first", "llmd-fairness", "vllm")


def lone_and_peer(workload: str, seed: int) -> tuple[AgentProgram, AgentProgram]:
    """The lone agent and the program like it: the seed's first two programs of ``workload``."""
    lone, peer = make_programs(workload, 2, seed=seed)
    return lone, peer


def tenant(program: AgentProgram, name: str | None) -> AgentProgram:
    return dataclasses.replace(program, tenant=name)


def simulate(programs: list[AgentProgram], system: str, seed: int, rate: float, slots: int,
             weights: dict[str, float] | None = None) -> SimRun:
    if system == "autellix-one-tenant":
        programs, system = [tenant(p, None) for p in programs], "autellix"
    elif system == "lone-first":
        system, weights = "autellix", (weights or {}) | {"lone": 1e6}
    profile = EngineProfile.load(PROFILE).with_overrides(max_num_seqs=slots)
    return simulate_programs(programs, profile=profile, system=system, rate=rate, seed=seed,
                             tenant_weights=weights)


def throughput(run: SimRun) -> float:
    return steady_throughput(run.result)


SwarmTask = tuple[int, int, str, str, int]


def swarm_task(task: SwarmTask) -> tuple[SwarmTask, dict[str, float]]:
    seed, swarm, system, workload, slots = task
    lone, peer = lone_and_peer(workload, seed)
    others = [peer] if swarm == 1 else make_programs(SWARM_WORKLOAD, swarm, seed=seed)
    programs = [tenant(lone, "lone")] + [tenant(p, "swarm") for p in others]
    run = simulate(programs, system, seed, SWARM_RATE, slots)
    stat = next(p for p in run.result.programs if p.program_id == lone.program_id)
    return task, {"lone": stat.finish - stat.arrival, "throughput": throughput(run)}


def weights_task(task: tuple[int, float, str]) -> tuple[tuple[int, float, str], dict[str, float]]:
    seed, weight, system = task
    heavy = make_programs(WEIGHTS_WORKLOAD, 2 * WEIGHTS_PROGRAMS, seed=seed)
    programs = [tenant(p, "heavy" if i % 2 == 0 else "light") for i, p in enumerate(heavy)]
    run = simulate(programs, system, seed, WEIGHTS_RATE, WEIGHTS_SLOTS, weights={"heavy": weight, "light": 1.0})
    of = {p.program_id: p.tenant for p in programs}
    stats = run.result.programs
    start = max(min(s.arrival for s in stats if of[s.program_id] == t) for t in ("heavy", "light"))
    end = min(backlogged_until([s for s in stats if of[s.program_id] == t]) for t in ("heavy", "light"))
    split = {"heavy": 0.0, "light": 0.0}
    for call in run.result.calls:
        if call.model_time and start <= call.finished <= end:
            split[of[call.program_id.split("/")[0]] or "heavy"] += call.model_time
    return task, split | {"interval": end - start, "throughput": throughput(run)}


def backlogged_until(stats: list[Any]) -> float:
    """When the tenant last had at least ``WEIGHTS_SLOTS`` programs live, after it first had: from then on it
    can no longer fill the engine alone (a ``bfcl`` program has one call at a time)."""
    events = sorted([(s.arrival, 1) for s in stats] + [(s.finish, -1) for s in stats])
    live, full, until = 0, False, 0.0
    for at, change in events:
        live += change
        if live >= WEIGHTS_SLOTS:
            full = True
        elif full:
            until = at
            break
    return until


EQUAL_POINTS = (("mixed", 2.0), ("bfcl", 8.0))


def equal_task(task: tuple[int, str, float, str]) -> tuple[tuple[int, str, float, str], dict[str, float]]:
    """The mean program token latency of all, and each tenant's (``mean a``) and model time (``time a``)."""
    seed, workload, rate, system = task
    programs = [tenant(p, "a" if i % 2 == 0 else "b") for i, p in enumerate(make_programs(workload, 200, seed=seed))]
    run = simulate(programs, system, seed, rate, WEIGHTS_SLOTS)
    of = {p.program_id: p.tenant for p in programs}
    out = {"mean": statistics.mean(p.token_latency for p in run.result.programs), "time a": 0.0, "time b": 0.0}
    for name in "ab":
        out[f"mean {name}"] = statistics.mean(p.token_latency for p in run.result.programs if of[p.program_id] == name)
    for call in run.result.calls:
        out[f"time {of[call.program_id.split('/')[0]]}"] += call.model_time or 0.0
    return task, out


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--swarms", default="1,8,32,128", help="swarm sizes; 1 is the baseline")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--lone", default=LONE_WORKLOAD, help="the lone agent's workload")
    parser.add_argument("--slots", type=int, default=SWARM_SLOTS, help="the engine's slots in the swarm runs")
    parser.add_argument("--weights", action="store_true", help="the weights' split instead")
    parser.add_argument("--equal", action="store_true", help="two tenants alike instead")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    systems = args.systems.split(",")
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        if args.equal:
            means = dict(pool.map(equal_task, [(seed, w, r, system) for seed in seeds for w, r in EQUAL_POINTS
                                               for system in ("autellix", "autellix-one-tenant")]))
            print("| workload | mean token latency, shares over none (mean, min-max over seeds) |")
            print("|---|---|")
            for workload, rate in EQUAL_POINTS:
                ratios = [means[(s, workload, rate, "autellix")]["mean"]
                          / means[(s, workload, rate, "autellix-one-tenant")]["mean"] for s in seeds]
                print(f"| {workload} {rate:g}/s | {spread(ratios)} |")
            print("\n| workload | seed | system | model time a / b (s) | mean token latency a / b (ms) |")
            print("|---|---|---|---|---|")
            for (seed, workload, rate, system), m in sorted(means.items()):
                print(f"| {workload} {rate:g}/s | {seed} | {system} | {m['time a']:.0f} / {m['time b']:.0f} | "
                      f"{m['mean a'] * 1000:.1f} / {m['mean b'] * 1000:.1f} |")
            return
        if args.weights:
            systems = [s for s in systems if s != "lone-first"]  # no lone tenant here
            runs: dict[Any, dict[str, float]] = dict(pool.map(weights_task, [
                (seed, weight, system) for seed in seeds for weight in (3.0, 1.0) for system in systems]))
            print("| system | weights | heavy : light model time (mean, min-max over seeds) | contended s | "
                  "throughput over autellix-one-tenant's |")
            print("|---|---|---|---|---|")
            for system in systems:
                for weight in (3.0, 1.0):
                    ratios = [runs[(s, weight, system)]["heavy"] / runs[(s, weight, system)]["light"] for s in seeds]
                    tput = [runs[(s, weight, system)]["throughput"]
                            / runs[(s, weight, "autellix-one-tenant")]["throughput"] for s in seeds]
                    interval = statistics.mean(runs[(s, weight, system)]["interval"] for s in seeds)
                    print(f"| {system} | {weight:g}:1 | {spread(ratios)} | {interval:.0f} | {spread(tput)} |")
            return
        swarms = [int(n) for n in args.swarms.split(",")]
        if 1 not in swarms:
            swarms = [1, *swarms]
        runs = dict(pool.map(swarm_task, [(seed, n, system, args.lone, args.slots)
                                          for seed in seeds for n in swarms for system in systems]))
    print("| system | swarm N | lone agent's latency over its baseline's (mean, min-max over seeds) | "
          "throughput over autellix-one-tenant's |")
    print("|---|---|---|---|")
    for system in systems:
        for n in swarms[1:]:
            at = {s: (s, n, system, args.lone, args.slots) for s in seeds}
            lone = [runs[at[s]]["lone"] / runs[(s, 1, system, args.lone, args.slots)]["lone"] for s in seeds]
            tput = [runs[at[s]]["throughput"] / runs[(s, n, "autellix-one-tenant", args.lone, args.slots)]["throughput"]
                    for s in seeds]
            print(f"| {system} | {n} | {spread(lone)} | {spread(tput)} |")


if __name__ == "__main__":
    main()
