"""Status of the custom resources, computed from what the cluster and the gateway report (pure)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from autellix.kube.autoscaler import EngineLoad
from autellix.kube.conditions import set_condition


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(value: str) -> datetime.datetime:
    return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


def engine_status(previous: dict[str, Any], *, desired: int, deployment: dict[str, Any] | None,
                  reconciled: tuple[bool, str, str], now: str, generation: int | None = None,
                  selector: str | None = None) -> dict[str, Any]:
    """replicas (the engine pods the Deployment has now, ready or not: what the scale subresource reports),
    readyReplicas, the pods' selector (for the scale subresource) and the Reconciled and Ready conditions
    (``n/desired engines ready``) of an AutellixEngine."""
    dep_status = (deployment or {}).get("status", {})
    ready = int(dep_status.get("readyReplicas") or 0)
    pods = int(dep_status.get("replicas") or 0)
    conditions = set_condition(previous.get("conditions"), "Reconciled", *reconciled, now, generation)
    if deployment is None and not reconciled[0]:  # the STATUS column shows why (e.g. InvalidSpec)
        conditions = set_condition(conditions, "Ready", False, reconciled[1], reconciled[2], now, generation)
    elif deployment is None:
        conditions = set_condition(conditions, "Ready", False, "NoDeployment", "The engine Deployment does not exist.",
                                   now, generation)
    elif ready >= desired:
        conditions = set_condition(conditions, "Ready", True, "EnginesReady", f"{ready}/{desired} engines ready.",
                                   now, generation)
    else:
        conditions = set_condition(conditions, "Ready", False, "EnginesStarting", f"{ready}/{desired} engines ready.",
                                   now, generation)
    out: dict[str, Any] = {"replicas": pods, "readyReplicas": ready, "conditions": conditions}
    if selector is not None:
        out["selector"] = selector
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def load_status(engines: Sequence[EngineLoad]) -> dict[str, Any]:
    """Per-engine load as the gateway reports it (the autoscaler's input)."""
    return {
        "load": round(sum(e.load for e in engines), 3),
        "engines": [{"url": e.url, "pod": e.pod or "", "load": round(e.load, 3), "inflight": e.inflight,
                     "draining": e.draining, "healthy": e.healthy} for e in engines],
    }


def session_status(entry: dict[str, Any] | None, elapsed: float | None) -> dict[str, Any]:
    """An AgentProgram's view of its session's process-table entry (GET /v1/sessions/{id})."""
    if entry is None:
        return {}
    tokens = int(entry.get("completion_tokens") or 0)
    out: dict[str, Any] = {
        "calls": int(entry.get("calls_done") or 0),
        "callsActive": int(entry.get("calls_active") or 0),
        "attainedService": round(float(entry.get("service") or 0.0), 6),
        "waiting": round(float(entry.get("waiting") or 0.0), 6),
        "promptTokens": int(entry.get("prompt_tokens") or 0),
        "completionTokens": tokens,
    }
    if elapsed is not None and tokens:
        # The paper's metric: program response time / tokens the program generated.
        out["programTokenLatency"] = round(elapsed / tokens, 6)
    return out
