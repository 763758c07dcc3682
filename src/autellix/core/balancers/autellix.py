"""Algorithm 2: data-locality-aware load balancing, weighed against what the engines hold.

Short prompts share little beyond the system prompt, so they go wherever load is
least. Long prompts share most of their prefix with their program's earlier
calls, so they stick to the program's engine (pinned on first long call), where
its KV cache already is.

A call that is not pinned (a short one, or a program's first long one) may find
its prefix, a system prompt or tool context other programs sent, cached on some
engines (``cached``, from the KV event index). It goes to the engine where its
load less what it would not compute again is least: ``cached_tokens_per_call``
cached tokens weigh as one call in flight on an engine of ``REFERENCE_SLOTS``
slots. So a long shared context draws its programs to the engine that holds it
until that engine is busier than the context is worth, and with nothing cached
(or the weight 0) the choice is the paper's least-loaded one.

What a call in flight costs the others depends on how many calls the engine
runs at once (``slots``, vLLM's ``max_num_seqs``): on an engine of 8 slots one
more call takes an eighth of it, on one of 256 a 256th. So for a short call,
whose place pins nothing, cached tokens weigh more on a larger engine, by the
square root of its size over the reference (never less than as set; as set
where the size is unknown). A long call pins its program where it goes, and a
place chosen for its cache against the load then holds for every later call
of the program: its cached tokens weigh as set. Fitted on the simulator
(``docs/results/2026-12-06-kv-event-index.md``, section 5, and
``docs/results/2026-12-07-cached-tokens-by-engine-size.md``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from autellix.core.balancers.base import NOTHING_CACHED, UNKNOWN_SLOTS, Route, least_used_engine, live_pin

#: The engine size at which ``cached_tokens_per_call`` holds as set.
REFERENCE_SLOTS = 8


def tokens_per_call(cached_tokens_per_call: float, slots: int | None) -> float:
    """Cached tokens that weigh as one call in flight on an engine of ``slots`` (None: unknown)."""
    if slots is None or slots <= REFERENCE_SLOTS:
        return cached_tokens_per_call
    return cached_tokens_per_call * math.sqrt(REFERENCE_SLOTS / slots)


class LocalityBalancer:
    name = "autellix"

    def __init__(self, long_prompt_tokens: int = 2048, cached_tokens_per_call: int = 0) -> None:
        self.long_prompt_tokens = long_prompt_tokens
        #: Cached prompt tokens that weigh as much as one call in flight (0: the index is not consulted).
        self.cached_tokens_per_call = cached_tokens_per_call

    def choose(self, loads: Mapping[str, float], *, prompt_tokens: int, pinned: str | None,
               cached: Mapping[str, int] = NOTHING_CACHED, slots: Mapping[str, int] = UNKNOWN_SLOTS) -> Route:
        pinned = live_pin(loads, pinned)
        long = prompt_tokens > self.long_prompt_tokens
        if long and pinned is not None:
            return Route(pinned, pinned)
        # a long call pins its program where it goes: a place wrong for the load then holds for the program's life
        engine = self._unpinned(loads, cached, UNKNOWN_SLOTS if long else slots)
        return Route(engine, engine if long else pinned)

    def _unpinned(self, loads: Mapping[str, float], cached: Mapping[str, int], slots: Mapping[str, int]) -> str:
        per_call = self.cached_tokens_per_call
        if not cached or not per_call:
            return least_used_engine(loads)

        def weighed(engine: str) -> tuple[float, float, str]:
            saved = cached.get(engine, 0) / tokens_per_call(per_call, slots.get(engine))
            return loads[engine] - saved, loads[engine], engine

        return min(loads, key=weighed)

    def weighs_cache(self, *, prompt_tokens: int, pinned: str | None) -> bool:
        return self.cached_tokens_per_call > 0 and not (prompt_tokens > self.long_prompt_tokens and pinned is not None)
