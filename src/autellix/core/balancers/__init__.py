"""Load balancers, one per file, behind the ``Balancer`` interface."""

from __future__ import annotations

from collections.abc import Callable

from autellix.core.balancers.autellix import LocalityBalancer
from autellix.core.balancers.base import NOTHING_CACHED, UNKNOWN_SLOTS, Balancer, NoEngine, Route, least_used_engine
from autellix.core.balancers.least_used import LeastUsedBalancer
from autellix.core.balancers.prefix_score import PrefixScoreBalancer
from autellix.core.balancers.round_robin import RoundRobinBalancer
from autellix.core.config import BALANCERS, ConfigError, SchedulerConfig

#: Each balancer name (``core.config.BALANCERS``, the one list the CLI, CRD and chart
#: show) to how it is built from the configuration; registered here once.
_BY_NAME: dict[str, Callable[[SchedulerConfig], Balancer]] = {
    "autellix": lambda config: LocalityBalancer(config.long_prompt_tokens, config.cached_tokens_per_call),
    "least_used": lambda config: LeastUsedBalancer(),
    "round_robin": lambda config: RoundRobinBalancer(),
    "prefix_score": lambda config: PrefixScoreBalancer(),
}
assert tuple(_BY_NAME) == BALANCERS


def reads_cache(config: SchedulerConfig) -> bool:
    """Whether ``config``'s balancer weighs what the engines hold (so a KV event index is worth keeping)."""
    return config.balancer == "prefix_score" or (config.balancer == "autellix" and config.cached_tokens_per_call > 0)


def balancer_from_config(config: SchedulerConfig) -> Balancer:
    try:
        build = _BY_NAME[config.balancer]
    except KeyError:
        raise ConfigError(f"unknown balancer {config.balancer!r}; expected one of {', '.join(BALANCERS)}") from None
    return build(config)


__all__ = [
    "NOTHING_CACHED",
    "UNKNOWN_SLOTS",
    "Balancer",
    "LeastUsedBalancer",
    "LocalityBalancer",
    "NoEngine",
    "PrefixScoreBalancer",
    "RoundRobinBalancer",
    "Route",
    "balancer_from_config",
    "least_used_engine",
    "reads_cache",
]
