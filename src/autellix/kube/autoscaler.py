"""The autoscaler's decision (pure): replicas from a history of engine load.

Rule: each sample recommends ``ceil(total load / target load per engine)``
engines, clamped to [min, max]. As Kubernetes' HPA does with its stabilisation
windows, scaling up takes the *smallest* recommendation of the last
``scale_up_window`` seconds (a load spike must last the window before engines
are added) and scaling down the *largest* recommendation of the last
``scale_down_window`` seconds (a lull must last the window before engines go).
So after a scale-up nothing is removed within the scale-down window, and after
a scale-down nothing is added within the scale-up window: it cannot flap. A lull
counts only once it was watched for the whole window: an operator that has just
taken the lead (or missed samples for longer than the windows) knows nothing of
the load before, and scales down no sooner than a window after it began to watch.

Scale-down never kills an engine with work: the plan first asks the gateway to
drain the least-loaded engines (no new calls go to them) and removes an engine
only once the gateway reports it draining with nothing running, waiting or in
flight. Replicas the gateway does not see (a pod starting, or being replaced)
go first, by lowering spec.replicas alone: draining a seen engine in their place
could leave the gateway with no engine that takes calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autellix.kube.spec import Autoscaling


@dataclass(frozen=True)
class Sample:
    """Total load (running + waiting calls over all engines) at a time (seconds)."""

    time: float
    total_load: float


@dataclass(frozen=True)
class EngineLoad:
    """One engine as the gateway sees it."""

    url: str
    load: float
    inflight: int = 0
    draining: bool = False
    healthy: bool = True
    #: The engine's pod (from its EndpointSlice), for the scale-down.
    pod: str | None = None

    @property
    def idle(self) -> bool:
        return self.load <= 0 and self.inflight <= 0


@dataclass(frozen=True)
class ScalePlan:
    #: What spec.replicas becomes now.
    replicas: int
    #: Engines to stop sending new calls to (gateway drain).
    drain: tuple[str, ...] = ()
    #: Engines drained earlier that are needed again.
    undrain: tuple[str, ...] = ()
    #: Drained, idle engines whose pods go now.
    remove: tuple[EngineLoad, ...] = ()


def clamp(replicas: int, policy: Autoscaling) -> int:
    return min(max(replicas, policy.min_replicas), policy.max_replicas)


def recommend(total_load: float, policy: Autoscaling) -> int:
    """Engines needed for ``total_load`` at ``target_load`` calls each, within [min, max]."""
    return clamp(math.ceil(max(total_load, 0.0) / policy.target_load - 1e-9), policy)


def desired_replicas(history: Sequence[Sample], current: int, policy: Autoscaling, now: float,
                     since: float = -math.inf) -> int:
    """Replicas to run now, from the samples up to ``now`` (the latest should be at ``now``), taken
    since ``since``: before then nothing was watched, so no scale-down until a whole window was."""
    current = clamp(current, policy)
    recent = [s for s in history if s.time <= now]
    if not recent:
        return current
    latest = max(s.time for s in recent)
    up = [recommend(s.total_load, policy) for s in recent if s.time >= now - policy.scale_up_window or s.time == latest]
    down = [recommend(s.total_load, policy) for s in recent
            if s.time >= now - policy.scale_down_window or s.time == latest]
    if min(up) > current:
        return min(up)
    if max(down) < current and now - since >= policy.scale_down_window:
        return max(down)
    return current


def trim(history: Sequence[Sample], policy: Autoscaling, now: float) -> list[Sample]:
    """The samples a later decision can still use."""
    keep = max(policy.scale_up_window, policy.scale_down_window)
    return [s for s in history if s.time >= now - keep]


@dataclass
class LoadHistory:
    """One engine's load samples within the windows, and since when they were taken without a gap."""

    since: float
    samples: list[Sample] = field(default_factory=list)

    def add(self, sample: Sample, policy: Autoscaling) -> None:
        """Keep ``sample``; after a gap longer than the windows (no lead, a stalled pass) the watch begins again."""
        self.samples = trim(self.samples, policy, sample.time)
        if not self.samples:
            self.since = sample.time
        self.samples.append(sample)


def plan(current: int, desired: int, engines: Sequence[EngineLoad]) -> ScalePlan:
    """How to move from ``current`` replicas toward ``desired`` given the engines seen now."""
    draining = [e for e in engines if e.draining]
    if desired >= current:
        return ScalePlan(replicas=desired, undrain=tuple(e.url for e in draining))
    # Replicas the gateway does not see (a pod starting, or being replaced) take no calls: they go first,
    # as spec.replicas falls (a ReplicaSet deletes pods that are not ready before ready ones). Draining
    # one the gateway sees instead could leave it with none that takes calls.
    unseen = min(current - desired, max(current - len(engines), 0))
    excess = current - desired - unseen
    # Keep draining the emptiest of those already draining; cancel the rest.
    keep = sorted(draining, key=lambda e: (not e.idle, e.load, e.inflight, e.url))[:excess]
    kept = {e.url for e in keep}
    undrain = tuple(e.url for e in draining if e.url not in kept)
    # Then drain the least-loaded others (an unhealthy engine serves nothing: first).
    others = sorted((e for e in engines if not e.draining),
                    key=lambda e: (e.healthy, e.load, e.inflight, e.url))
    drain = tuple(e.url for e in others[: excess - len(keep)])
    remove = tuple(e for e in keep if e.idle)
    return ScalePlan(replicas=current - unseen - len(remove), drain=drain, undrain=undrain, remove=remove)


def external_autoscalers(hpas: Iterable[Mapping[str, Any]], engine: str, group: str) -> list[str]:
    """The HorizontalPodAutoscalers (KEDA's ScaledObjects make one each) whose target is the AutellixEngine
    ``engine``: while any exists the built-in autoscaler stands down, so the two never fight over
    spec.replicas."""
    found = []
    for hpa in hpas:
        target = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        if target.get("kind") == "AutellixEngine" and target.get("name") == engine and \
                str(target.get("apiVersion", "")).split("/")[0] == group:
            found.append(str(hpa.get("metadata", {}).get("name")))
    return sorted(found)
