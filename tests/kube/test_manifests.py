"""The operator's children, built by pure functions: valid Kubernetes (strict) and what the spec says."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from redis.connection import parse_url

from autellix.core import SchedulerConfig
from autellix.kube.diff import covers, drifted
from autellix.kube.manifests import (
    HF_HOME,
    PickerSettings,
    default_topology_spread,
    engine_children,
    engine_deployment,
    engine_disruption_budget,
    engine_endpoint_picker,
    engine_inference_pool,
    engine_service,
    job_outcome,
    program_job,
    selector_string,
)
from autellix.kube.spec import (
    DEFAULT_ENGINE_GPU_IMAGE,
    DEFAULT_ENGINE_IMAGE,
    POD_FIELDS,
    SpecError,
    parse_engine,
    parse_program,
)

#: The oldest Kubernetes the chart supports and the one its helm targets.
VERSIONS = ("1.29.0", "1.35.0")
UID = "0b5c4f5e-6d7e-4f80-9a1b-2c3d4e5f6a7b"
REVISION = "0e9e39f249a16976918f6564b8830bc894c89659"

ENGINE_SPECS: dict[str, dict[str, Any]] = {
    "hub-gpu": {"model": {"name": "llama-8b", "source": {"hub": "meta-llama/Llama-3.1-8B-Instruct"}},
                "resources": {"gpus": 2, "requests": {"cpu": "4", "memory": "32Gi"}},
                "vllmArgs": ["--tensor-parallel-size", "2"],
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
                "scheduler": {"policy": "plas", "beta": "inf", "boundaries": [0.5, 2, 8, 32],
                              "quanta": [64, 128, 256, 512, "inf"]},
                "replicas": 3},
    "pvc": {"model": {"name": "qwen", "source": {"pvc": {"claimName": "models", "path": "/qwen-7b/"}}},
            "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 5}, "replicas": 1},
    "path-cpu": {"model": {"name": "tiny", "source": {"path": "/opt/tiny"}}, "image": "autellix-engine:dev",
                 "resources": {"limits": {"cpu": 2, "memory": "4Gi"}}, "terminationGracePeriodSeconds": 30,
                 "vllmArgs": ["--no-enable-prefix-caching"]},
}

#: Every placement field of the CRD at once, on AMD GPUs from a private registry.
PLACED: dict[str, Any] = {
    "model": {"name": "llama", "source": {"hub": "meta-llama/Llama-3.1-8B-Instruct"}, "revision": REVISION,
              "hubTokenSecret": {"name": "hf"}, "cache": {"pvc": {"claimName": "hf-cache"}, "offline": True}},
    "image": "registry.example/autellix-engine:0.1.0",
    "imagePullSecrets": [{"name": "registry"}],
    "resources": {"gpus": 2, "gpuResourceName": "amd.com/gpu", "requests": {"cpu": "8", "memory": "64Gi",
                                                                          "ephemeral-storage": "50Gi"}},
    "nodeSelector": {"node.kubernetes.io/instance-type": "mi300x"},
    "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu.memory", "operator": "Gt", "values": ["100000"]}]}]}}},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "DoNotSchedule",
                                   "labelSelector": {"matchLabels": {"autellix.ai/engine": "llama"}}}],
    "runtimeClassName": "amd",
    "priorityClassName": "inference-critical",
    "serviceAccountName": "engines",
    "automountServiceAccountToken": True,
    "securityContext": {"runAsUser": 1000, "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
    "containerSecurityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    "podAnnotations": {"prometheus.io/scrape": "true"},
    "podLabels": {"team": "inference", "autellix.ai/engine": "not-this"},
    "shmSize": "16Gi",
    "disruptionBudget": {"maxUnavailable": "25%"},
}
ENGINE_SPECS["placed"] = PLACED
ENGINE_SPECS["host-cache"] = {"model": {"name": "m", "source": {"hub": "org/m"},
                                        "cache": {"hostPath": {"path": "/var/cache/hf"}}}}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(ENGINE_SPECS))
def test_engine_children_validate_strictly(case: str, version: str) -> None:
    spec = parse_engine(ENGINE_SPECS[case])
    for manifest in (engine_deployment("e", "ns", UID, spec), engine_service("e", "ns", UID),
                     engine_disruption_budget("e", "ns", UID, spec)):
        kubernetes_validate.validate(manifest, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_an_engines_endpoint_picker_validates_and_serves_its_pool(version: str) -> None:
    """With a picker, the engine's children add ``autellix epp`` and its Service; the InferencePool names it,
    selects the engine pods the picker discovers by the same selector, and carries its failure mode."""
    spec = parse_engine(ENGINE_SPECS["placed"])
    picker = PickerSettings(image="registry/autellix-gateway:1", failure_mode="FailOpen", service_account="pickers",
                            store_url="redis://store:6379/0")
    children = engine_children("e", "ns", UID, spec, token_secret="tok", picker=picker)
    kinds = [c["kind"] for c in children]
    assert kinds == ["Deployment", "Service", "PodDisruptionBudget", "Deployment", "Service", "InferencePool"]
    deployment, service, pool = children[3], children[4], children[5]
    for manifest in (deployment, service):
        kubernetes_validate.validate(manifest, version, strict=True)
    args = container(deployment)["args"]
    assert args[0] == "epp" and f"--engine-selector={selector_string('e')}" in args
    assert pool["spec"]["selector"]["matchLabels"] == children[0]["spec"]["selector"]["matchLabels"]
    assert pool["spec"]["endpointPickerRef"] == {"name": service["metadata"]["name"], "port": {"number": 9002},
                                                 "failureMode": "FailOpen"}
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    env = {e["name"]: e for e in container(deployment)["env"]}
    assert env["AUTELLIX_STORE"]["value"] == "redis://store:6379/0" and "secretKeyRef" in env[
        "AUTELLIX_ENGINE_TOKEN"]["valueFrom"]
    assert [c["kind"] for c in engine_children("e", "ns", UID, spec)] == ["Deployment", "Service",
                                                                          "PodDisruptionBudget"]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_pickers_store_password_comes_from_its_secret(version: str) -> None:
    """The store wants a password: the picker gets it from the Secret, never in its manifest, and the store
    URL names it by Kubernetes' $(VAR) expansion of the earlier env entry."""
    spec = parse_engine(ENGINE_SPECS["hub-gpu"])
    picker = PickerSettings(image="registry/autellix-gateway:1", store_url="redis://demo-store.autellix.svc:6379/0",
                            store_password_secret="demo-autellix-store-password")
    deployment = engine_endpoint_picker("e", "ns", UID, spec, picker)
    kubernetes_validate.validate(deployment, version, strict=True)
    env = container(deployment)["env"]
    names = [e["name"] for e in env]
    assert names.index("AUTELLIX_STORE_PASSWORD") < names.index("AUTELLIX_STORE")  # expanded in order
    by_name = {e["name"]: e for e in env}
    assert by_name["AUTELLIX_STORE_PASSWORD"] == {"name": "AUTELLIX_STORE_PASSWORD", "valueFrom": {
        "secretKeyRef": {"name": "demo-autellix-store-password", "key": "password"}}}
    store = by_name["AUTELLIX_STORE"]["value"]
    assert store == "redis://:$(AUTELLIX_STORE_PASSWORD)@demo-store.autellix.svc:6379/0"
    # What the picker's store client reads once the kubelet has put the Secret's value in.
    expanded = re.sub(r"\$\(AUTELLIX_STORE_PASSWORD\)", "s3cret", store)
    assert {k: v for k, v in parse_url(expanded).items() if k in ("host", "port", "db", "password")} == {
        "host": "demo-store.autellix.svc", "port": 6379, "db": 0, "password": "s3cret"}
    # A user name in the URL is kept, a password in it replaced.
    with_user = dataclasses.replace(picker, store_url="rediss://epp:old@store:6380/1")
    assert {e["name"]: e for e in container(engine_endpoint_picker("e", "ns", UID, spec, with_user))["env"]}[
        "AUTELLIX_STORE"]["value"] == "rediss://epp:$(AUTELLIX_STORE_PASSWORD)@store:6380/1"
    # Without the Secret: the URL as given, no password entry.
    plain = container(engine_endpoint_picker("e", "ns", UID, spec, dataclasses.replace(
        picker, store_password_secret=None)))["env"]
    assert [e for e in plain if e["name"].startswith("AUTELLIX_STORE")] == [
        {"name": "AUTELLIX_STORE", "value": "redis://demo-store.autellix.svc:6379/0"}]
    with pytest.raises(ValueError, match="store_password_secret: needs store_url"):
        PickerSettings(image="gw", store_password_secret="demo-autellix-store-password")


