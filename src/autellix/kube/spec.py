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

#: The engine image the operator runs when a spec names none (engine-image/Dockerfile; `make images`).
DEFAULT_ENGINE_IMAGE = "ghcr.io/autellix/autellix-engine:0.1.0"
#: ... and when it names none and asks for GPUs (``resources.gpus > 0``): the CUDA build of the engine image.
DEFAULT_ENGINE_GPU_IMAGE = "ghcr.io/autellix/autellix-engine-cuda:0.1.0"
#: The GPU resource ``resources.gpus`` counts when the spec names no other (e.g. ``amd.com/gpu``).
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
#: /dev/shm of an engine pod (vLLM's workers share tensors there); memory-backed, so it counts as pod memory.
DEFAULT_SHM_SIZE = "8Gi"
#: Spec fields copied onto the engine pod's spec unchanged, under the same name (the CRD's schema for
#: them is Kubernetes' own): name -> expected type.
POD_FIELDS: dict[str, type] = {
    "nodeSelector": dict,
    "tolerations": list,
    "affinity": dict,
    "topologySpreadConstraints": list,
    "runtimeClassName": str,
    "priorityClassName": str,
    "imagePullSecrets": list,
    "securityContext": dict,
    "serviceAccountName": str,
}
#: Scheduler parameters an engine uses; the gateway's own ones (balancer, ...) live in the chart values.
ENGINE_SCHEDULER_FIELDS = ("policy", "boundaries", "quanta", "beta", "backlog_factor", "multi_step", "max_preemptions")
MAX_REPLICAS = 64
#: An AgentProgram pod's resources when its spec names none: a small request, no limit (it is mostly waiting).
DEFAULT_PROGRAM_RESOURCES: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "256Mi"}}


class SpecError(ValueError):
    """A custom resource's spec is invalid; the message names the field."""


@dataclass(frozen=True)
class ModelSource:
    """Exactly one of: a path in the engine image, a PVC, an OCI image mounted as a volume (each with a
    folder in it), a hub id the pod downloads."""

    path: str | None = None
    pvc: str | None = None
    #: An OCI image (or artifact) holding the weights, mounted read-only (Kubernetes' image volume).
    image: str | None = None
    image_pull_policy: str = "IfNotPresent"
    #: The model's folder inside the PVC or the image.
    subpath: str = ""
    hub: str | None = None


@dataclass(frozen=True)
class ModelCache:
    """Where a hub model is downloaded to: a shared PVC, a node's disk, or (neither) the pod's own emptyDir."""

    pvc: str | None = None
    host_path: str | None = None
    #: Never contact the hub (HF_HUB_OFFLINE=1): the cache must already hold the model at ``revision``.
    offline: bool = False


