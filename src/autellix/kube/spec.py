"""AutellixEngine and AgentProgram specs: parsed, defaulted and checked.

The CRD's OpenAPI schema rejects most bad specs at the API server; these
functions check again (CEL rules need Kubernetes 1.25+, and an object written
before a schema change may still be stored) and are what the operator builds
manifests from. A bad spec raises ``SpecError`` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autellix.core import ConfigError, SchedulerConfig

#: The engine image the operator runs when a spec names none (engine-image/Dockerfile).
DEFAULT_ENGINE_IMAGE = "ghcr.io/autellix/autellix-engine:0.1.0"
#: Scheduler parameters an engine uses; the gateway's own ones (balancer, ...) live in the chart values.
ENGINE_SCHEDULER_FIELDS = ("policy", "boundaries", "quanta", "beta", "multi_step")
MAX_REPLICAS = 64


class SpecError(ValueError):
    """A custom resource's spec is invalid; the message names the field."""


@dataclass(frozen=True)
class ModelSource:
    """Exactly one of: a path in the image, a PVC (and a path in it), a hub id the pod downloads."""

    path: str | None = None
    pvc: str | None = None
    pvc_path: str = ""
    hub: str | None = None


@dataclass(frozen=True)
class Autoscaling:
    enabled: bool = False
    min_replicas: int = 1
    max_replicas: int = 4
    #: Calls (running + waiting) per engine the autoscaler aims for.
    target_load: float = 8.0
    scale_up_window: float = 30.0
    scale_down_window: float = 300.0


@dataclass(frozen=True)
class EngineSpec:
    served_name: str
    source: ModelSource
    image: str = DEFAULT_ENGINE_IMAGE
    image_pull_policy: str = "IfNotPresent"
    gpus: int = 0
    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)
    vllm_args: tuple[str, ...] = ()
    env: tuple[dict[str, Any], ...] = ()
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    replicas: int = 1
    autoscaling: Autoscaling = field(default_factory=Autoscaling)
    termination_grace_seconds: int = 120

    @property
    def model_arg(self) -> str:
        """What ``--model`` gets inside the pod."""
        if self.source.pvc is not None:
            return "/models/" + self.source.pvc_path.strip("/") if self.source.pvc_path.strip("/") else "/models"
        return self.source.path or self.source.hub or ""

    @property
    def desired_replicas(self) -> int:
        """spec.replicas, kept inside the autoscaler's bounds when it is on."""
        if self.autoscaling.enabled:
            return min(max(self.replicas, self.autoscaling.min_replicas), self.autoscaling.max_replicas)
        return self.replicas


@dataclass(frozen=True)
class ProgramSpec:
    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[dict[str, Any], ...] = ()
    model: str | None = None
    #: The gateway's base URL (without /v1); None: the operator's default.
    gateway: str | None = None
    timeout_seconds: int | None = None
    backoff_limit: int = 0
    api_key_secret: tuple[str, str] | None = None