def test_an_engine_that_names_no_image_runs_the_gpu_image_when_it_asks_for_gpus() -> None:
    gpu = {"model": {"name": "llama", "source": {"hub": "meta-llama/Llama-3.1-8B-Instruct"}}, "resources": {"gpus": 1}}
    cpu = {"model": {"name": "tiny", "source": {"path": "/opt/tiny"}}}
    assert parse_engine(gpu).image == DEFAULT_ENGINE_GPU_IMAGE == "ghcr.io/autellix/autellix-engine-cuda:0.1.0"
    assert parse_engine(cpu).image == DEFAULT_ENGINE_IMAGE
    assert parse_engine({**cpu, "resources": {"gpus": 0}}).image == DEFAULT_ENGINE_IMAGE
    images = {"default_image": "registry.example/engine:2", "default_gpu_image": "registry.example/engine-cuda:2"}
    deployment = engine_deployment("llama", "ns", UID, parse_engine(gpu, **images))
    assert container(deployment)["image"] == "registry.example/engine-cuda:2"
    assert parse_engine(cpu, **images).image == "registry.example/engine:2"
    # an image in the spec wins, GPUs or not
    assert parse_engine({**gpu, "image": "mine/engine:1"}, **images).image == "mine/engine:1"


def test_every_placement_field_reaches_the_pod() -> None:
    pod = engine_deployment("llama", "prod", UID, parse_engine(PLACED))["spec"]["template"]
    spec, c = pod["spec"], pod["spec"]["containers"][0]
    for name in POD_FIELDS:
        assert spec[name] == PLACED[name], name
    assert spec["automountServiceAccountToken"] is True
    assert c["securityContext"] == PLACED["containerSecurityContext"]
    assert c["image"] == PLACED["image"]
    assert c["resources"] == {"requests": {"cpu": "8", "memory": "64Gi", "ephemeral-storage": "50Gi",
                                           "amd.com/gpu": "2"}, "limits": {"amd.com/gpu": "2"}}
    assert pod["metadata"]["annotations"] == PLACED["podAnnotations"]
    assert pod["metadata"]["labels"]["team"] == "inference"
    assert pod["metadata"]["labels"]["autellix.ai/engine"] == "llama"  # the operator's selector label wins
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    budget = engine_disruption_budget("llama", "prod", UID, parse_engine(PLACED))
    assert budget["spec"]["maxUnavailable"] == "25%"
    covered = set(POD_FIELDS) | {"model", "image", "resources", "automountServiceAccountToken",
                                 "containerSecurityContext", "podAnnotations", "podLabels", "shmSize",
                                 "disruptionBudget"}
    assert set(PLACED) == covered  # a new field joins PLACED and this test


