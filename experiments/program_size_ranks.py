"""What knowing a program's size is worth, and how much an online estimate of it recovers, in the simulator.

    nice -n 5 .venv/bin/python experiments/program_size_ranks.py [--points mixed:32:1.2,tool-pause:32:3.0] \
        [--seeds 1,2,3] [--jobs 2]

At overloaded points of the check (A100 profile) it runs autellix, the clairvoyant order
(``autellix.sim.clairvoyant``) and two orders set from outside the policy (``ProgramRanks``), each in the
plugin's queue with 103 levels 1.25x apart and no anti-starvation, as the clairvoyant's:

* ``program-fcfs``: programs in the order they arrived, nothing known of their size: whether a strict order
  of programs, rather than knowing sizes, is what the clairvoyant order gains;
* ``kind-gittins``: an estimate learnt online, as a gateway could: per kind of program (the workload's own
  label, which a client could declare), the finished programs' total model time S and tokens T; a program
  that has had ``a`` seconds is ranked by the Gittins index of its kind's programs larger than ``a``
  (sup over thresholds d of E[1/T; S - a <= d] / E[min(S - a, d)], the index for a mean weighted by
  1/tokens), its rank the inverse; a program larger than any finished one, or of a kind with fewer than
  three finished, ranks as if as much again were to come. The engine keeps the largest rank a program's
  calls carried (it keeps the largest service), so a rank never falls.

Prints each system's mean program token latency per seed and per kind of program, and each over the
clairvoyant order's. Not a system to ship: it says where the gap to the clairvoyant order is.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from autellix.core import SchedulerConfig
from autellix.sim.clairvoyant import CLAIRVOYANT_LEVELS, LEARNING_SYSTEM, root
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import ProgramRanks, sim_summary, simulate_programs
from autellix.sim.sweep import CHECK_LOADS
from autellix.workloads import make_programs

PROFILE = "a100-llama3.1-8b"
SYSTEMS = ("autellix", "clairvoyant", "program-fcfs", "kind-gittins")
#: A kind needs this many finished programs before its own are the estimate (before: every kind's).
MIN_SAMPLES = 3


class ProgramFcfs:
    """Programs ranked by arrival: the first program to call first."""

    learning = False

    def __init__(self) -> None:
        self.order: dict[str, int] = {}

    def finished(self, program_id: str, model_time: float, output_tokens: int) -> None:
        pass

    def ended(self, program_id: str) -> None:
        pass

    def rank(self, program_id: str) -> float:
        place = self.order.setdefault(root(program_id), len(self.order))
        return CLAIRVOYANT_LEVELS.boundaries[min(place, len(CLAIRVOYANT_LEVELS.boundaries) - 1)] * 1.1


class KindGittins:
    """The Gittins index of a program's kind, learnt from the kind's finished programs."""

    learning = False

    def __init__(self, kinds: dict[str, str]) -> None:
        self.kinds = kinds
        self.served: dict[str, float] = defaultdict(float)
        self.tokens: dict[str, int] = defaultdict(int)
        self.finished_programs: dict[str, list[tuple[float, int]]] = defaultdict(list)

    def finished(self, program_id: str, model_time: float, output_tokens: int) -> None:
        self.served[root(program_id)] += model_time
        self.tokens[root(program_id)] += output_tokens

    def ended(self, program_id: str) -> None:
        self.finished_programs[self.kinds[program_id]].append((self.served[program_id],
                                                               max(self.tokens[program_id], 1)))

    def rank(self, program_id: str) -> float:
        key = root(program_id)
        attained, tokens = self.served[key], self.tokens[key]
        own = self.finished_programs[self.kinds[key]]
        known = own if len(own) >= MIN_SAMPLES else [p for ps in self.finished_programs.values() for p in ps]
        larger = sorted(p for p in known if p[0] > attained)
        if not larger:  # as much again to come
            return max(attained, 1e-3) * 2 * max(tokens, 1)
        best, weight, spent = 0.0, 0.0, 0.0
        for j, (size, size_tokens) in enumerate(larger):
            weight += 1.0 / size_tokens
            spent += size - attained
            expected = spent + (len(larger) - j - 1) * (size - attained)
            best = max(best, weight / max(expected, 1e-9))
        return 1.0 / best


def run(task: tuple[str, int, float, int, str]) -> tuple[tuple[str, int, float, int, str], dict[str, Any]]:
    workload, slots, rate, seed, system = task
    load = CHECK_LOADS[slots][workload]
    index = load.rates.index(rate)
    programs = make_programs(workload, load.programs_at(rate), seed=seed + index)
    profile = EngineProfile.load(PROFILE).with_overrides(max_num_seqs=slots)
    ranks: ProgramRanks | None = None
    config = SchedulerConfig()
    if system in ("program-fcfs", "kind-gittins"):
        ranks = ProgramFcfs() if system == "program-fcfs" else KindGittins({p.program_id: p.workload
                                                                            for p in programs})
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
    args = parser.parse_args()
    points = [(w, int(n), float(r)) for w, n, r in (p.split(":") for p in args.points.split(","))]
    seeds = [int(s) for s in args.seeds.split(",")]
    tasks = [(*point, seed, system) for point in points for seed in seeds for system in SYSTEMS]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = dict(pool.map(run, tasks))
    print("| point | seed | " + " | ".join(f"{s} (ms/token; over clairvoyant)" for s in SYSTEMS) + " |")
    print("|---" * (len(SYSTEMS) + 2) + "|")
    for point in points:
        for seed in seeds:
            ceiling = results[(*point, seed, "clairvoyant")]["mean"]
            means = [results[(*point, seed, s)]["mean"] for s in SYSTEMS]
            cells = [f"{1e3 * mean:.1f}; {mean / ceiling:.2f}x" for mean in means]
            print(f"| {point[0]} {point[2]}/s, {point[1]} slots | {seed} | " + " | ".join(cells) + " |")
    print("\nper kind of program (ms/token, mean over seeds):")
    for point in points:
        for system in SYSTEMS:
            kinds: dict[str, list[float]] = defaultdict(list)
            for seed in seeds:
                for kind, value in results[(*point, seed, system)]["by_kind"].items():
                    kinds[kind].append(value)
            print(f"  {point[0]} {point[2]}/s {system}: "
                  + ", ".join(f"{k} {1e3 * statistics.mean(v):.1f}" for k, v in kinds.items()))


if __name__ == "__main__":
    main()
