"""Children of the custom resources, built by pure functions from the parsed spec.

* AutellixEngine -> a Deployment of engine pods (``autellix engine``: Autellix's
  scheduler inside vLLM, prefix caching on, GPUs, readiness on /health, a
  preStop that waits for the engine's calls to finish), a Service whose
  labels the gateway's EndpointSlice discovery selects, a PodDisruptionBudget,
  and (when the operator is asked to) a Gateway API InferencePool.
* AgentProgram -> a Job whose pod reaches the gateway's OpenAI endpoint with
  its calls in one session (OPENAI_BASE_URL, AUTELLIX_SESSION).

Every child carries an owner reference to its resource, so Kubernetes' garbage
collector removes it with the resource, and the operator's labels, so the
operator's drift watch finds it.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

from autellix.kube import API_VERSION, ENGINE_KIND, PROGRAM_KIND
from autellix.kube.spec import EngineSpec, ProgramSpec
from autellix.protocol import ENGINE_TOKEN_ENV, KV_EVENTS_PORT

ENGINE_PORT = 8000
MANAGED_BY = "autellix-operator"
LABEL_ENGINE = "autellix.ai/engine"
LABEL_PROGRAM = "autellix.ai/program"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
#: A pod with a lower cost is removed first when a Deployment scales down; the
#: autoscaler marks the engine it drained.
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
#: Where a hub model is downloaded (HF_HOME), whatever user the image runs as.
HF_HOME = "/cache/huggingface"
INFERENCE_POOL_API = "inference.networking.k8s.io/v1"
#: The InferencePool CRD's name: the operator applies the pools once it is established.
INFERENCE_POOL_CRD = "inferencepools.inference.networking.k8s.io"
#: The data key of the engine-token Secret (the chart's ``<release>-engine-token``).
ENGINE_TOKEN_KEY = "token"

# Waits (within the grace period) until the engine has no running or waiting
# call: the gateway stops sending new ones when the pod starts terminating
# (its endpoint turns not-ready), and vLLM would abort in-flight calls on SIGTERM.
# The wait is autellix.backends.drain, read through the engine backend's metrics
# parser (the one the gateway's pool uses) and tested there.
PRESTOP_DRAIN = ["autellix", "engine", "drain-wait", "--url", f"http://127.0.0.1:{ENGINE_PORT}", "--interval", "2"]


def owner_reference(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind, "name": name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True}


def engine_labels(name: str) -> dict[str, str]:
    """Labels of an engine's Service and pods; ``autellix.ai/engine`` and the
    component label are what the gateway's discovery selects."""
    return {
        "app.kubernetes.io/name": "autellix-engine",
        "app.kubernetes.io/instance": name,
        LABEL_COMPONENT: "engine",
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_ENGINE: name,
    }


def engine_selector(name: str) -> dict[str, str]:
    """The labels that select an engine's pods (Deployment, Service, PDB, InferencePool, HPA)."""
    return {LABEL_ENGINE: name, LABEL_COMPONENT: "engine"}



def selector_string(name: str) -> str:
    """``engine_selector`` as a label-selector string: the scale subresource's ``status.selector``."""
    return ",".join(f"{k}={v}" for k, v in sorted(engine_selector(name).items()))


def engine_args(spec: EngineSpec) -> list[str]:
    """Arguments after the image's ``autellix engine --host 0.0.0.0 --port 8000``."""
    args = ["--model", spec.model_arg, "--served-model-name", spec.served_name]
    if spec.revision is not None:
        args += ["--revision", spec.revision]
    if "--enable-prefix-caching" not in spec.vllm_args and "--no-enable-prefix-caching" not in spec.vllm_args:
        args.append("--enable-prefix-caching")
    return args + list(spec.vllm_args)