@dataclass(frozen=True)
class Placement:
    """Where and as whom the engine pods run: the ``POD_FIELDS`` as given, plus the container's
    securityContext and the pod's metadata."""

    pod: dict[str, Any] = field(default_factory=dict)
    container_security_context: dict[str, Any] = field(default_factory=dict)
    automount_token: bool = False
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


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
    #: A hub revision (commit, branch or tag) pinned with vLLM's --revision.
    revision: str | None = None
    #: (Secret, key) holding the hub token, exported as HF_TOKEN.
    hub_token: tuple[str, str] | None = None
    cache: ModelCache = field(default_factory=ModelCache)
    image: str = DEFAULT_ENGINE_IMAGE
    image_pull_policy: str = "IfNotPresent"
    gpus: int = 0
    gpu_resource: str = DEFAULT_GPU_RESOURCE
    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)
    vllm_args: tuple[str, ...] = ()
    env: tuple[dict[str, Any], ...] = ()
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    replicas: int = 1
    autoscaling: Autoscaling = field(default_factory=Autoscaling)
    termination_grace_seconds: int = 120
    placement: Placement = field(default_factory=Placement)
    shm_size: str = DEFAULT_SHM_SIZE
    #: The engines' PodDisruptionBudget: at most this many evicted at once (an int or a percentage).
    max_unavailable: int | str = 1

    @property
    def model_arg(self) -> str:
        """What ``--model`` gets inside the pod."""
        if self.source.pvc is not None or self.source.image is not None:
            folder = self.source.subpath.strip("/")
            return f"/models/{folder}" if folder else "/models"
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
    #: The Job's activeDeadlineSeconds: a program still running after a day is stuck.
    timeout_seconds: int = 86400
    backoff_limit: int = 0
    #: A finished Job (and its pod's log) is kept this long; the outcome is in status long before.
    ttl_seconds: int = 3600
    api_key_secret: tuple[str, str] | None = None
    #: Whose session the operator opens (on the gateway's admin listener): ``spec.tenant``, else the
    #: data key of ``apiKeySecret``, the convention of the gateway's keys Secret (data key = tenant).
    tenant: str | None = None
    #: Its priority class for admission under overload (higher first; below zero sheddable).
    priority: int = 0
    resources: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_PROGRAM_RESOURCES))
    service_account: str | None = None
    #: A program talks to the gateway, not to Kubernetes: no API token unless asked for.
    automount_token: bool = False


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
    given = [k for k in ("path", "pvc", "image", "hub") if source.get(k) is not None]
    if len(given) != 1:
        raise SpecError(f"spec.model.source: set exactly one of path, pvc, image, hub "
                        f"(got {', '.join(given) or 'none'})")
    if given == ["pvc"]:
        pvc = _get(source, "pvc", dict, "spec.model.source.")
        claim = _get(pvc, "claimName", str, "spec.model.source.pvc.")
        if not claim:
            raise SpecError("spec.model.source.pvc.claimName: required")
        return ModelSource(pvc=claim, subpath=_get(pvc, "path", str, "spec.model.source.pvc.", ""))
    if given == ["image"]:
        image = _get(source, "image", dict, "spec.model.source.")
        reference = _get(image, "reference", str, "spec.model.source.image.")
        if not reference:
            raise SpecError("spec.model.source.image.reference: required")
        return ModelSource(image=reference, subpath=_get(image, "path", str, "spec.model.source.image.", ""),
                           image_pull_policy=_get(image, "pullPolicy", str, "spec.model.source.image.",
                                                  "IfNotPresent"))
    value = _get(source, given[0], str, "spec.model.source.")
    if not value:
        raise SpecError(f"spec.model.source.{given[0]}: must not be empty")
    return ModelSource(**{given[0]: value})


def _secret_key(raw: Mapping[str, Any], key: str, where: str, default_key: str) -> tuple[str, str] | None:
    secret = _get(raw, key, dict, where, None)
    if secret is None:
        return None
    name = _get(secret, "name", str, f"{where}{key}.", "")
    if not name:
        raise SpecError(f"{where}{key}.name: required")
    return name, _get(secret, "key", str, f"{where}{key}.", default_key) or default_key


def _model_cache(model: Mapping[str, Any], source: ModelSource) -> ModelCache:
    raw = _get(model, "cache", dict, "spec.model.", {})
    where = "spec.model.cache."
    pvc = _get(_get(raw, "pvc", dict, where, {}), "claimName", str, f"{where}pvc.", None)
    host = _get(_get(raw, "hostPath", dict, where, {}), "path", str, f"{where}hostPath.", None)
    if pvc is not None and host is not None:
        raise SpecError(f"{where[:-1]}: set at most one of pvc, hostPath")
    if (pvc is not None or host is not None or raw.get("offline")) and source.hub is None:
        raise SpecError(f"{where[:-1]}: only a hub source downloads (source is not hub)")
    if host is not None and not host.startswith("/"):
        raise SpecError(f"{where}hostPath.path: expected an absolute path, got {host!r}")
    return ModelCache(pvc=pvc or None, host_path=host, offline=_get(raw, "offline", bool, where, False))


