"""The operator's children, built by pure functions: valid Kubernetes (strict) and what the spec says."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from autellix.core import SchedulerConfig
from autellix.kube.diff import covers, drifted
from autellix.kube.manifests import (
    engine_deployment,
    engine_service,
    job_outcome,
    program_job,
)
from autellix.kube.spec import SpecError, parse_engine, parse_program

#: The oldest Kubernetes the CRDs' CEL rules need, and the newest schema kubernetes-validate has.
VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
UID = "0b5c4f5e-6d7e-4f80-9a1b-2c3d4e5f6a7b"

ENGINE_SPECS: dict[str, dict[str, Any]] = {
    "hub-gpu": {"model": {"name": "llama-8b", "source": {"hub": "meta-llama/Llama-3.1-8B-Instruct"}},
                "resources": {"gpus": 2, "requests": {"cpu": "4", "memory": "32Gi"}},
                "vllmArgs": ["--tensor-parallel-size", "2"],
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
                "scheduler": {"policy": "plas", "beta": "inf", "quanta": [64, 128, 256, 512, "inf"]},
                "replicas": 3},
    "pvc": {"model": {"name": "qwen", "source": {"pvc": {"claimName": "models", "path": "/qwen-7b/"}}},
            "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 5}, "replicas": 1},
    "path-cpu": {"model": {"name": "tiny", "source": {"path": "/opt/tiny"}}, "image": "autellix-engine:dev",
                 "resources": {"limits": {"cpu": 2, "memory": "4Gi"}}, "terminationGracePeriodSeconds": 30,
                 "vllmArgs": ["--no-enable-prefix-caching"]},
}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(ENGINE_SPECS))
def test_engine_children_validate_strictly(case: str, version: str) -> None:
    spec = parse_engine(ENGINE_SPECS[case])
    for manifest in (engine_deployment("e", "ns", UID, spec), engine_service("e", "ns", UID)):
        kubernetes_validate.validate(manifest, version, strict=True)


def test_engine_deployment_carries_the_spec() -> None:
    spec = parse_engine(ENGINE_SPECS["hub-gpu"])
    deployment = engine_deployment("llama", "prod", UID, spec)
    c = container(deployment)
    assert c["args"] == ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama-8b",
                         "--enable-prefix-caching", "--tensor-parallel-size", "2"]
    assert c["resources"] == {"requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "2"},
                              "limits": {"nvidia.com/gpu": "2"}}
    env = {e["name"]: e for e in c["env"]}
    expected = SchedulerConfig(policy="plas", beta=float("inf")).to_env()
    assert {k: env[k]["value"] for k in expected} == expected
    assert env["AUTELLIX_POLICY"]["value"] == "plas" and env["AUTELLIX_BETA"]["value"] == "inf"
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["lifecycle"]["preStop"]["exec"]["command"][:2] == ["python3", "-c"]
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
    ({"model": {"name": "m", "source": {}}}, "spec.model.source: set exactly one of path, pvc, hub (got none)"),
    ({"model": {"name": "m", "source": {"path": "/a", "hub": "x/y"}}},
     "spec.model.source: set exactly one of path, pvc, hub (got path, hub)"),
    ({"model": {"name": "", "source": {"path": "/a"}}},
     "spec.model.name: required (the served model name clients ask for)"),
    ({"model": {"name": "m", "source": {"path": "/a"}}, "replicas": -1}, "spec.replicas: expected 0..64, got -1"),
    ({"model": {"name": "m", "source": {"path": "/a"}}, "scheduler": {"policy": "sjf"}},
     "spec.scheduler.policy: expected one of atlas, plas, mlfq, fcfs, got 'sjf'"),
    ({"model": {"name": "m", "source": {"path": "/a"}}, "scheduler": {"balancer": "autellix"}},
     "spec.scheduler: unknown parameter(s) balancer; expected policy, boundaries, quanta, beta, multi_step"),
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