def _engine_env(spec: EngineSpec, token_secret: str | None = None) -> list[dict[str, Any]]:
    env = [{"name": k, "value": v} for k, v in sorted(spec.scheduler.to_env().items())]
    if token_secret is not None:  # engines take calls only from the gateway (autellix.engine.feedback)
        env.append({"name": ENGINE_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": token_secret,
                                                                             "key": ENGINE_TOKEN_KEY}}})
    env.append({"name": "HF_HOME", "value": HF_HOME})
    if spec.cache.offline:
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    if spec.hub_token is not None:
        secret, key = spec.hub_token
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    user = {e["name"] for e in spec.env}
    return [e for e in env if e["name"] not in user] + [dict(e) for e in spec.env]


def _engine_resources(spec: EngineSpec) -> dict[str, Any]:
    requests, limits = dict(spec.requests), dict(spec.limits)
    if spec.gpus:
        requests[spec.gpu_resource] = limits[spec.gpu_resource] = str(spec.gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _engine_volumes(spec: EngineSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    # vLLM's workers share tensors through /dev/shm; the container default (64 MiB) is too small,
    # and an unbounded memory-backed emptyDir could take the node's memory.
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    # The hub cache: shared (a PVC), per node (hostPath), or the pod's own (downloaded on every start).
    if spec.cache.pvc is not None:
        cache: dict[str, Any] = {"persistentVolumeClaim": {"claimName": spec.cache.pvc}}
    elif spec.cache.host_path is not None:
        cache = {"hostPath": {"path": spec.cache.host_path, "type": "DirectoryOrCreate"}}
    else:
        cache = {"emptyDir": {}}
    volumes.append({"name": "hf-cache", **cache})
    mounts.append({"name": "hf-cache", "mountPath": HF_HOME})
    if spec.source.pvc is not None:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": spec.source.pvc, "readOnly": True}})
        mounts.append({"name": "model", "mountPath": "/models", "readOnly": True})
    elif spec.source.image is not None:
        volumes.append({"name": "model", "image": {"reference": spec.source.image,
                                                   "pullPolicy": spec.source.image_pull_policy}})
        mounts.append({"name": "model", "mountPath": "/models", "readOnly": True})
    return volumes, mounts


def default_topology_spread(name: str) -> list[dict[str, Any]]:
    """Engines of one pool spread over nodes, then zones, as far as the scheduler can (ScheduleAnyway:
    a pool larger than the GPU nodes still schedules); one node or zone going costs fewer engines."""
    return [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": engine_selector(name)}}
            for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")]


def _engine_pod_spec(name: str, spec: EngineSpec, container: dict[str, Any],
                     volumes: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "terminationGracePeriodSeconds": spec.termination_grace_seconds,
        # An engine never calls the Kubernetes API: no token in the pod unless the spec asks.
        "automountServiceAccountToken": spec.placement.automount_token,
        "topologySpreadConstraints": default_topology_spread(name),
        **spec.placement.pod,
        "containers": [container],
        "volumes": volumes,
    }
    return pod


def engine_deployment(name: str, namespace: str, uid: str, spec: EngineSpec, *,
                      token_secret: str | None = None) -> dict[str, Any]:
    labels = engine_labels(name)
    volumes, mounts = _engine_volumes(spec)
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    container: dict[str, Any] = {
        "name": "engine",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": engine_args(spec),
        "env": _engine_env(spec, token_secret),
        # its KV cache events and their replay (``autellix engine``'s default on a pod: autellix.engine.kv_events)
        "ports": [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"},
                  {"name": "kv-events", "containerPort": KV_EVENTS_PORT, "protocol": "TCP"},
                  {"name": "kv-replay", "containerPort": KV_EVENTS_PORT + 1, "protocol": "TCP"}],
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6},
        # Loading weights (a hub download, a large model) can take many minutes.
        "startupProbe": {**probe, "periodSeconds": 10, "failureThreshold": 180},
        "lifecycle": {"preStop": {"exec": {"command": list(PRESTOP_DRAIN)}}},
        "volumeMounts": mounts,
    }
    resources = _engine_resources(spec)
    if resources:
        container["resources"] = resources
    if spec.placement.container_security_context:
        container["securityContext"] = spec.placement.container_security_context
    template_meta: dict[str, Any] = {"labels": {**spec.placement.labels, **labels}}
    if spec.placement.annotations:
        template_meta["annotations"] = dict(spec.placement.annotations)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "ownerReferences": [owner_reference(ENGINE_KIND, name, uid)]},
        "spec": {
            "replicas": spec.desired_replicas,
            "selector": {"matchLabels": engine_selector(name)},
            # One engine at a time, no surge: a GPU cluster rarely has a spare GPU for an extra pod.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {"metadata": template_meta, "spec": _engine_pod_spec(name, spec, container, volumes)},
        },
    }