def test_model_storage_pins_the_revision_and_keeps_the_cache() -> None:
    c = container(engine_deployment("llama", "prod", UID, parse_engine(PLACED)))
    assert c["args"][:6] == ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama",
                             "--revision", REVISION]
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert env["HF_HOME"]["value"] == HF_HOME and env["HF_HUB_OFFLINE"]["value"] == "1"
    assert {"name": "hf-cache", "mountPath": HF_HOME} in c["volumeMounts"]
    shared = engine_deployment("llama", "prod", UID, parse_engine(PLACED))["spec"]["template"]["spec"]
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}} in shared["volumes"]
    host = engine_deployment("m", "ns", UID, parse_engine(ENGINE_SPECS["host-cache"]))["spec"]["template"]["spec"]
    assert {"name": "hf-cache", "hostPath": {"path": "/var/cache/hf", "type": "DirectoryOrCreate"}} in host["volumes"]
    assert "HF_HUB_OFFLINE" not in {e["name"] for e in host["containers"][0]["env"]}
    # no cache given: the pod's own emptyDir (downloads on every start)
    plain = engine_deployment("e", "ns", UID, parse_engine(ENGINE_SPECS["hub-gpu"]))["spec"]["template"]["spec"]
    assert {"name": "hf-cache", "emptyDir": {}} in plain["volumes"]