def _string_map(spec: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    values = _get(spec, key, dict, where, {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
        raise SpecError(f"{where}{key}: expected a map of strings, got {values!r}")
    return dict(values)


def _placement(spec: Mapping[str, Any]) -> Placement:
    pod = {}
    for name, kind in POD_FIELDS.items():
        value = _get(spec, name, kind, "spec.", None)
        if value:  # an empty list or map says nothing
            pod[name] = value
    if "nodeSelector" in pod:
        pod["nodeSelector"] = _string_map(spec, "nodeSelector", "spec.")
    return Placement(pod=pod,
                     container_security_context=_get(spec, "containerSecurityContext", dict, "spec.", {}),
                     automount_token=_get(spec, "automountServiceAccountToken", bool, "spec.", False),
                     annotations=_string_map(spec, "podAnnotations", "spec."),
                     labels=_string_map(spec, "podLabels", "spec."))


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


def parse_engine(spec: Mapping[str, Any], default_image: str = DEFAULT_ENGINE_IMAGE,
                 default_gpu_image: str = DEFAULT_ENGINE_GPU_IMAGE) -> EngineSpec:
    """An AutellixEngine's spec, defaulted (when it names no image: ``default_gpu_image`` for an engine with
    GPUs, else ``default_image``); ``SpecError`` names the first bad field."""
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
    source = _model_source(model)
    revision = _get(model, "revision", str, "spec.model.", None) or None
    if revision is not None and source.hub is None:
        raise SpecError("spec.model.revision: only a hub source has revisions (source is not hub)")
    max_unavailable = _get(_get(spec, "disruptionBudget", dict, "spec.", {}), "maxUnavailable", (int, str),
                           "spec.disruptionBudget.", 1)
    replicas = _get(spec, "replicas", int, "spec.", 1)
    if not 0 <= replicas <= MAX_REPLICAS:
        raise SpecError(f"spec.replicas: expected 0..{MAX_REPLICAS}, got {replicas}")
    grace = _get(spec, "terminationGracePeriodSeconds", int, "spec.", 120)
    if grace < 0:
        raise SpecError(f"spec.terminationGracePeriodSeconds: expected >= 0, got {grace}")
    fallback_image = default_gpu_image if gpus > 0 else default_image
    return EngineSpec(
        served_name=served,
        source=source,
        revision=revision,
        hub_token=_secret_key(model, "hubTokenSecret", "spec.model.", "token"),
        cache=_model_cache(model, source),
        image=_get(spec, "image", str, "spec.", fallback_image) or fallback_image,
        image_pull_policy=_get(spec, "imagePullPolicy", str, "spec.", "IfNotPresent"),
        gpus=gpus,
        gpu_resource=_get(resources, "gpuResourceName", str, "spec.resources.", DEFAULT_GPU_RESOURCE)
        or DEFAULT_GPU_RESOURCE,
        requests={k: str(v) for k, v in _get(resources, "requests", dict, "spec.resources.", {}).items()},
        limits={k: str(v) for k, v in _get(resources, "limits", dict, "spec.resources.", {}).items()},
        vllm_args=_strings(spec, "vllmArgs", "spec."),
        env=_env(spec, "spec."),
        scheduler=_scheduler(spec),
        replicas=replicas,
        autoscaling=_autoscaling(spec),
        termination_grace_seconds=grace,
        placement=_placement(spec),
        shm_size=str(_get(spec, "shmSize", (int, str), "spec.", DEFAULT_SHM_SIZE)),
        max_unavailable=max_unavailable,
    )


def parse_program(spec: Mapping[str, Any]) -> ProgramSpec:
    """An AgentProgram's spec, defaulted; ``SpecError`` names the first bad field."""
    image = _get(spec, "image", str, "spec.", "")
    if not image:
        raise SpecError("spec.image: required")
    timeout = _get(spec, "timeoutSeconds", int, "spec.", ProgramSpec.timeout_seconds)
    if timeout < 1:
        raise SpecError(f"spec.timeoutSeconds: expected >= 1, got {timeout}")
    ttl = _get(spec, "ttlSecondsAfterFinished", int, "spec.", ProgramSpec.ttl_seconds)
    if ttl < 0:
        raise SpecError(f"spec.ttlSecondsAfterFinished: expected >= 0, got {ttl}")
    resources = _get(spec, "resources", dict, "spec.", None)
    if resources is not None and set(resources) - {"requests", "limits"}:
        raise SpecError(f"spec.resources: expected requests and/or limits, got {sorted(resources)}")
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
    tenant = _get(spec, "tenant", str, "spec.", None) or (key_ref[1] if key_ref else None)
    return ProgramSpec(
        image=image,
        command=_strings(spec, "command", "spec."),
        args=_strings(spec, "args", "spec."),
        env=_env(spec, "spec."),
        model=_get(spec, "model", str, "spec.", None),
        gateway=gateway.rstrip("/") if gateway else None,
        timeout_seconds=timeout,
        backoff_limit=backoff,
        ttl_seconds=ttl,
        api_key_secret=key_ref,
        tenant=tenant,
        priority=_get(spec, "priority", int, "spec.", 0),
        resources=dict(DEFAULT_PROGRAM_RESOURCES) if resources is None else
        {k: {n: str(v) for n, v in (resources[k] or {}).items()} for k in resources},
        service_account=_get(spec, "serviceAccountName", str, "spec.", None) or None,
        automount_token=_get(spec, "automountServiceAccountToken", bool, "spec.", False),
    )