def engine_service(name: str, namespace: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": engine_labels(name),
                     "ownerReferences": [owner_reference(ENGINE_KIND, name, uid)]},
        "spec": {
            "type": "ClusterIP",
            "selector": engine_selector(name),
            "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def engine_disruption_budget(name: str, namespace: str, uid: str, spec: EngineSpec) -> dict[str, Any]:
    """Voluntary disruptions (a node drain, a cluster upgrade) evict at most ``maxUnavailable`` engines at
    a time; each evicted pod still finishes its calls in its preStop before it goes."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "labels": engine_labels(name),
                     "ownerReferences": [owner_reference(ENGINE_KIND, name, uid)]},
        "spec": {"maxUnavailable": spec.max_unavailable, "selector": {"matchLabels": engine_selector(name)}},
    }


def engine_inference_pool(name: str, namespace: str, uid: str, endpoint_picker: str | None, *,
                          failure_mode: str | None = None) -> dict[str, Any]:
    """A Gateway API Inference Extension InferencePool of the engine's pods, for a Gateway API
    implementation to route to by model; ``endpoint_picker`` is the Service of its endpoint picker
    (``None``: the operator's default, ``<engine>-epp``); ``failure_mode``: the picker's
    (``FailClose``, ``FailOpen``), when the operator runs it."""
    picker_ref: dict[str, Any] = {"name": endpoint_picker or endpoint_picker_name(name), "port": {"number": EPP_PORT}}
    if failure_mode is not None:
        picker_ref["failureMode"] = failure_mode
    return {
        "apiVersion": INFERENCE_POOL_API,
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": namespace, "labels": engine_labels(name),
                     "ownerReferences": [owner_reference(ENGINE_KIND, name, uid)]},
        "spec": {
            "selector": {"matchLabels": engine_selector(name)},
            "targetPorts": [{"number": ENGINE_PORT}],
            "endpointPickerRef": picker_ref,
        },
    }


def engine_children(name: str, namespace: str, uid: str, spec: EngineSpec, *, token_secret: str | None = None,
                    inference_pool: bool = False, picker: PickerSettings | None = None) -> list[dict[str, Any]]:
    """Every child of an engine, in the order they are applied (the InferencePool, whose API may be
    missing, last); with ``picker``, the engine's endpoint picker (``autellix epp``) and its Service too."""
    children = [engine_deployment(name, namespace, uid, spec, token_secret=token_secret),
                engine_service(name, namespace, uid), engine_disruption_budget(name, namespace, uid, spec)]
    if picker is not None:
        children += [engine_endpoint_picker(name, namespace, uid, spec, picker, token_secret=token_secret),
                     engine_endpoint_picker_service(name, namespace, uid)]
    if inference_pool or picker is not None:
        children.append(engine_inference_pool(name, namespace, uid, None,
                                              failure_mode=picker.failure_mode if picker is not None else None))
    return children


# ---- the engine's endpoint picker (``autellix epp``, docs/epp.md) -------------------------------
EPP_PORT, EPP_METRICS_PORT = 9002, 9090


@dataclass(frozen=True)
class PickerSettings:
    """How the operator runs ``autellix epp`` as each engine's endpoint picker (``--epp``)."""

    image: str
    replicas: int = 2
    fallbacks: int = 0
    #: The InferencePool's ``endpointPickerRef.failureMode``.
    failure_mode: str = "FailClose"
    #: A service account that may list and watch EndpointSlices (the picker's engine discovery).
    service_account: str | None = None
    #: The release's store: one program state for the gateways and the pickers.
    store_url: str | None = None
    #: A Secret (data key ``password``, in each engine's namespace) holding the store's password.
    store_password_secret: str | None = None

    def __post_init__(self) -> None:
        if self.store_password_secret is not None and self.store_url is None:
            raise ValueError("store_password_secret: needs store_url (the store the password is for)")


#: The picker's store password (from ``PickerSettings.store_password_secret``), and that Secret's data key.
STORE_PASSWORD_ENV, STORE_PASSWORD_KEY = "AUTELLIX_STORE_PASSWORD", "password"


def with_password(url: str, password: str) -> str:
    """``redis://host:port/db`` with ``password`` as its userinfo's password (``redis://:password@host...``),
    any user name in ``url`` kept and any password in it replaced."""
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme or not parts.netloc:
        raise ValueError(f"store URL: expected redis://HOST:PORT/DB, got {url!r}")
    user = parts.netloc.rpartition("@")[0].partition(":")[0] if "@" in parts.netloc else ""
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


def endpoint_picker_name(engine: str) -> str:
    return f"{engine}-epp"


def endpoint_picker_labels(engine: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "autellix-epp", "app.kubernetes.io/instance": endpoint_picker_name(engine),
            LABEL_COMPONENT: "epp", LABEL_MANAGED_BY: MANAGED_BY, LABEL_ENGINE: engine}


def endpoint_picker_selector(engine: str) -> dict[str, str]:
    return {LABEL_ENGINE: engine, LABEL_COMPONENT: "epp"}


def engine_endpoint_picker(name: str, namespace: str, uid: str, spec: EngineSpec, picker: PickerSettings, *,
                           token_secret: str | None = None) -> dict[str, Any]:
    """``autellix epp`` for the engine's InferencePool: its engines by the pool's own selector, the
    engine's scheduler settings (as its plugin has them), the store shared with the gateway."""
    env = [{"name": k, "value": v} for k, v in sorted(spec.scheduler.to_env().items())]
    if token_secret is not None:
        env.append({"name": ENGINE_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": token_secret,
                                                                             "key": ENGINE_TOKEN_KEY}}})
    if picker.store_password_secret is not None and picker.store_url is not None:
        # The password never enters the manifest: the kubelet expands $(VAR) of an earlier entry.
        env.append({"name": STORE_PASSWORD_ENV, "valueFrom": {"secretKeyRef": {
            "name": picker.store_password_secret, "key": STORE_PASSWORD_KEY}}})
        env.append({"name": "AUTELLIX_STORE", "value": with_password(picker.store_url, f"$({STORE_PASSWORD_ENV})")})
    elif picker.store_url is not None:
        env.append({"name": "AUTELLIX_STORE", "value": picker.store_url})
    args = ["epp", "--discovery=kubernetes", f"--namespace={namespace}", f"--engine-selector={selector_string(name)}",
            "--engine-port-name=http", "--host=0.0.0.0", f"--port={EPP_PORT}", f"--metrics-port={EPP_METRICS_PORT}",
            "--allow-anonymous", f"--fallbacks={picker.fallbacks}"]
    container: dict[str, Any] = {
        "name": "epp", "image": picker.image, "command": ["autellix"], "args": args, "env": env,
        "ports": [{"name": "grpc", "containerPort": EPP_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"}],
        "readinessProbe": {"grpc": {"port": EPP_PORT, "service": "readiness"}, "periodSeconds": 2},
        "livenessProbe": {"grpc": {"port": EPP_PORT, "service": "liveness"}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    }
    pod: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 45}
    if picker.service_account is not None:
        pod["serviceAccountName"] = picker.service_account
    labels = endpoint_picker_labels(name)
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": endpoint_picker_name(name), "namespace": namespace, "labels": labels,
                         "ownerReferences": [owner_reference(ENGINE_KIND, name, uid)]},
            "spec": {"replicas": picker.replicas, "selector": {"matchLabels": endpoint_picker_selector(name)},
                     "template": {"metadata": {"labels": labels}, "spec": pod}}}


