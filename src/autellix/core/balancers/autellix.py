"""Algorithm 2: data-locality-aware load balancing, weighed against what the engines hold.

Short prompts share little beyond the system prompt, so they go wherever load is
least. Long prompts share most of their prefix with their program's earlier
calls, so they stick to the program's engine (pinned on first long call), where
its KV cache already is.

A call that is not pinned (a short one, or a program's first long one) may find
its prefix, a system prompt or tool context other programs sent, cached on some
engines (``cached``, from the KV event index). It goes to the engine where its
load less what it would not compute again is least: ``cached_tokens_per_call``
cached tokens weigh as one call in flight. So a long shared context draws its
programs to the engine that holds it until that engine is busier than the
context is worth, and with nothing cached (or the weight 0) the choice is the
paper's least-loaded one.
"""

from __future__ import annotations

from collections.abc import Mapping

from autellix.core.balancers.base import NOTHING_CACHED, Route, least_used_engine, live_pin


class LocalityBalancer:
    name = "autellix"

    def __init__(self, long_prompt_tokens: int = 2048, cached_tokens_per_call: int = 0) -> None:
        self.long_prompt_tokens = long_prompt_tokens
        #: Cached prompt tokens that weigh as much as one call in flight (0: the index is not consulted).
        self.cached_tokens_per_call = cached_tokens_per_call

    def choose(self, loads: Mapping[str, float], *, prompt_tokens: int, pinned: str | None,
               cached: Mapping[str, int] = NOTHING_CACHED) -> Route:
        pinned = live_pin(loads, pinned)
        long = prompt_tokens > self.long_prompt_tokens
        if long and pinned is not None:
            return Route(pinned, pinned)
        engine = self._unpinned(loads, cached)
        return Route(engine, engine if long else pinned)

    def _unpinned(self, loads: Mapping[str, float], cached: Mapping[str, int]) -> str:
        per_call = self.cached_tokens_per_call
        if not cached or not per_call:
            return least_used_engine(loads)
        return min(loads, key=lambda engine: (loads[engine] - cached.get(engine, 0) / per_call, loads[engine], engine))

    def weighs_cache(self, *, prompt_tokens: int, pinned: str | None) -> bool:
        return self.cached_tokens_per_call > 0 and not (prompt_tokens > self.long_prompt_tokens and pinned is not None)
