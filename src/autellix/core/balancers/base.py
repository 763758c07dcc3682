"""The tiny interface every load balancer implements.

Engine load is an input (running + waiting calls, as the gateway measures it),
and so is what each engine holds of the call's prompt (``cached``: the tokens
of its longest cached prefix, from the KV event index ``core.PrefixIndex``;
empty when there is no index), and each engine's size (``slots``: the calls it
runs at once, vLLM's ``max_num_seqs``; empty when unknown); nothing here fetches
any of them. A balancer returns
the engine for one call and the engine its program is pinned to afterwards,
which the caller stores in the process table.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple, Protocol

#: No engine holds any of the call's prompt (or nothing is known of it).
NOTHING_CACHED: Mapping[str, int] = MappingProxyType({})
#: No engine's size is known.
UNKNOWN_SLOTS: Mapping[str, int] = MappingProxyType({})


class NoEngine(LookupError):
    """The pool is empty: no engine can take the call."""


class Route(NamedTuple):
    engine: str
    #: The program's pin after this call (None: not pinned).
    pin: str | None


class Balancer(Protocol):
    name: str

    def choose(self, loads: Mapping[str, float], *, prompt_tokens: int, pinned: str | None,
               cached: Mapping[str, int] = NOTHING_CACHED, slots: Mapping[str, int] = UNKNOWN_SLOTS) -> Route:
        """The engine for one call of ``prompt_tokens`` among ``loads``' engines, and its program's pin after it.

        ``pinned``: the program's pin before the call; ``cached``: per engine, the tokens of the call's
        prompt it holds from the start (engines not named hold none); ``slots``: per engine, the calls it
        runs at once (engines not named: unknown). Raises ``NoEngine`` when ``loads`` is empty."""
        ...

    def weighs_cache(self, *, prompt_tokens: int, pinned: str | None) -> bool:
        """Whether ``choose`` would weigh ``cached`` for such a call: the caller looks the prompt up only then
        (hashing a long prompt costs about a millisecond)."""
        ...


def least_used_engine(loads: Mapping[str, float]) -> str:
    """The engine with the least load; ties go to the smallest name (deterministic)."""
    if not loads:
        raise NoEngine("no engine is available")
    return min(loads, key=lambda engine: (loads[engine], engine))


def live_pin(loads: Mapping[str, float], pinned: str | None) -> str | None:
    """A pin to an engine that left the pool is no pin at all."""
    return pinned if pinned in loads else None
