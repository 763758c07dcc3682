"""Load balancers, one per file, behind the ``Balancer`` interface."""

from __future__ import annotations

from autellix.core.balancers.autellix import LocalityBalancer
from autellix.core.balancers.base import Balancer, NoEngine, Route, least_used_engine
from autellix.core.balancers.least_used import LeastUsedBalancer
from autellix.core.balancers.round_robin import RoundRobinBalancer
from autellix.core.config import BALANCERS, ConfigError, SchedulerConfig


def balancer_from_config(config: SchedulerConfig) -> Balancer:
    if config.balancer == "autellix":
        return LocalityBalancer(config.long_prompt_tokens)
    if config.balancer == "least_used":
        return LeastUsedBalancer()
    if config.balancer == "round_robin":
        return RoundRobinBalancer()
    raise ConfigError(f"unknown balancer {config.balancer!r}; expected one of {', '.join(BALANCERS)}")


__all__ = [
    "Balancer",
    "LeastUsedBalancer",
    "LocalityBalancer",
    "NoEngine",
    "RoundRobinBalancer",
    "Route",
    "balancer_from_config",
    "least_used_engine",
]
