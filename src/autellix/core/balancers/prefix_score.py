"""Baseline: llm-d's prefix-aware rule, each call to the best weighted sum of prefix and queue scores.

What llm-d's endpoint picker does with a precise prefix-cache index: every
call (no pins) scores each engine by the share of its prompt cached there
(the prefix-cache scorer, weight 3) and by its queue against the others'
(the queue scorer, ``(most - load) / (most - least)``, 1 when all are equal,
weight 2), and goes to the highest sum; ties to the least loaded, then the
name. llm-d's KV-utilisation scorer is left out: the loads given here are
calls in flight.
"""

from __future__ import annotations

from collections.abc import Mapping

from autellix.core.balancers.base import NOTHING_CACHED, UNKNOWN_SLOTS, NoEngine, Route, live_pin

PREFIX_WEIGHT = 3.0
QUEUE_WEIGHT = 2.0


class PrefixScoreBalancer:
    name = "prefix_score"

    def choose(self, loads: Mapping[str, float], *, prompt_tokens: int, pinned: str | None,
               cached: Mapping[str, int] = NOTHING_CACHED, slots: Mapping[str, int] = UNKNOWN_SLOTS) -> Route:
        if not loads:
            raise NoEngine("no engine is available")
        most, least = max(loads.values()), min(loads.values())

        def score(engine: str) -> float:
            queue = 1.0 if most == least else (most - loads[engine]) / (most - least)
            prefix = min(1.0, cached.get(engine, 0) / prompt_tokens) if prompt_tokens > 0 else 0.0
            return PREFIX_WEIGHT * prefix + QUEUE_WEIGHT * queue

        engine = min(loads, key=lambda e: (-score(e), loads[e], e))
        return Route(engine, live_pin(loads, pinned))

    def weighs_cache(self, *, prompt_tokens: int, pinned: str | None) -> bool:
        return True
