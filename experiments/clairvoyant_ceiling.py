"""How far below llm-d's mean any order of programs can go: a clairvoyant ceiling at the overloaded points.

    nice -n 5 .venv/bin/python experiments/clairvoyant_ceiling.py [--jobs 2]

At each overloaded point of the simulator's check (A100 profile, seeds 1-3) it
runs llm-d's rule (``llmd-fairness``) and autellix, and then a scheduler no
real system can be: smallest program first, with every program's whole work
known before it starts. Pass one runs the point and records each program's
total model time and generated tokens (a subagent counts in its root
program); pass two runs the same programs again, each call carrying as its
``service`` its program's key, into the engine plugin's preemptive
multi-level queue with 103 levels 1.25x apart (so the key's order is kept),
no anti-starvation and no committed service. The engine keeps the largest
service a program's calls have carried, so the key is the one at its first
call: the program's whole size. Two keys:

* ``smith``: total model time x the program's generated tokens. Mean program
  token latency is the mean of response time / tokens, a weighted mean
  response time with weight 1/tokens, and Smith's rule orders by size / weight;
* ``size``: total model time alone.

Nothing here is a system to ship: it says which targets an order of programs
can reach at all. It prints llm-d's mean over each system's, per seed and the
geometric mean, and each clairvoyant order's P99 over autellix's. About 5
minutes on two cores.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import autellix.sim.serving as serving
from autellix.core import ProcessTable, SchedulerConfig
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.sweep import CHECK_LOADS, _run

PROFILE = "a100-llama3.1-8b"
#: The check's overloaded points (vllm-opt at 3x or more its unloaded latency, as in
#: ``autellix_vs_llmd.py``) on mixed, fan-out and tool-pause.
POINTS = ((32, "mixed", 0.8), (32, "mixed", 1.2), (32, "fanout", 2.0), (32, "tool-pause", 3.0),
          (256, "mixed", 1.6), (256, "fanout", 2.0), (256, "fanout", 4.0), (256, "tool-pause", 4.0),
          (256, "tool-pause", 6.0))
SEEDS = (1, 2, 3)
KEYS = ("smith", "size")
#: Levels 1.25x apart from 1 ms to 10^7: fine enough that the key's order is the queue's order.
FINE_LEVELS = SchedulerConfig(boundaries=tuple(1e-3 * 1.25**i for i in range(103)), beta=math.inf)


def root(program_id: str) -> str:
    """A subagent's program (``root/name``) counts in its root's work."""
    return program_id.split("/", 1)[0]


@dataclass
class Clairvoyance:
    """What pass one learns of each program, and what pass two has served of it."""

    key: str
    learning: bool = True
    model_time: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    served: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def finished(self, program_id: str, model_time: float, output_tokens: int) -> None:
        if self.learning:
            self.model_time[root(program_id)] += model_time
            self.tokens[root(program_id)] += output_tokens
        else:
            self.served[root(program_id)] += model_time

    def rank(self, program_id: str) -> float:
        """The service a call carries in pass two: its program's key (lower first)."""
        r = root(program_id)
        remaining = max(self.model_time[r] - self.served[r], 1e-3)
        return remaining * self.tokens[r] if self.key == "smith" else remaining


@contextmanager
def clairvoyant(seen: Clairvoyance) -> Iterator[None]:
    """Every call's outcome reported to ``seen``; in pass two, every call carries ``seen.rank``."""
    call, request = serving.SimGateway.call, serving.SimRequest

    async def observed_call(self: serving.SimGateway, program_id: str, *args: Any, **kwargs: Any) -> Any:
        outcome = await call(self, program_id, *args, **kwargs)
        seen.finished(program_id, outcome.model_time, outcome.output_tokens)
        return outcome

    def ranked_request(*args: Any, **kwargs: Any) -> Any:
        if not seen.learning and kwargs.get("program_id") is not None:
            kwargs |= {"service": seen.rank(kwargs["program_id"]), "tree": None}
        return request(*args, **kwargs)

    def no_commitment(self: ProcessTable, in_flight: int) -> float:
        return 0.0 if not seen.learning else commitment(self, in_flight)

    commitment = ProcessTable._commitment
    serving.SimGateway.call, serving.SimRequest = observed_call, ranked_request  # type: ignore[method-assign,misc]
    ProcessTable._commitment = no_commitment  # type: ignore[method-assign]
    try:
        yield
    finally:
        serving.SimGateway.call, serving.SimRequest = call, request  # type: ignore[method-assign,misc]
        ProcessTable._commitment = commitment  # type: ignore[method-assign]


def run(task: tuple[int, str, float, int, str]) -> tuple[tuple[int, str, float, int, str], dict[str, Any]]:
    slots, workload, rate, seed, system = task
    load = CHECK_LOADS[slots][workload]
    profile = EngineProfile.load(PROFILE).with_overrides(max_num_seqs=slots)

    def once(name: str, config: SchedulerConfig) -> dict[str, Any]:
        return _run(workload, load, rate, profile=profile, system=name, engines=1, config=config, seed=seed,
                    index=load.rates.index(rate))

    if system in KEYS:
        seen = Clairvoyance(system)
        with clairvoyant(seen):
            once("autellix-no-admission", SchedulerConfig())
            seen.learning = False
            return task, once("autellix-no-admission", FINE_LEVELS)
    return task, once(system, SchedulerConfig())


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
    systems = ("llmd-fairness", "autellix", *KEYS)
    tasks = [(n, w, r, seed, s) for n, w, r in POINTS for seed in SEEDS for s in systems]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results: Results = dict(pool.map(run, tasks))
    print("| slots | workload | rate | llm-d / autellix, mean (seeds; geomean) | llm-d / clairvoyant smith "
          "| llm-d / clairvoyant size | P99 over autellix's: smith, size |")
    print("|---|---|---|---|---|---|---|")
    for point in POINTS:
        tails = [1 / statistics.geometric_mean(ratios(results, point, key, "p99_token_latency", over="autellix"))
                 for key in KEYS]
        print(f"| {point[0]} | {point[1]} | {point[2]} | {cell(ratios(results, point, 'autellix'))} | "
              f"{cell(ratios(results, point, 'smith'))} | {cell(ratios(results, point, 'size'))} | "
              f"{tails[0]:.2f}, {tails[1]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
