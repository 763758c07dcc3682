"""The one typed model of Autellix's scheduling parameters.

CLI flags, the gateway, the engine plugin, the CRD spec and the chart values all
name and default a parameter here, once. Standard library only: the policy core
imports nothing from outside it.

Units
-----
* ``service`` (attained service, queue boundaries): seconds of model execution
  time on a real engine; one unit per batch step in the unit-cost simulator.
* ``quanta``: scheduler steps (one decode step, i.e. one token per running call).
* ``beta``: dimensionless, (wait / service) ratio that triggers a promotion.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from itertools import pairwise
from typing import Any

POLICIES = ("atlas", "plas", "mlfq", "fcfs")
BALANCERS = ("autellix", "least_used", "round_robin", "prefix_score")


class ConfigError(ValueError):
    """A scheduling parameter is out of range or malformed."""


def _floats(value: Any, name: str) -> tuple[float, ...]:
    if isinstance(value, str):
        value = [v for v in value.replace(" ", "").split(",") if v]
    try:
        return tuple(float(v) for v in value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}: expected a list of numbers, got {value!r}") from exc


#: The default queue boundaries: 0.1 s, then three per doubling up to 258 s (four significant digits).
DEFAULT_BOUNDARIES: tuple[float, ...] = tuple(float(f"{0.1 * 2 ** (i / 3):.4g}") for i in range(35))


@dataclass(frozen=True)
class SchedulerConfig:
    """Policy, queues, anti-starvation and load-balancing parameters.

    Defaults (the paper publishes none; docs/scheduling.md gives the reasoning
    and the simulator sweeps that chose them): 36 queues split at 0.1 s of
    attained service and then three per doubling up to 258 s (``DEFAULT_BOUNDARIES``,
    2^(1/3) = 1.26x apart, so programs whose service or declared size differ by a
    quarter are told apart across more than three orders of magnitude),
    unbounded quanta (a call is never demoted while it runs: demotion made
    the engine preempt calls that a newcomer gains little from), beta = 4 and
    a backlog factor of 3.
    """

    policy: str = "atlas"
    #: Lower bounds of Q2..QK in service units; Q1 starts at 0, QK ends at inf.
    boundaries: tuple[float, ...] = DEFAULT_BOUNDARIES
    #: Steps a call may run in each queue before it is demoted; one per queue.
    #: All unbounded (the default: a call keeps its queue until it finishes)
    #: fits any number of queues, so boundaries alone may be changed.
    quanta: tuple[float, ...] = (math.inf,) * (len(DEFAULT_BOUNDARIES) + 1)
    #: Promote a call to Q1 when (program wait + call wait) /
    #: (program service + call model time) reaches the starvation bound: beta,
    #: or the backlog's own ratio when that is higher (``mlq.backlog_ratio``).
    #: ``inf`` disables anti-starvation.
    beta: float = 4.0
    #: Under a light backlog the bound is this many times the backlog's ratio,
    #: when that is under beta (``QueueSpec.starvation_bound``): a program that
    #: has waited this many times as long for its service as the queued programs
    #: together is promoted before it reaches beta. At least 1; ``inf``: the
    #: bound is never under beta.
    backlog_factor: float = 3.0
    #: Load balancer: ``autellix`` (Algorithm 2), ``least_used``, ``round_robin``, or ``prefix_score``
    #: (llm-d's rule: prefix and queue scores, a baseline).
    balancer: str = "autellix"
    #: Calls with more prompt tokens than this stick to their program's engine.
    long_prompt_tokens: int = 2048
    #: Algorithm 2: prompt tokens an engine holds (the KV event index) that weigh as one call in flight
    #: when a call that is not pinned is placed, on an engine of 8 slots (a short call's weigh more on a
    #: larger engine: ``core.balancers.autellix``); 0: the index is not consulted (least load alone).
    cached_tokens_per_call: int = 256
    #: A program with no call for this long (seconds) is dropped from the table.
    program_idle_ttl: float = 600.0
    #: Engine plugin: re-plan the queues every N steps (1 = every step).
    multi_step: int = 1
    #: Engine plugin: running calls it may preempt per planning step so that
    #: better-ranked waiting calls run (0: never; vLLM still preempts when KV
    #: blocks run out). ``core.preemption.PreemptionRule`` says which ones.
    max_preemptions: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "boundaries", _floats(self.boundaries, "boundaries"))
        object.__setattr__(self, "quanta", _floats(self.quanta, "quanta"))
        if self.policy not in POLICIES:
            raise ConfigError(f"policy: expected one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.balancer not in BALANCERS:
            raise ConfigError(f"balancer: expected one of {', '.join(BALANCERS)}, got {self.balancer!r}")
        bounds = self.boundaries
        if self.quanta and all(math.isinf(q) for q in self.quanta) and len(self.quanta) != len(bounds) + 1:
            object.__setattr__(self, "quanta", (math.inf,) * (len(bounds) + 1))
        if any(not b > 0 for b in bounds) or any(a >= b for a, b in pairwise(bounds)):
            raise ConfigError(f"boundaries: expected strictly increasing positive numbers, got {list(bounds)}")
        if len(self.quanta) != len(bounds) + 1:
            raise ConfigError(
                f"quanta: expected {len(bounds) + 1} values (one per queue, {len(bounds)} boundaries), "
                f"got {len(self.quanta)}"
            )
        if any(not q > 0 for q in self.quanta):
            raise ConfigError(f"quanta: expected positive numbers, got {list(self.quanta)}")
        if not self.beta > 0:
            raise ConfigError(f"beta: expected a positive number or inf, got {self.beta}")
        if not self.backlog_factor >= 1:
            raise ConfigError(f"backlog_factor: expected a number >= 1 or inf, got {self.backlog_factor}")
        if self.long_prompt_tokens < 0:
            raise ConfigError(f"long_prompt_tokens: expected >= 0, got {self.long_prompt_tokens}")
        if self.cached_tokens_per_call < 0:
            raise ConfigError(f"cached_tokens_per_call: expected >= 0, got {self.cached_tokens_per_call}")
        if not self.program_idle_ttl > 0:
            raise ConfigError(f"program_idle_ttl: expected > 0 seconds, got {self.program_idle_ttl}")
        if self.multi_step < 1:
            raise ConfigError(f"multi_step: expected >= 1, got {self.multi_step}")
        if self.max_preemptions < 0:
            raise ConfigError(f"max_preemptions: expected >= 0, got {self.max_preemptions}")

    @property
    def num_queues(self) -> int:
        return len(self.quanta)

    def with_overrides(self, **changes: Any) -> SchedulerConfig:
        """A copy with the given fields replaced; ``None`` values are ignored."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SchedulerConfig:
        """Build from a dict (CRD spec, chart values, JSON); unknown keys are errors."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown scheduler parameter(s): {', '.join(unknown)}")
        return cls(**{k: _coerce(k, v) for k, v in data.items()})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, prefix: str = "AUTELLIX_") -> SchedulerConfig:
        """Read ``AUTELLIX_POLICY``, ``AUTELLIX_BETA``, ``AUTELLIX_QUANTA=64,128,...``, etc."""
        environ = os.environ if environ is None else environ
        data = {f.name: environ[prefix + f.name.upper()] for f in fields(cls) if prefix + f.name.upper() in environ}
        return cls.from_mapping(data)

    def to_mapping(self) -> dict[str, Any]:
        """JSON-friendly form (``inf`` as the string "inf")."""
        def plain(v: Any) -> Any:
            if isinstance(v, tuple):
                return [plain(x) for x in v]
            if isinstance(v, float) and math.isinf(v):
                return "inf"
            return v

        return {k: plain(v) for k, v in asdict(self).items()}

    def to_env(self, prefix: str = "AUTELLIX_") -> dict[str, str]:
        out = {}
        for k, v in self.to_mapping().items():
            out[prefix + k.upper()] = ",".join(map(str, v)) if isinstance(v, list) else str(v)
        return out


_INTS = {"long_prompt_tokens", "cached_tokens_per_call", "multi_step", "max_preemptions"}
_FLOATS = {"beta", "backlog_factor", "program_idle_ttl"}


def _coerce(name: str, value: Any) -> Any:
    try:
        if name in _INTS:
            return int(value)
        if name in _FLOATS:
            return float(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}: expected a number, got {value!r}") from exc
    return value


DEFAULT_CONFIG = SchedulerConfig()
__all__ = ["BALANCERS", "DEFAULT_CONFIG", "POLICIES", "ConfigError", "SchedulerConfig"]
