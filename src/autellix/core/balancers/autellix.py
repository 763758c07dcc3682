"""Algorithm 2: data-locality-aware load balancing.

Short prompts share little beyond the system prompt, so they go wherever load is
least. Long prompts share most of their prefix with their program's earlier
calls, so they stick to the program's engine (pinned on first long call), where
its KV cache already is.
"""

from __future__ import annotations

from collections.abc import Mapping

from autellix.core.balancers.base import Route, least_used_engine, live_pin


class LocalityBalancer:
    name = "autellix"

    def __init__(self, long_prompt_tokens: int = 2048) -> None:
        self.long_prompt_tokens = long_prompt_tokens

    def choose(self, loads: Mapping[str, float], *, prompt_tokens: int, pinned: str | None) -> Route:
        pinned = live_pin(loads, pinned)
        if prompt_tokens <= self.long_prompt_tokens:
            return Route(least_used_engine(loads), pinned)
        if pinned is not None:
            return Route(pinned, pinned)
        engine = least_used_engine(loads)
        return Route(engine, engine)
