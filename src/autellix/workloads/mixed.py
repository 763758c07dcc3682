"""Mixed: an equal share of sharegpt, bfcl, lats and multi-agent programs, interleaved."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from autellix.workloads.base import AgentProgram

#: The kinds of program "mixed" interleaves ("multiagent": fanout's multi-agent programs).
MIXED_KINDS: tuple[str, ...] = ("sharegpt", "bfcl", "lats", "multiagent")

#: ``build_kind(kind, indices)``: programs ``indices`` of one single kind, with the mix's seed.
KindBuilder = Callable[[str, Sequence[int]], list[AgentProgram]]


def build(count: int, seed: int, build_kind: KindBuilder) -> list[AgentProgram]:
    """``count`` programs: each kind's share (the first ones differing by at most one),
    in blocks of four, one of each kind in a seeded order; they are the same as the
    first programs of each single kind with the same seed."""
    kinds = MIXED_KINDS
    shares = [count // len(kinds) + (1 if k < count % len(kinds) else 0) for k in range(len(kinds))]
    pools = {kind: build_kind(kind, range(n)) for kind, n in zip(kinds, shares, strict=True)}
    order = random.Random(f"{seed}:mixed")
    taken = dict.fromkeys(kinds, 0)
    out: list[AgentProgram] = []
    while len(out) < count:
        for kind in order.sample(kinds, len(kinds)):
            if taken[kind] < len(pools[kind]):
                out.append(pools[kind][taken[kind]])
                taken[kind] += 1
    return out
