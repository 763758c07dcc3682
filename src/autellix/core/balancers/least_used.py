"""Baseline: every call to the least-loaded engine, no locality."""

from __future__ import annotations

from collections.abc import Mapping

from autellix.core.balancers.base import Route, least_used_engine, live_pin


class LeastUsedBalancer:
    name = "least_used"

    def choose(self, loads: Mapping[str, float], *, prompt_tokens: int, pinned: str | None) -> Route:
        return Route(least_used_engine(loads), live_pin(loads, pinned))
