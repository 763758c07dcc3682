"""Baseline: engines in turn, blind to load and locality."""

from __future__ import annotations

from collections.abc import Mapping

from autellix.core.balancers.base import NOTHING_CACHED, UNKNOWN_SLOTS, NoEngine, Route, live_pin


class RoundRobinBalancer:
    name = "round_robin"

    def __init__(self) -> None:
        self._turn = 0

    def choose(self, loads: Mapping[str, float], *, prompt_tokens: int, pinned: str | None,
               cached: Mapping[str, int] = NOTHING_CACHED, slots: Mapping[str, int] = UNKNOWN_SLOTS) -> Route:
        if not loads:
            raise NoEngine("no engine is available")
        engines = sorted(loads)
        engine = engines[self._turn % len(engines)]
        self._turn += 1
        return Route(engine, live_pin(loads, pinned))

    def weighs_cache(self, *, prompt_tokens: int, pinned: str | None) -> bool:
        return False