def test_a_warm_cache_serves_the_pinned_revision_without_the_hub(tmp_path: Path) -> None:
    """What the engine's hub client does with the pod's environment (HF_HOME on the cache volume,
    HF_HUB_OFFLINE): a cache holding the pinned revision serves it with no hub call; a cold one fails fast
    rather than downloading."""
    pytest.importorskip("huggingface_hub", reason="the hub client vLLM uses (engine extra)")
    pod_env = {e["name"]: e["value"] for e in container(engine_deployment("l", "ns", UID, parse_engine(PLACED)))["env"]
               if "value" in e}
    assert pod_env["HF_HUB_OFFLINE"] == "1"
    code = ("from huggingface_hub import snapshot_download; "
            f"print(snapshot_download('meta-llama/Llama-3.1-8B-Instruct', revision='{REVISION}'))")

    def load(cache: Path) -> subprocess.CompletedProcess:
        env = {**os.environ, **pod_env, "HF_HOME": str(cache), "HF_ENDPOINT": "http://127.0.0.1:9"}
        env.pop("HF_TOKEN", None)
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)

    snapshot = tmp_path / "warm" / "hub" / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    warm = load(tmp_path / "warm")
    assert warm.returncode == 0 and warm.stdout.strip() == str(snapshot), warm.stderr[-2000:]
    cold = load(tmp_path / "cold")
    assert cold.returncode != 0 and "offline" in cold.stderr.lower(), cold.stderr[-2000:]


@pytest.mark.parametrize("version", ["1.35.0"])  # image volumes exist from Kubernetes 1.31 on
def test_weights_from_an_image_volume(version: str) -> None:
    spec = parse_engine({"model": {"name": "m", "source": {"image": {
        "reference": "registry.example/models/qwen:7b", "path": "/qwen"}}}})
    deployment = engine_deployment("q", "ns", UID, spec)
    kubernetes_validate.validate(deployment, version, strict=True)
    pod = deployment["spec"]["template"]["spec"]
    assert {"name": "model", "image": {"reference": "registry.example/models/qwen:7b",
                                       "pullPolicy": "IfNotPresent"}} in pod["volumes"]
    assert pod["containers"][0]["args"][:2] == ["--model", "/models/qwen"]


def test_engines_spread_and_run_without_an_api_token_by_default() -> None:
    pod = engine_deployment("e", "ns", UID, parse_engine(ENGINE_SPECS["hub-gpu"]))["spec"]["template"]["spec"]
    assert pod["topologySpreadConstraints"] == default_topology_spread("e")
    assert [t["topologyKey"] for t in pod["topologySpreadConstraints"]] == ["kubernetes.io/hostname",
                                                                            "topology.kubernetes.io/zone"]
    assert {t["whenUnsatisfiable"] for t in pod["topologySpreadConstraints"]} == {"ScheduleAnyway"}
    assert pod["automountServiceAccountToken"] is False
    assert "nodeSelector" not in pod and "tolerations" not in pod


def test_disruption_budget_and_inference_pool_select_the_engine_pods() -> None:
    deployment = engine_deployment("e", "ns", UID, parse_engine(ENGINE_SPECS["hub-gpu"]))
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    budget = engine_disruption_budget("e", "ns", UID, parse_engine(ENGINE_SPECS["hub-gpu"]))
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": deployment["spec"]["selector"][
        "matchLabels"]}}
    pool = engine_inference_pool("e", "ns", UID, None)
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["kind"] == "InferencePool"
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {"name": "e-epp", "port": {"number": 9002}}
    assert engine_inference_pool("e", "ns", UID, "picker")["spec"]["endpointPickerRef"]["name"] == "picker"
    # the scale subresource's selector (status.selector) selects the same pods
    wanted = dict(part.split("=") for part in selector_string("e").split(","))
    assert wanted == deployment["spec"]["selector"]["matchLabels"]


