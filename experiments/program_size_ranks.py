"""What knowing a program's size is worth, and how much of it an order that knows less recovers, in the simulator.

    nice -n 5 .venv/bin/python experiments/program_size_ranks.py [--points mixed:32:1.2,tool-pause:32:3.0] \
        [--seeds 1,2,3] [--jobs 2] [--systems autellix,clairvoyant,...]

At overloaded points of the check (A100 profile) it runs autellix, the clairvoyant order
(``autellix.sim.clairvoyant``) and orders set from outside the policy (``ProgramRanks``), each in the
plugin's queue with 103 levels 1.25x apart and no anti-starvation, as the clairvoyant's:

* ``program-fcfs``: programs in the order they arrived, nothing known of their size: whether a strict order
  of programs, rather than knowing sizes, is what the clairvoyant order gains;
* ``kind-gittins``: an estimate learnt online, as a gateway could: per kind of program (the workload's own
  label, which a client could declare), the finished programs' total model time S and tokens T; a program
  that has had ``a`` seconds is ranked by the Gittins index of its kind's programs larger than ``a``
  (sup over thresholds d of E[1/T; S - a <= d] / E[min(S - a, d)], the index for a mean weighted by
  1/tokens), its rank the inverse; a program larger than any finished one, or of a kind with fewer than
  three finished, ranks as if as much again were to come. A program's place is its latest call's rank;
* ``gittins-oracle``: the same index over each kind's exact size distribution (every program of the kind
  in this run, from the clairvoyant's first pass): the best a scheduler that knows the distribution of
  sizes, and not which program has which, is known to do (Gittins' order is optimal for that on one
  server; an engine of many slots is not one server, so this is a reference, not a bound);
* ``hint-0.5``, ``hint-1.0``, ``hint-2.0``: the clairvoyant order with each program's size known only within a
  log-normal error of that sigma (a fixed factor per program): how good a size that a client declares
  must be to be worth reading.

Prints each system's mean program token latency per seed and per kind of program, and each over the
clairvoyant order's. Not a system to ship: it says where the gap to the clairvoyant order is.
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import statistics
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from autellix.core import SchedulerConfig
from autellix.sim.clairvoyant import CLAIRVOYANT_LEVELS, LEARNING_SYSTEM, Clairvoyance, root
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import ProgramRanks, sim_summary, simulate_programs
from autellix.sim.sweep import CHECK_LOADS
from autellix.workloads import make_programs

PROFILE = "a100-llama3.1-8b"
SYSTEMS = ("autellix", "clairvoyant", "program-fcfs", "kind-gittins", "gittins-oracle", "hint-0.5", "hint-1.0",
           "hint-2.0")
#: The systems that run the clairvoyant's first pass to learn each program's size.
TWO_PASS = ("gittins-oracle", "hint-0.5", "hint-1.0", "hint-2.0")
#: A kind needs this many finished programs before its own are the estimate (before: every kind's).
MIN_SAMPLES = 3


class ProgramFcfs:
    """Programs ranked by arrival: the first program to call first."""

    learning = False
    latest = False

    def __init__(self) -> None:
        self.order: dict[str, int] = {}

    def finished(self, program_id: str, model_time: float, output_tokens: int) -> None:
        pass

    def ended(self, program_id: str) -> None:
        pass

    def rank(self, program_id: str) -> float:
        place = self.order.setdefault(root(program_id), len(self.order))
        return CLAIRVOYANT_LEVELS.boundaries[min(place, len(CLAIRVOYANT_LEVELS.boundaries) - 1)] * 1.1


def gittins_rank(sizes: list[tuple[float, int]], attained: float, tokens: int) -> float:
    """The inverse Gittins index of a program that has had ``attained`` seconds (and ``tokens`` tokens) among
    programs of ``sizes`` (total model time, tokens), sorted by size; as much again to come when it is
    larger than every one."""
    larger = sizes[bisect.bisect_right(sizes, (attained, math.inf)):]
    if not larger:
        return max(attained, 1e-3) * 2 * max(tokens, 1)
    best, weight, spent = 0.0, 0.0, 0.0
    for j, (size, size_tokens) in enumerate(larger):
        weight += 1.0 / size_tokens
        spent += size - attained
        expected = spent + (len(larger) - j - 1) * (size - attained)
        best = max(best, weight / max(expected, 1e-9))
    return 1.0 / best


class KindGittins:
    """The Gittins index of a program's kind, learnt from the kind's finished programs (``sizes`` None)
    or given whole (``sizes``: each kind's programs)."""

    learning = False
    latest = True

    def __init__(self, kinds: dict[str, str], sizes: dict[str, list[tuple[float, int]]] | None = None) -> None:
        self.kinds = kinds
        self.served: dict[str, float] = defaultdict(float)
        self.tokens: dict[str, int] = defaultdict(int)
        self.learnt = sizes is None
        self.sizes: dict[str, list[tuple[float, int]]] = defaultdict(list, {k: sorted(v) for k, v in
                                                                              (sizes or {}).items()})

    def finished(self, program_id: str, model_time: float, output_tokens: int) -> None:
        self.served[root(program_id)] += model_time
        self.tokens[root(program_id)] += output_tokens

    def ended(self, program_id: str) -> None:
        if self.learnt:
            bisect.insort(self.sizes[self.kinds[program_id]],
                          (self.served[program_id], max(self.tokens[program_id], 1)))

    def rank(self, program_id: str) -> float:
        key = root(program_id)
        own = self.sizes[self.kinds[key]]
        known = own if len(own) >= MIN_SAMPLES else sorted(p for ps in self.sizes.values() for p in ps)
        return gittins_rank(known, self.served[key], self.tokens[key])


class NoisyClairvoyance(Clairvoyance):
    """The clairvoyant order with each program's size off by a fixed log-normal factor of ``sigma``."""

    def __init__(self, seen: Clairvoyance, sigma: float, seed: int) -> None:
        super().__init__(learning=False, model_time=seen.model_time, tokens=seen.tokens)
        rng = random.Random(seed)
        self.error = {key: math.exp(rng.gauss(0.0, sigma)) for key in sorted(seen.model_time)}

    def rank(self, program_id: str) -> float:
        return super().rank(program_id) * self.error.get(root(program_id), 1.0)


def ranks_for(system: str, programs: list[Any], seen: Clairvoyance | None, seed: int) -> ProgramRanks:
    kinds = {p.program_id: p.workload for p in programs}
    if system == "program-fcfs":
        return ProgramFcfs()
    if system == "kind-gittins":
        return KindGittins(kinds)
    assert seen is not None
    if system == "gittins-oracle":
        sizes: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for key, model_time in seen.model_time.items():
            sizes[kinds[key]].append((model_time, max(seen.tokens[key], 1)))
        return KindGittins(kinds, sizes)
    return NoisyClairvoyance(seen, float(system.removeprefix("hint-")), seed)


def run(task: tuple[str, int, float, int, str]) -> tuple[tuple[str, int, float, int, str], dict[str, Any]]:
    workload, slots, rate, seed, system = task
    load = CHECK_LOADS[slots][workload]
    index = load.rates.index(rate)
    programs = make_programs(workload, load.programs_at(rate), seed=seed + index)
    profile = EngineProfile.load(PROFILE).with_overrides(max_num_seqs=slots)
    ranks: ProgramRanks | None = None
    config = SchedulerConfig()
    if system not in ("autellix", "clairvoyant"):
        seen = None
        if system in TWO_PASS:
            seen = Clairvoyance()
            simulate_programs(programs, profile=profile, system=LEARNING_SYSTEM, rate=rate, seed=seed + index,
                              ranks=seen)
        ranks = ranks_for(system, programs, seen, seed)
        config = config.with_overrides(boundaries=CLAIRVOYANT_LEVELS.boundaries, quanta=CLAIRVOYANT_LEVELS.quanta,
                                       beta=CLAIRVOYANT_LEVELS.beta)
    out = simulate_programs(programs, profile=profile, system=LEARNING_SYSTEM if ranks else system, rate=rate,
                            seed=seed + index, config=config, ranks=ranks)
    by_kind: dict[str, list[float]] = defaultdict(list)
    for program in out.result.programs:
        by_kind[program.workload].append(program.token_latency)
    return task, {"mean": sim_summary(out)["mean_token_latency"],
                  "by_kind": {kind: statistics.mean(values) for kind, values in sorted(by_kind.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--points", default="mixed:32:1.2,tool-pause:32:3.0,mixed:32:0.8")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="autellix and clairvoyant always run")
    args = parser.parse_args()
    systems = ["autellix", "clairvoyant"] + [s for s in args.systems.split(",") if s not in ("autellix", "clairvoyant")]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems: {sorted(unknown)}; known: {SYSTEMS}")
    points = [(w, int(n), float(r)) for w, n, r in (p.split(":") for p in args.points.split(","))]
    seeds = [int(s) for s in args.seeds.split(",")]
    tasks = [(*point, seed, system) for point in points for seed in seeds for system in systems]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = dict(pool.map(run, tasks))
    print("| point | seed | " + " | ".join(f"{s} (ms/token; over clairvoyant)" for s in systems) + " |")
    print("|---" * (len(systems) + 2) + "|")
    for point in points:
        for seed in seeds:
            ceiling = results[(*point, seed, "clairvoyant")]["mean"]
            means = [results[(*point, seed, s)]["mean"] for s in systems]
            cells = [f"{1e3 * mean:.1f}; {mean / ceiling:.2f}x" for mean in means]
            print(f"| {point[0]} {point[2]}/s, {point[1]} slots | {seed} | " + " | ".join(cells) + " |")
    print("\nper kind of program (ms/token, mean over seeds):")
    for point in points:
        for system in systems:
            kinds: dict[str, list[float]] = defaultdict(list)
            for seed in seeds:
                for kind, value in results[(*point, seed, system)]["by_kind"].items():
                    kinds[kind].append(value)
            print(f"  {point[0]} {point[2]}/s {system}: "
                  + ", ".join(f"{k} {1e3 * statistics.mean(v):.1f}" for k, v in kinds.items()))


if __name__ == "__main__":
    main()
