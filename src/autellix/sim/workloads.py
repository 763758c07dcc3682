"""Programs for the simulator: the paper's toy figures and a seeded generator.

A program is a DAG of calls; a call is issued the moment all calls it depends
on have finished (a chain is a single-threaded program). Lengths are decode
steps: one unit of work per batch step.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CallSpec:
    call_id: str
    steps: int
    deps: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProgramSpec:
    program_id: str
    arrival: float
    calls: tuple[CallSpec, ...]

    @property
    def tokens(self) -> int:
        return sum(c.steps for c in self.calls)


def chain(program_id: str, steps: list[int], arrival: float = 0.0) -> ProgramSpec:
    """A single-threaded program: each call waits for the one before it."""
    calls = tuple(
        CallSpec(f"{program_id}{i + 1}", s, (f"{program_id}{i}",) if i else ()) for i, s in enumerate(steps)
    )
    return ProgramSpec(program_id, arrival, calls)


def figure2() -> list[ProgramSpec]:
    """Paper Figure 2: four programs at t=0, batch size 2."""
    return [chain("A", [4, 3, 1, 1]), chain("B", [3, 3, 4]), chain("C", [1, 2]), chain("D", [4])]


def figure9() -> list[ProgramSpec]:
    """Paper Figure 9: one DAG program; root 2, then 1, 4, 2, 5 in parallel,
    a 4 after the 1 and the 4, and a final 1 after that 4, the 2 and the 5."""
    calls = (
        CallSpec("root", 2),
        CallSpec("a", 1, ("root",)),
        CallSpec("b", 4, ("root",)),
        CallSpec("c", 2, ("root",)),
        CallSpec("d", 5, ("root",)),
        CallSpec("e", 4, ("a", "b")),
        CallSpec("end", 1, ("e", "c", "d")),
    )
    return [ProgramSpec("P", 0.0, calls)]


def random_programs(
    seed: int,
    programs: int = 20,
    *,
    rate: float | None = None,
    max_calls: int = 8,
    max_steps: int = 12,
    threaded_share: float = 0.5,
) -> list[ProgramSpec]:
    """Seeded mix of single-threaded chains and fork-join DAGs.

    ``rate``: Poisson arrivals (programs per unit time); None = all at t=0.
    Lengths are heavy-tailed (a few long calls), as agent workloads are.
    """
    rng = random.Random(seed)
    t = 0.0
    out: list[ProgramSpec] = []

    def length() -> int:
        return min(max_steps, max(1, int(rng.paretovariate(1.2))))

    for p in range(programs):
        pid = f"p{p}"
        if rate:
            t += rng.expovariate(rate)
        n = rng.randint(1, max_calls)
        if rng.random() < threaded_share and n >= 3:
            out.append(ProgramSpec(pid, round(t, 3), _fork_join(pid, n, rng, length)))
        else:
            out.append(chain(pid, [length() for _ in range(n)], round(t, 3)))
    return out


def _fork_join(pid: str, n: int, rng: random.Random, length: Callable[[], int]) -> tuple[CallSpec, ...]:
    """Layers of parallel calls; each layer waits for the whole previous one."""
    calls: list[CallSpec] = []
    previous: tuple[str, ...] = ()
    while len(calls) < n:
        width = min(n - len(calls), rng.randint(1, 4))
        layer = tuple(f"{pid}.{len(calls) + i}" for i in range(width))
        calls.extend(CallSpec(cid, length(), previous) for cid in layer)
        previous = layer
    return tuple(calls)


WORKLOADS: dict[str, Callable[[int], list[ProgramSpec]]] = {
    "figure2": lambda seed: figure2(),
    "figure9": lambda seed: figure9(),
    "random": lambda seed: random_programs(seed),
}