def engine_endpoint_picker_service(name: str, namespace: str, uid: str) -> dict[str, Any]:
    """The Service the InferencePool's ``endpointPickerRef`` names."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": endpoint_picker_name(name), "namespace": namespace,
                         "labels": endpoint_picker_labels(name),
                         "ownerReferences": [owner_reference(ENGINE_KIND, name, uid)]},
            "spec": {"selector": endpoint_picker_selector(name),
                     "ports": [{"name": "grpc", "port": EPP_PORT, "targetPort": "grpc",
                                "appProtocol": "kubernetes.io/h2c"},
                               {"name": "metrics", "port": EPP_METRICS_PORT, "targetPort": "metrics"}]}}


def job_name(program: str) -> str:
    return program[:63]


def program_job(name: str, namespace: str, uid: str, spec: ProgramSpec, *, gateway: str,
                session_id: str) -> dict[str, Any]:
    """The program's Job: its pod calls ``{gateway}/v1`` with every call in ``session_id``."""
    env: list[dict[str, Any]] = [
        {"name": "OPENAI_BASE_URL", "value": gateway.rstrip("/") + "/v1"},
        {"name": "AUTELLIX_SESSION", "value": session_id},
        {"name": "AUTELLIX_GATEWAY_URL", "value": gateway.rstrip("/")},
    ]
    if spec.model:
        env.append({"name": "AUTELLIX_MODEL", "value": spec.model})
    if spec.api_key_secret is not None:
        secret, key = spec.api_key_secret
        env.append({"name": "OPENAI_API_KEY", "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    else:
        env.append({"name": "OPENAI_API_KEY", "value": "none"})  # the OpenAI client insists on one
    user = {e["name"] for e in spec.env}
    env = [e for e in env if e["name"] not in user] + [dict(e) for e in spec.env]
    container: dict[str, Any] = {"name": "program", "image": spec.image, "env": env}
    if spec.resources:
        container["resources"] = spec.resources
    if spec.command:
        container["command"] = list(spec.command)
    if spec.args:
        container["args"] = list(spec.args)
    labels = {LABEL_PROGRAM: name, LABEL_MANAGED_BY: MANAGED_BY, LABEL_COMPONENT: "program"}
    pod: dict[str, Any] = {"restartPolicy": "Never", "automountServiceAccountToken": spec.automount_token,
                           "containers": [container]}
    if spec.service_account:
        pod["serviceAccountName"] = spec.service_account
    job_spec: dict[str, Any] = {
        "backoffLimit": spec.backoff_limit,
        "activeDeadlineSeconds": spec.timeout_seconds,
        "ttlSecondsAfterFinished": spec.ttl_seconds,
        "template": {"metadata": {"labels": labels}, "spec": pod},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(name), "namespace": namespace, "labels": labels,
                     "ownerReferences": [owner_reference(PROGRAM_KIND, name, uid)]},
        "spec": job_spec,
    }


def job_outcome(job: dict[str, Any]) -> str | None:
    """``Succeeded`` / ``Failed`` once the Job has finished, else None."""
    for cond in job.get("status", {}).get("conditions", []) or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "Succeeded"
        if cond.get("status") == "True" and cond.get("type") in ("Failed", "FailureTarget"):
            return "Failed"
    status = job.get("status", {})
    if status.get("succeeded"):
        return "Succeeded"
    return None


def job_failure(job: dict[str, Any]) -> str:
    """Why a failed Job failed, from its Failed (or FailureTarget) condition: ``reason: message``."""
    for cond in job.get("status", {}).get("conditions", []) or []:
        if cond.get("status") == "True" and cond.get("type") in ("Failed", "FailureTarget"):
            return ": ".join(str(cond[k]) for k in ("reason", "message") if cond.get(k)) or "no reason given"
    return "no reason given"