def test_engine_deployment_carries_the_spec() -> None:
    spec = parse_engine(ENGINE_SPECS["hub-gpu"])
    deployment = engine_deployment("llama", "prod", UID, spec)
    c = container(deployment)
    assert c["args"] == ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama-8b",
                         "--enable-prefix-caching", "--tensor-parallel-size", "2"]
    assert c["resources"] == {"requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "2"},
                              "limits": {"nvidia.com/gpu": "2"}}
    env = {e["name"]: e for e in c["env"]}
    expected = SchedulerConfig(policy="plas", beta=float("inf"), boundaries=(0.5, 2, 8, 32),
                               quanta=(64, 128, 256, 512, float("inf"))).to_env()
    assert {k: env[k]["value"] for k in expected} == expected
    assert env["AUTELLIX_POLICY"]["value"] == "plas" and env["AUTELLIX_BETA"]["value"] == "inf"
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["lifecycle"]["preStop"]["exec"]["command"][:3] == ["autellix", "engine", "drain-wait"]
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 120
    assert deployment["spec"]["replicas"] == 3
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    owner = deployment["metadata"]["ownerReferences"][0]
    assert owner == {"apiVersion": "autellix.ai/v1alpha1", "kind": "AutellixEngine", "name": "llama", "uid": UID,
                     "controller": True, "blockOwnerDeletion": True}


def test_pvc_source_autoscaling_bounds_and_prefix_caching_opt_out() -> None:
    pvc = engine_deployment("q", "ns", UID, parse_engine(ENGINE_SPECS["pvc"]))
    assert container(pvc)["args"][:2] == ["--model", "/models/qwen-7b"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in \
        pvc["spec"]["template"]["spec"]["volumes"]
    assert pvc["spec"]["replicas"] == 2  # spec.replicas 1 is below the autoscaler's minimum
    cpu = engine_deployment("t", "ns", UID, parse_engine(ENGINE_SPECS["path-cpu"]))
    assert "--enable-prefix-caching" not in container(cpu)["args"]  # the user turned it off explicitly
    assert "resources" in container(cpu) and "nvidia.com/gpu" not in container(cpu)["resources"]["limits"]


def test_engine_service_is_what_the_gateway_discovers() -> None:
    service = engine_service("llama", "prod", UID)
    labels = service["metadata"]["labels"]
    assert labels["autellix.ai/engine"] == "llama" and labels["app.kubernetes.io/component"] == "engine"
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]


