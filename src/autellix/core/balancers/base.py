"""The tiny interface every load balancer implements.

Engine load is an input (running + waiting calls, as the gateway measures it);
nothing here fetches it. A balancer returns the engine for one call and the
engine its program is pinned to afterwards, which the caller stores in the
process table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol


class NoEngine(LookupError):
    """The pool is empty: no engine can take the call."""


class Route(NamedTuple):
    engine: str
    #: The program's pin after this call (None: not pinned).
    pin: str | None


class Balancer(Protocol):
    name: str

    def choose(self, loads: Mapping[str, float], *, prompt_tokens: int, pinned: str | None) -> Route: ...


def least_used_engine(loads: Mapping[str, float]) -> str:
    """The engine with the least load; ties go to the smallest name (deterministic)."""
    if not loads:
        raise NoEngine("no engine is available")
    return min(loads, key=lambda engine: (loads[engine], engine))


def live_pin(loads: Mapping[str, float], pinned: str | None) -> str | None:
    """A pin to an engine that left the pool is no pin at all."""
    return pinned if pinned in loads else None
