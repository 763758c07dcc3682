"""Baseline: every call to the least-loaded engine, no locality."""

from __future__ import annotations

from collections.abc import Mapping

from autellix.core.balancers.base import NOTHING_CACHED, UNKNOWN_SLOTS, Route, least_used_engine, live_pin


class LeastUsedBalancer:
    name = "least_used"

    def choose(self, loads: Mapping[str, float], *, prompt_tokens: int, pinned: str | None,
               cached: Mapping[str, int] = NOTHING_CACHED, slots: Mapping[str, int] = UNKNOWN_SLOTS) -> Route:
        return Route(least_used_engine(loads), live_pin(loads, pinned))

    def weighs_cache(self, *, prompt_tokens: int, pinned: str | None) -> bool:
        return False
