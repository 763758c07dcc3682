"""Children of the custom resources, built by pure functions from the parsed spec.

* AutellixEngine -> a Deployment of engine pods (``autellix engine``: Autellix's
  scheduler inside vLLM, prefix caching on, GPUs, readiness on /health, a
  preStop that waits for the engine's calls to finish) and a Service whose
  labels the gateway's EndpointSlice discovery selects.
* AgentProgram -> a Job whose pod reaches the gateway's OpenAI endpoint with
  its calls in one session (OPENAI_BASE_URL, AUTELLIX_SESSION).

Every child carries an owner reference to its resource, so Kubernetes' garbage
collector removes it with the resource, and the operator's labels, so the
operator's drift watch finds it.
"""

from __future__ import annotations

from typing import Any

from autellix.kube import API_VERSION, ENGINE_KIND, PROGRAM_KIND
from autellix.kube.spec import EngineSpec, ProgramSpec

ENGINE_PORT = 8000
MANAGED_BY = "autellix-operator"
LABEL_ENGINE = "autellix.ai/engine"
LABEL_PROGRAM = "autellix.ai/program"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
#: A pod with a lower cost is removed first when a Deployment scales down; the
#: autoscaler marks the engine it drained.
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
GPU_RESOURCE = "nvidia.com/gpu"

# Waits (within the grace period) until the engine has no running or waiting
# call: the gateway stops sending new ones when the pod starts terminating
# (its endpoint turns not-ready), and vLLM would abort in-flight calls on SIGTERM.
PRESTOP_DRAIN = (
    "import re,time,urllib.request\n"
    "def busy():\n"
    f"    text = urllib.request.urlopen('http://127.0.0.1:{ENGINE_PORT}/metrics', timeout=5).read().decode()\n"
    "    return sum(float(v) for v in re.findall("
    "r'^vllm:num_requests_(?:running|waiting)\\{[^}]*\\} ([0-9.e+]+)$', text, re.M))\n"
    "while True:\n"
    "    try:\n"
    "        if busy() == 0: break\n"
    "    except Exception:\n"
    "        break\n"
    "    time.sleep(2)\n"
)


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


def _selector(name: str) -> dict[str, str]:
    return {LABEL_ENGINE: name, LABEL_COMPONENT: "engine"}


def engine_args(spec: EngineSpec) -> list[str]:
    """Arguments after the image's ``autellix engine --host 0.0.0.0 --port 8000``."""
    args = ["--model", spec.model_arg, "--served-model-name", spec.served_name]
    if "--enable-prefix-caching" not in spec.vllm_args and "--no-enable-prefix-caching" not in spec.vllm_args:
        args.append("--enable-prefix-caching")
    return args + list(spec.vllm_args)


def _engine_env(spec: EngineSpec) -> list[dict[str, Any]]:
    env = [{"name": k, "value": v} for k, v in sorted(spec.scheduler.to_env().items())]
    user = {e["name"] for e in spec.env}
    return [e for e in env if e["name"] not in user] + [dict(e) for e in spec.env]


def _engine_resources(spec: EngineSpec) -> dict[str, Any]:
    requests, limits = dict(spec.requests), dict(spec.limits)
    if spec.gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(spec.gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _engine_volumes(spec: EngineSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    # vLLM's workers share tensors through /dev/shm; the container default (64 MiB) is too small.
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
                                     {"name": "hf-cache", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"},
                                    {"name": "hf-cache", "mountPath": "/root/.cache/huggingface"}]
    if spec.source.pvc is not None:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": spec.source.pvc, "readOnly": True}})
        mounts.append({"name": "model", "mountPath": "/models", "readOnly": True})
    return volumes, mounts


def engine_deployment(name: str, namespace: str, uid: str, spec: EngineSpec) -> dict[str, Any]:
    labels = engine_labels(name)
    volumes, mounts = _engine_volumes(spec)
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    container: dict[str, Any] = {
        "name": "engine",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": engine_args(spec),
        "env": _engine_env(spec),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}],
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6},
        # Loading weights (a hub download, a large model) can take many minutes.
        "startupProbe": {**probe, "periodSeconds": 10, "failureThreshold": 180},
        "lifecycle": {"preStop": {"exec": {"command": ["python3", "-c", PRESTOP_DRAIN]}}},
        "volumeMounts": mounts,
    }
    resources = _engine_resources(spec)
    if resources:
        container["resources"] = resources
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "ownerReferences": [owner_reference(ENGINE_KIND, name, uid)]},
        "spec": {
            "replicas": spec.desired_replicas,
            "selector": {"matchLabels": _selector(name)},
            # One engine at a time, no surge: a GPU cluster rarely has a spare GPU for an extra pod.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": spec.termination_grace_seconds,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
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
            "selector": _selector(name),
            "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


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
    if spec.command:
        container["command"] = list(spec.command)
    if spec.args:
        container["args"] = list(spec.args)
    labels = {LABEL_PROGRAM: name, LABEL_MANAGED_BY: MANAGED_BY, LABEL_COMPONENT: "program"}
    job_spec: dict[str, Any] = {
        "backoffLimit": spec.backoff_limit,
        "template": {"metadata": {"labels": labels},
                     "spec": {"restartPolicy": "Never", "containers": [container]}},
    }
    if spec.timeout_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.timeout_seconds
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