@pytest.mark.parametrize("version", VERSIONS)
def test_program_job_validates_strictly_and_reaches_the_gateway(version: str) -> None:
    """Also: resources, service account, TTL, backoff and deadline come from the spec, with defaults."""
    spec = parse_program({"image": "agent:1", "command": ["python", "agent.py"], "args": ["--steps", "3"],
                          "model": "llama-8b", "timeoutSeconds": 600, "backoffLimit": 1,
                          "apiKeySecret": {"name": "gw", "key": "key"},
                          "env": [{"name": "OPENAI_BASE_URL", "value": "http://override/v1"}]})
    job = program_job("react", "ns", UID, spec, gateway="http://autellix-gateway/", session_id="sess-1")
    kubernetes_validate.validate(job, version, strict=True)
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AUTELLIX_SESSION"]["value"] == "sess-1"
    assert env["OPENAI_BASE_URL"]["value"] == "http://override/v1"  # the user's own value wins
    assert env["OPENAI_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "gw", "key": "key"}}
    assert job["spec"]["activeDeadlineSeconds"] == 600 and job["spec"]["backoffLimit"] == 1
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    default = program_job("p", "ns", UID, parse_program({"image": "a"}), gateway="http://gw", session_id="s")
    env = {e["name"]: e.get("value") for e in default["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["OPENAI_BASE_URL"] == "http://gw/v1" and env["AUTELLIX_GATEWAY_URL"] == "http://gw"
    assert default["spec"]["ttlSecondsAfterFinished"] == 3600 and default["spec"]["activeDeadlineSeconds"] == 86400
    assert default["spec"]["backoffLimit"] == 0
    pod = default["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}}
    tuned = program_job("p", "ns", UID, parse_program({
        "image": "a", "ttlSecondsAfterFinished": 60, "serviceAccountName": "agents",
        "automountServiceAccountToken": True, "resources": {"limits": {"memory": "1Gi", "cpu": 1}}}),
        gateway="http://gw", session_id="s")
    kubernetes_validate.validate(tuned, version, strict=True)
    pod = tuned["spec"]["template"]["spec"]
    assert tuned["spec"]["ttlSecondsAfterFinished"] == 60
    assert pod["serviceAccountName"] == "agents" and pod["automountServiceAccountToken"] is True
    assert pod["containers"][0]["resources"] == {"limits": {"memory": "1Gi", "cpu": "1"}}


@pytest.mark.parametrize(("status", "outcome"), [
    ({}, None), ({"active": 1}, None), ({"succeeded": 1}, "Succeeded"),
    ({"conditions": [{"type": "Complete", "status": "True"}]}, "Succeeded"),
    ({"conditions": [{"type": "Failed", "status": "True"}], "failed": 1}, "Failed"),
    ({"conditions": [{"type": "Failed", "status": "False"}]}, None),
])
def test_job_outcome(status: dict[str, Any], outcome: str | None) -> None:
    assert job_outcome({"status": status}) == outcome


@pytest.mark.parametrize(("spec", "message"), [
    ({}, "spec.model: required"),
    ({"model": {"name": "m", "source": {}}},
     "spec.model.source: set exactly one of path, pvc, image, hub (got none)"),
    ({"model": {"name": "m", "source": {"path": "/a", "hub": "x/y"}}},
     "spec.model.source: set exactly one of path, pvc, image, hub (got path, hub)"),
    ({"model": {"name": "m", "source": {"path": "/a"}, "revision": "main"}},
     "spec.model.revision: only a hub source has revisions (source is not hub)"),
    ({"model": {"name": "m", "source": {"path": "/a"}, "cache": {"pvc": {"claimName": "c"}}}},
     "spec.model.cache: only a hub source downloads (source is not hub)"),
    ({"model": {"name": "m", "source": {"hub": "a/b"}, "cache": {"pvc": {"claimName": "c"},
                                                                  "hostPath": {"path": "/c"}}}},
     "spec.model.cache: set at most one of pvc, hostPath"),
    ({"model": {"name": "m", "source": {"path": "/a"}}, "tolerations": {"key": "x"}},
     "spec.tolerations: expected list, got {'key': 'x'}"),
    ({"model": {"name": "m", "source": {"path": "/a"}}, "nodeSelector": {"gpu": 1}},
     "spec.nodeSelector: expected a map of strings, got {'gpu': 1}"),
    ({"model": {"name": "", "source": {"path": "/a"}}},
     "spec.model.name: required (the served model name clients ask for)"),
    ({"model": {"name": "m", "source": {"path": "/a"}}, "replicas": -1}, "spec.replicas: expected 0..64, got -1"),
    ({"model": {"name": "m", "source": {"path": "/a"}}, "scheduler": {"policy": "sjf"}},
     "spec.scheduler.policy: expected one of atlas, plas, mlfq, fcfs, got 'sjf'"),
    ({"model": {"name": "m", "source": {"path": "/a"}}, "scheduler": {"balancer": "autellix"}},
     "spec.scheduler: unknown parameter(s) balancer; expected policy, boundaries, quanta, beta, backlog_factor, "
     "multi_step, max_preemptions"),
    ({"model": {"name": "m", "source": {"path": "/a"}}, "scheduler": {"max_preemptions": "many"}},
     "spec.scheduler.max_preemptions: expected a number, got 'many'"),
    ({"model": {"name": "m", "source": {"path": "/a"}}, "autoscaling": {"minReplicas": 3, "maxReplicas": 2}},
     "spec.autoscaling.minReplicas/maxReplicas: expected 1 <= minReplicas <= maxReplicas <= 64, got 3 and 2"),
    ({"model": {"name": "m", "source": {"path": "/a"}}, "vllmArgs": ["--x", 1]},
     "spec.vllmArgs: expected a list of strings, got ['--x', 1]"),
    ({"model": {"name": "m", "source": {"path": "/a"}}, "replicas": True},
     "spec.replicas: expected a number, got True"),
])
def test_bad_engine_specs_name_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_engine(spec)
    assert str(info.value) == message


def test_drift_ignores_server_defaults_but_not_our_fields() -> None:
    desired = engine_service("e", "ns", UID)
    live = {**desired, "metadata": {**desired["metadata"], "uid": "x", "resourceVersion": "7"},
            "spec": {**desired["spec"], "clusterIP": "10.0.0.1", "sessionAffinity": "None"}}
    assert not drifted(live, desired)
    edited = {**live, "spec": {**live["spec"], "ports": [{"name": "http", "port": 9999}]}}
    assert drifted(edited, desired)
    assert covers({"a": [1, {"b": 2, "c": 3}]}, {"a": [1, {"b": 2}]})
    assert not covers({"a": [1]}, {"a": [1, 2]}) and not covers({"a": 1}, {"a": True})