def _get(spec: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    value = spec.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise SpecError(f"{where}{key}: expected a number, got {value!r}")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise SpecError(f"{where}{key}: expected {names}, got {value!r}")
    return value


def _strings(spec: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    values = _get(spec, key, list, where, [])
    if not all(isinstance(v, str) for v in values):
        raise SpecError(f"{where}{key}: expected a list of strings, got {values!r}")
    return tuple(values)


def _env(spec: Mapping[str, Any], where: str) -> tuple[dict[str, Any], ...]:
    entries = _get(spec, "env", list, where, [])
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise SpecError(f"{where}env: every entry needs a name, got {entry!r}")
    return tuple(dict(e) for e in entries)


def _model_source(model: Mapping[str, Any]) -> ModelSource:
    source = _get(model, "source", dict, "spec.model.", {})
    given = [k for k in ("path", "pvc", "hub") if source.get(k) is not None]
    if len(given) != 1:
        raise SpecError(f"spec.model.source: set exactly one of path, pvc, hub (got {', '.join(given) or 'none'})")
    if given == ["pvc"]:
        pvc = _get(source, "pvc", dict, "spec.model.source.")
        claim = _get(pvc, "claimName", str, "spec.model.source.pvc.")
        if not claim:
            raise SpecError("spec.model.source.pvc.claimName: required")
        return ModelSource(pvc=claim, pvc_path=_get(pvc, "path", str, "spec.model.source.pvc.", ""))
    value = _get(source, given[0], str, "spec.model.source.")
    if not value:
        raise SpecError(f"spec.model.source.{given[0]}: must not be empty")
    return ModelSource(**{given[0]: value})


def _scheduler(spec: Mapping[str, Any]) -> SchedulerConfig:
    raw = _get(spec, "scheduler", dict, "spec.", {})
    unknown = sorted(set(raw) - set(ENGINE_SCHEDULER_FIELDS))
    if unknown:
        raise SpecError(f"spec.scheduler: unknown parameter(s) {', '.join(unknown)}; "
                        f"expected {', '.join(ENGINE_SCHEDULER_FIELDS)}")
    try:
        return SchedulerConfig.from_mapping(raw)
    except (ConfigError, TypeError) as exc:
        raise SpecError(f"spec.scheduler.{exc}") from None


def _autoscaling(spec: Mapping[str, Any]) -> Autoscaling:
    raw = _get(spec, "autoscaling", dict, "spec.", {})
    where = "spec.autoscaling."
    default = Autoscaling()
    result = Autoscaling(
        enabled=_get(raw, "enabled", bool, where, default.enabled),
        min_replicas=_get(raw, "minReplicas", int, where, default.min_replicas),
        max_replicas=_get(raw, "maxReplicas", int, where, default.max_replicas),
        target_load=float(_get(raw, "targetLoad", (int, float), where, default.target_load)),
        scale_up_window=float(_get(raw, "scaleUpWindowSeconds", (int, float), where, default.scale_up_window)),
        scale_down_window=float(_get(raw, "scaleDownWindowSeconds", (int, float), where, default.scale_down_window)),
    )
    if not 1 <= result.min_replicas <= result.max_replicas <= MAX_REPLICAS:
        raise SpecError(f"{where}minReplicas/maxReplicas: expected 1 <= minReplicas <= maxReplicas <= {MAX_REPLICAS}, "
                        f"got {result.min_replicas} and {result.max_replicas}")
    if not result.target_load > 0:
        raise SpecError(f"{where}targetLoad: expected > 0 calls per engine, got {result.target_load}")
    if result.scale_up_window < 0 or result.scale_down_window < 0:
        raise SpecError(f"{where}scaleUpWindowSeconds/scaleDownWindowSeconds: expected >= 0")
    return result


def parse_engine(spec: Mapping[str, Any]) -> EngineSpec:
    """An AutellixEngine's spec, defaulted; ``SpecError`` names the first bad field."""
    model = _get(spec, "model", dict, "spec.", None)
    if model is None:
        raise SpecError("spec.model: required")
    served = _get(model, "name", str, "spec.model.", "")
    if not served:
        raise SpecError("spec.model.name: required (the served model name clients ask for)")
    resources = _get(spec, "resources", dict, "spec.", {})
    gpus = _get(resources, "gpus", int, "spec.resources.", 0)
    if gpus < 0:
        raise SpecError(f"spec.resources.gpus: expected >= 0, got {gpus}")
    replicas = _get(spec, "replicas", int, "spec.", 1)
    if not 0 <= replicas <= MAX_REPLICAS:
        raise SpecError(f"spec.replicas: expected 0..{MAX_REPLICAS}, got {replicas}")
    grace = _get(spec, "terminationGracePeriodSeconds", int, "spec.", 120)
    if grace < 0:
        raise SpecError(f"spec.terminationGracePeriodSeconds: expected >= 0, got {grace}")
    return EngineSpec(
        served_name=served,
        source=_model_source(model),
        image=_get(spec, "image", str, "spec.", DEFAULT_ENGINE_IMAGE) or DEFAULT_ENGINE_IMAGE,
        image_pull_policy=_get(spec, "imagePullPolicy", str, "spec.", "IfNotPresent"),
        gpus=gpus,
        requests={k: str(v) for k, v in _get(resources, "requests", dict, "spec.resources.", {}).items()},
        limits={k: str(v) for k, v in _get(resources, "limits", dict, "spec.resources.", {}).items()},
        vllm_args=_strings(spec, "vllmArgs", "spec."),
        env=_env(spec, "spec."),
        scheduler=_scheduler(spec),
        replicas=replicas,
        autoscaling=_autoscaling(spec),
        termination_grace_seconds=grace,
    )


def parse_program(spec: Mapping[str, Any]) -> ProgramSpec:
    """An AgentProgram's spec, defaulted; ``SpecError`` names the first bad field."""
    image = _get(spec, "image", str, "spec.", "")
    if not image:
        raise SpecError("spec.image: required")
    timeout = _get(spec, "timeoutSeconds", int, "spec.", None)
    if timeout is not None and timeout < 1:
        raise SpecError(f"spec.timeoutSeconds: expected >= 1, got {timeout}")
    backoff = _get(spec, "backoffLimit", int, "spec.", 0)
    if backoff < 0:
        raise SpecError(f"spec.backoffLimit: expected >= 0, got {backoff}")
    gateway = _get(spec, "gateway", str, "spec.", None)
    if gateway is not None and not gateway.startswith(("http://", "https://")):
        raise SpecError(f"spec.gateway: expected an http(s) URL, got {gateway!r}")
    secret = _get(spec, "apiKeySecret", dict, "spec.", None)
    key_ref = None
    if secret is not None:
        key_ref = (_get(secret, "name", str, "spec.apiKeySecret.", ""), _get(secret, "key", str,
                                                                             "spec.apiKeySecret.", "api-key"))
        if not key_ref[0]:
            raise SpecError("spec.apiKeySecret.name: required")
    return ProgramSpec(
        image=image,
        command=_strings(spec, "command", "spec."),
        args=_strings(spec, "args", "spec."),
        env=_env(spec, "spec."),
        model=_get(spec, "model", str, "spec.", None),
        gateway=gateway.rstrip("/") if gateway else None,
        timeout_seconds=timeout,
        backoff_limit=backoff,
        api_key_secret=key_ref,
    )
