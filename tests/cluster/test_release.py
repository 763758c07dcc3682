"""The chart and the operator on a real control plane, one release through its life (the tests run in order).

``helm install`` (no ``--wait``: nothing runs here) with an engine of its own and a second served namespace;
the operator's effective rights as the API server reads them (``kubectl auth can-i --list`` as its service
account) and its admission policy; two ``autellix operator`` processes with the arguments and environment of
the chart's Deployment, authenticated as the chart's service account (a token from ``kubectl create token``),
electing a leader on the chart's Lease, with a real gateway for program sessions; engines bound by the
scheduler to the fake GPU nodes; an InferencePool CRD installed after the operator; an HPA driving an engine
through its scale subresource (which counts the engine pods, ready or not); the leader killed; programs that
run with a status reason, Events that ``kubectl describe`` shows and no finalizer (one an older operator left
is dropped); and ``helm uninstall``, after which a program with an open session, and a namespace holding one,
are deleted at once with no operator, nothing is left in the namespaces (no stuck finalizer, no Lease), and
``autellix kube release-finalizers`` is the way out for what an older operator left held.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from autellix.kube import FINALIZER
from autellix.kube.manifests import INFERENCE_POOL_CRD, POD_DELETION_COST, selector_string
from tests.cluster.conftest import ROOT, Kube, eventually

CHART = ROOT / "charts" / "autellix"
NAMESPACE = "autellix"
#: A second namespace the operator serves (operator.namespaces).
SERVED = "team-a"
RELEASE = "demo"
OPERATOR = f"{RELEASE}-autellix-operator"
GPU_NODES = {"gpu-node-1", "gpu-node-2"}
GPU_PLACEMENT = {"nodeSelector": {"nvidia.com/gpu.present": "true"},
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
MODEL = {"name": "llama-3.1-8b", "source": {"hub": "meta-llama/Llama-3.1-8B-Instruct"}}
VALUES = {
    "operator": {"namespaces": [SERVED], "inferencePool": True, "autoscaleInterval": 1, "programPollInterval": 1},
    "auth": {"keepOnUninstall": False},
    "engineDefaults": GPU_PLACEMENT,
    "engines": {"llama": {"model": MODEL, "resources": {"gpus": 1}}},
}
ENGINES = "autellixengines.autellix.ai"
PROGRAMS = "agentprograms.autellix.ai"
#: ``autellix kube`` (the command group of ``autellix.cli.kube``), run as its own process.
RELEASE_FINALIZERS = "from autellix.cli.kube import app; app(prog_name='autellix kube')"
#: A namespace nobody uses: what it holds is what every namespace holds of its own (a root CA ConfigMap,
#: the default ServiceAccount, ...), release or not.
BASELINE = "untouched"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions", []) if c["type"] == type_), {})


# ---- the release -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def release(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    kube.kubectl("create", "namespace", SERVED)  # served namespaces exist before the release's Roles go in
    kube.kubectl("create", "namespace", BASELINE)
    values = tmp_path_factory.mktemp("release") / "values.yaml"
    values.write_text(yaml.safe_dump(VALUES))
    kube.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", "-f", str(values))
    yield RELEASE
    kube.helm("uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", check=False)


@dataclass
class Gateway:
    """A real gateway process with the release's own keys (its Secrets, laid out as the kubelet mounts them)."""

    url: str
    admin_url: str
    process: subprocess.Popen[bytes]
    log: Path


def secret_as_mount(kube: Kube, name: str, folder: Path) -> Path:
    folder.mkdir(parents=True)
    for key, value in (kube.get("secret", name, NAMESPACE) or {})["data"].items():
        (folder / key).write_bytes(base64.b64decode(value))
    return folder


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.fixture(scope="module")
def gateway(kube: Kube, release: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    folder = tmp_path_factory.mktemp("gateway")
    port, admin_port = free_port(), free_port()
    log = folder / "gateway.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "autellix", "gateway", "--host", "127.0.0.1", "--port", str(port),
             "--admin-port", str(admin_port), "--engine", "http://127.0.0.1:9",
             "--api-keys-file", str(secret_as_mount(kube, f"{RELEASE}-autellix-tenant-keys", folder / "tenants")),
             "--admin-keys-file", str(secret_as_mount(kube, f"{RELEASE}-autellix-admin-keys", folder / "admin"))],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HOME": str(folder)})
    running = Gateway(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}", process, log)
    try:
        eventually(lambda: process.poll() is not None or http_status(f"{running.url}/health") == 200, 60,
                   f"the gateway to serve (log: {log})")
        assert process.poll() is None, log.read_text()[-3000:]
        yield running
    finally:
        process.terminate()
        process.wait(30)


# ---- the operator, as the chart's Deployment runs it ---------------------------------------------------
def resolve_env(kube: Kube, entries: list[dict[str, Any]], identity: str) -> dict[str, str]:
    """The container's environment as the kubelet would give it to this replica."""
    fields = {"metadata.name": identity, "metadata.namespace": NAMESPACE, "status.podIP": "127.0.0.1"}
    env: dict[str, str] = {}
    for entry in entries:
        source = entry.get("valueFrom") or {}
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif "fieldRef" in source:
            env[entry["name"]] = fields[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[entry["name"]] = base64.b64decode((kube.get("secret", ref["name"], NAMESPACE) or {})["data"][
                ref["key"]]).decode()
        else:
            raise AssertionError(f"an env entry the test cannot resolve: {entry}")
    return env


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of container arguments."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), arg)


@dataclass
class Operators:
    """``autellix operator`` processes (by their pod name), each with the chart's arguments and environment,
    as the chart's service account."""

    kube: Kube
    folder: Path
    kubeconfig: Path
    gateway: Gateway
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, identity: str) -> None:
        deployment = self.kube.get("deployment", OPERATOR, NAMESPACE)
        assert deployment is not None
        spec = deployment["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == OPERATOR
        [container] = spec["containers"]
        env = resolve_env(self.kube, container["env"], identity)
        # Only what points into the cluster's network (or would clash between two local processes) changes.
        overrides = {"--gateway-url": self.gateway.url, "--gateway-admin-url": self.gateway.admin_url,
                     "--liveness": f"http://127.0.0.1:{free_port()}/healthz", "--xds-port": str(free_port())}
        args = [expand(a, env) for a in container["args"]]
        flags = {a.split("=", 1)[0] for a in args}
        assert set(overrides) <= flags, set(overrides) - flags
        args = [f"{a.split('=', 1)[0]}={overrides[a.split('=', 1)[0]]}" if a.split("=", 1)[0] in overrides else a
                for a in args]
        with self.log(identity).open("wb") as out:
            self.procs[identity] = subprocess.Popen(
                [sys.executable, "-m", "autellix", "operator", *args], stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, **env, "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.folder)})

    def log(self, identity: str) -> Path:
        return self.folder / f"{identity}.log"

    def logs(self) -> str:
        return ", ".join(str(self.log(name)) for name in self.procs)

    def stop(self) -> None:
        """SIGTERM, what the kubelet sends a deleted pod."""
        running = [p for p in self.procs.values() if p.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        for proc in running:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture(scope="module")
def operators(kube: Kube, release: str, gateway: Gateway,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operators]:
    folder = tmp_path_factory.mktemp("operators")
    kubeconfig, _ = kube.service_account_kubeconfig(NAMESPACE, OPERATOR, folder / "kubeconfig")
    running = Operators(kube, folder, kubeconfig, gateway)
    try:
        running.start("operator-a")
        running.start("operator-b")
        yield running
    finally:
        running.stop()


def lease_holder(kube: Kube) -> str:
    lease = kube.get("lease", OPERATOR, NAMESPACE) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


# ---- 1. install ------------------------------------------------------------------------------------
def test_helm_install_completes_without_waiting_for_anything_to_run(kube: Kube, release: str) -> None:
    status = json.loads(kube.helm("status", release, "-n", NAMESPACE, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    engine = kube.get(ENGINES, "llama", NAMESPACE)
    assert engine is not None and engine["spec"]["resources"]["gpus"] == 1
    assert not engine["metadata"].get("finalizers")
    lease = kube.get("lease", OPERATOR, NAMESPACE)  # the chart's: it goes with the release
    assert lease is not None and not (lease.get("spec") or {}).get("holderIdentity")
    assert lease["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in kube.items("roles")
             if r["metadata"]["name"].startswith(OPERATOR)}
    assert roles == {(NAMESPACE, OPERATOR), (SERVED, OPERATOR), (NAMESPACE, f"{OPERATOR}-release")}


# ---- 2. what the operator may do -------------------------------------------------------------------
def can_i_list(kube: Kube, kubeconfig: Path, namespace: str) -> dict[str, set[str]]:
    """``kubectl auth can-i --list`` as the operator: resource -> verbs (resource names ignored)."""
    out = kube.kubectl("auth", "can-i", "--list", "-n", namespace, kubeconfig=kubeconfig).stdout
    rules: dict[str, set[str]] = {}
    for line in out.splitlines()[1:]:
        match = re.match(r"^(\S+)\s+\[.*?\]\s+\[.*?\]\s+\[(.*)\]\s*$", line)
        if match:
            rules.setdefault(match[1], set()).update(match[2].split())
    return rules


def can_i(kube: Kube, kubeconfig: Path, *args: str) -> bool:
    return kube.kubectl("auth", "can-i", *args, kubeconfig=kubeconfig, check=False).stdout.strip() == "yes"


def dry_run_patch(kube: Kube, token: str, path: str, patch: dict[str, Any]) -> tuple[int, str]:
    """A server-side dry-run strategic merge patch (a container changed by its name) as the operator:
    (HTTP status, message)."""
    request = urllib.request.Request(f"{kube.server}{path}?dryRun=All", json.dumps(patch).encode(), method="PATCH",
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/strategic-merge-patch+json"})
    context = ssl.create_default_context(cafile=str(kube.ca_file))
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return int(answer.status), ""
    except urllib.error.HTTPError as exc:
        return exc.code, str(json.loads(exc.read()).get("message", ""))


def test_the_operator_holds_only_the_rights_its_work_needs(kube: Kube, release: str, tmp_path: Path) -> None:
    kubeconfig, token = kube.service_account_kubeconfig(NAMESPACE, OPERATOR, tmp_path / "kubeconfig")
    # Outside the served namespaces it reads CRDs (cluster-scoped) and nothing else.
    for elsewhere in ("kube-system", "default"):
        rules = can_i_list(kube, kubeconfig, elsewhere)
        assert set(rules) == {"customresourcedefinitions.apiextensions.k8s.io",
                              "selfsubjectreviews.authentication.k8s.io",
                              "selfsubjectaccessreviews.authorization.k8s.io",
                              "selfsubjectrulesreviews.authorization.k8s.io"}, rules
        assert rules["customresourcedefinitions.apiextensions.k8s.io"] == {"list", "watch"}
    assert not can_i(kube, kubeconfig, "patch", "pods", "--all-namespaces")
    for kind in ("deployments.apps", "jobs.batch", "services", "pods"):
        assert not can_i(kube, kubeconfig, "create", kind, "-n", "kube-system"), kind
    # In each served namespace: its work there (workloads made, pods annotated), nothing on secrets.
    for served in (NAMESPACE, SERVED):
        rules = can_i_list(kube, kubeconfig, served)
        assert {"create", "patch"} <= rules["deployments.apps"] and {"create", "get"} <= rules["jobs.batch"]
        assert rules["pods"] == {"patch"}
        assert "secrets" not in rules and not any("delete" in verbs or "*" in verbs for verbs in rules.values())
    assert not can_i(kube, kubeconfig, "create", "deployments.apps", "-n", "default")
    # Leader election: the chart's one Lease, which it may update but never re-create.
    assert can_i(kube, kubeconfig, "update", f"leases/{OPERATOR}", "-n", NAMESPACE)
    assert not can_i(kube, kubeconfig, "update", "leases/another", "-n", NAMESPACE)
    assert not can_i(kube, kubeconfig, "create", "leases", "-n", NAMESPACE)

    # Admission narrows what RBAC cannot: of a pod, only the autoscaler's deletion-cost annotation.
    gateway_pod = eventually(lambda: kube.items("pods", NAMESPACE, "app.kubernetes.io/component=gateway"), 30,
                             "the release's gateway pods")[0]
    pod_path = f"/api/v1/namespaces/{NAMESPACE}/pods/{gateway_pod['metadata']['name']}"
    image = {"spec": {"containers": [{"name": gateway_pod["spec"]["containers"][0]["name"], "image": "evil:1"}]}}
    code, message = dry_run_patch(kube, token, pod_path, image)
    assert code in (403, 422) and "pod-deletion-cost" in message, (code, message)
    assert dry_run_patch(kube, token, pod_path, {"metadata": {"labels": {"app": "evil"}}})[0] in (403, 422)
    assert dry_run_patch(kube, token, pod_path, {"metadata": {"annotations": {POD_DELETION_COST: "-1000"}}}) == (
        200, "")
    # ... and of workloads, only its own children: not the release's gateway in the same namespace.
    code, message = dry_run_patch(kube, token, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/"
                                               f"{RELEASE}-autellix-gateway", {"spec": {"replicas": 9}})
    assert code in (403, 422) and "its own children" in message, (code, message)
    # The report that started this: an image patch of a kube-system pod. RBAC refuses it outright.
    kube.kubectl("run", "system-probe", "-n", "kube-system", "--image=registry.k8s.io/pause:3.10",
                 "--restart=Never")
    code, message = dry_run_patch(kube, token, "/api/v1/namespaces/kube-system/pods/system-probe",
                                  {"spec": {"containers": [{"name": "system-probe", "image": "evil:1"}]}})
    assert code == 403 and "cannot patch resource" in message, (code, message)
    kube.kubectl("delete", "pod", "system-probe", "-n", "kube-system", "--force", "--grace-period=0")


# ---- 3. the operator at work -------------------------------------------------------------------------
def engine_pods(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    return [p for p in kube.items("pods", namespace, f"autellix.ai/engine={name}")
            if not p["metadata"].get("deletionTimestamp")]


def bound_to_gpus(kube: Kube, namespace: str, name: str, count: int) -> list[dict[str, Any]] | None:
    pods = engine_pods(kube, namespace, name)
    return pods if len(pods) == count and all(p["spec"].get("nodeName") in GPU_NODES for p in pods) else None


def test_engines_are_reconciled_onto_the_gpu_nodes(kube: Kube, operators: Operators) -> None:
    kube.apply({"apiVersion": "autellix.ai/v1alpha1", "kind": "AutellixEngine",
                "metadata": {"name": "qwen", "namespace": SERVED},
                "spec": {"model": {"name": "qwen-7b", "source": {"hub": "Qwen/Qwen2.5-7B-Instruct"}},
                         "resources": {"gpus": 2}, **GPU_PLACEMENT}})
    for namespace, name in ((NAMESPACE, "llama"), (SERVED, "qwen")):
        pods = eventually(lambda ns=namespace, n=name: bound_to_gpus(kube, ns, n, 1), 90,  # type: ignore[misc]
                          f"{namespace}/{name}'s pod bound to a GPU node (operator logs: {operators.logs()})")
        assert pods[0]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in ("1", "2")
        # no InferencePool API yet: the engine serves without its pool and says so
        reconciled = eventually(lambda ns=namespace, n=name: condition(kube.get(ENGINES, n, ns), "Reconciled"),
                                30, "the Reconciled condition")
        assert reconciled["reason"] == "NoInferencePoolAPI", reconciled
        engine = kube.get(ENGINES, name, namespace)
        deployment = kube.get("deployment", name, namespace)
        assert engine is not None and deployment is not None
        assert deployment["metadata"]["ownerReferences"][0]["uid"] == engine["metadata"]["uid"]
        assert engine["status"]["selector"] == selector_string(name)
        # no finalizer: deleting an engine never waits for an operator
        assert not engine["metadata"].get("finalizers")


INFERENCE_POOL_CRD_OBJECT = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    # a *.k8s.io group: the API server wants its API review named (the Inference Extension's v1 review)
    "metadata": {"name": INFERENCE_POOL_CRD, "annotations": {
        "api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/gateway-api-inference-extension/pull/1173"}},
    "spec": {"group": "inference.networking.k8s.io", "scope": "Namespaced",
             "names": {"plural": "inferencepools", "singular": "inferencepool", "kind": "InferencePool",
                       "listKind": "InferencePoolList"},
             # the Inference Extension's schema is not what this checks: any spec is kept
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def test_inference_pools_follow_their_crd_installed_later(kube: Kube, operators: Operators) -> None:
    pids = {name: proc.pid for name, proc in operators.procs.items()}
    kube.apply(INFERENCE_POOL_CRD_OBJECT)
    for namespace, name in ((NAMESPACE, "llama"), (SERVED, "qwen")):
        pool = eventually(lambda ns=namespace, n=name: kube.get("inferencepools.inference.networking.k8s.io", n, ns),
                          60, f"{namespace}/{name}'s InferencePool (operator logs: {operators.logs()})")
        engine = kube.get(ENGINES, name, namespace)
        assert engine is not None
        assert pool["metadata"]["ownerReferences"][0]["uid"] == engine["metadata"]["uid"]
        assert pool["spec"]["selector"]["matchLabels"]["autellix.ai/engine"] == name
        eventually(lambda ns=namespace, n=name: condition(kube.get(ENGINES, n, ns), "Reconciled").get(
            "reason") == "Applied", 30, "Reconciled: Applied")
    # no restart: the same operator processes, still running
    assert {name: proc.pid for name, proc in operators.procs.items() if proc.poll() is None} == pids


def test_an_hpa_drives_an_engine_through_its_scale_subresource(kube: Kube, operators: Operators) -> None:
    scale_path = f"/apis/autellix.ai/v1alpha1/namespaces/{NAMESPACE}/autellixengines/llama/scale"
    scale = json.loads(kube.kubectl("get", "--raw", scale_path).stdout)
    assert (scale["spec"]["replicas"], scale["status"]["selector"]) == (1, selector_string("llama"))
    # No metrics server here: the HPA's first rule, "below minReplicas: scale to it", needs none.
    kube.apply({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "llama", "namespace": NAMESPACE},
                "spec": {"scaleTargetRef": {"apiVersion": "autellix.ai/v1alpha1", "kind": "AutellixEngine",
                                            "name": "llama"},
                         "minReplicas": 2, "maxReplicas": 3,
                         "metrics": [{"type": "Resource", "resource": {
                             "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]}})
    pods = eventually(lambda: bound_to_gpus(kube, NAMESPACE, "llama", 2), 90,
                      f"the HPA's 2 engines on GPU nodes (operator logs: {operators.logs()})")
    assert len(pods) == 2
    # The pods exist and never become ready (no kubelet): the scale subresource, which the HPA reads,
    # counts them all the same, as a Deployment's own does; readyReplicas stays 0.
    scale = eventually(lambda: (s := json.loads(kube.kubectl("get", "--raw", scale_path).stdout))["status"].get(
        "replicas") == 2 and s, 60, f"the scale subresource counting 2 pods (logs: {operators.logs()})")
    assert scale["status"]["selector"] == selector_string("llama")
    engine = kube.get(ENGINES, "llama", NAMESPACE)
    assert engine is not None and engine["status"]["readyReplicas"] == 0
    engine = kube.get(ENGINES, "llama", NAMESPACE)
    assert engine is not None and engine["spec"]["replicas"] == 2
    assert (kube.get("deployment", "llama", NAMESPACE) or {})["spec"]["replicas"] == 2
    hpa = eventually(lambda: (kube.get("hpa", "llama", NAMESPACE) or {}).get("status", {}).get(
        "currentReplicas") == 2 and kube.get("hpa", "llama", NAMESPACE), 60, "the HPA's view of 2 replicas")
    assert condition(hpa, "AbleToScale")["status"] == "True"  # it read and wrote the scale subresource
    autoscaling = eventually(lambda: condition(kube.get(ENGINES, "llama", NAMESPACE), "Autoscaling"), 30,
                             "the Autoscaling condition")
    assert autoscaling["reason"] == "ExternalAutoscaler" and "HorizontalPodAutoscaler llama" in autoscaling["message"]
    kube.kubectl("delete", "hpa", "llama", "-n", NAMESPACE)


def test_the_standby_operator_takes_over_when_the_leader_dies(kube: Kube, operators: Operators) -> None:
    leader = eventually(lambda: lease_holder(kube), 30, "a leader")
    assert leader in operators.procs
    [standby] = set(operators.procs) - {leader}
    service = kube.get("service", "llama", NAMESPACE)
    assert service is not None
    operators.procs[leader].send_signal(signal.SIGKILL)  # a crash: the Lease is not handed back
    kube.kubectl("delete", "service", "llama", "-n", NAMESPACE)

    def recreated() -> bool:
        again = kube.get("service", "llama", NAMESPACE)
        return again is not None and again["metadata"]["uid"] != service["metadata"]["uid"]

    eventually(recreated, 30, f"{standby} to recreate the engine's Service (logs: {operators.logs()})")
    assert lease_holder(kube) == standby


def agent_program(name: str, namespace: str, **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "autellix.ai/v1alpha1", "kind": "AgentProgram",
            "metadata": {"name": name, "namespace": namespace, **metadata},
            "spec": {"image": "python:3.12-slim", "command": ["python", "-c", "print('hi')"],
                     "tenant": "default", "model": MODEL["name"]}}


def described_events(kube: Kube, kind: str, name: str, namespace: str) -> str:
    """The Events section of ``kubectl describe``."""
    out = kube.kubectl("describe", kind, name, "-n", namespace).stdout
    return out[out.index("\nEvents:"):] if "\nEvents:" in out else ""


def test_programs_run_with_a_reason_and_events_and_no_finalizer(kube: Kube, operators: Operators) -> None:
    kube.apply(agent_program("react", NAMESPACE), agent_program("chat", SERVED),
               # as an older operator left one: held by its finalizer, which this one drops
               agent_program("legacy", NAMESPACE, finalizers=[FINALIZER]))

    def started(name: str, namespace: str) -> dict[str, Any] | None:
        program = kube.get(PROGRAMS, name, namespace) or {}
        return program if (program.get("status") or {}).get("reason") == "Started" else None

    for name, namespace in (("react", NAMESPACE), ("chat", SERVED), ("legacy", NAMESPACE)):
        program = eventually(lambda n=name, ns=namespace: started(n, ns), 60,  # type: ignore[misc]
                             f"{namespace}/{name} started (logs: {operators.logs()}, {operators.gateway.log})")
        # Running as soon as the Job counts its pod active (scheduled here, never started)
        assert program["status"]["phase"] in ("Pending", "Running") and program["status"]["sessionId"]
        job = eventually(lambda n=name, ns=namespace: kube.get("job", n, ns), 30, "the program's Job")
        env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["AUTELLIX_SESSION"] == program["status"]["sessionId"]
    # Its session open, no program holds a finalizer (the legacy one's is dropped), now or later.
    eventually(lambda: not (kube.get(PROGRAMS, "legacy", NAMESPACE) or {})["metadata"].get("finalizers"), 30,
               "the older operator's finalizer dropped")
    time.sleep(3)  # a few passes over the running programs
    for name, namespace in (("react", NAMESPACE), ("chat", SERVED), ("legacy", NAMESPACE)):
        assert not (kube.get(PROGRAMS, name, namespace) or {})["metadata"].get("finalizers"), name
    # What `kubectl describe` shows: the API server took the operator's Events, from autellix-operator.
    events = eventually(lambda: "Started" in (e := described_events(kube, PROGRAMS, "react", NAMESPACE)) and e, 30,
                        "the program's Started Event")
    assert re.search(r"Normal\s+Started\s+\S+\s+autellix-operator\s+Opened session \S+ in the gateway", events), \
        events
    columns = kube.kubectl("get", PROGRAMS, "react", "-n", NAMESPACE).stdout.splitlines()
    assert columns[0].split()[:3] == ["NAME", "PHASE", "REASON"] and columns[1].split()[2] == "Started", columns
    engine_events = described_events(kube, ENGINES, "qwen", SERVED)
    assert re.search(r"Normal\s+Applied\s+\S+\s+autellix-operator\s+Deployment qwen created", engine_events), \
        engine_events


# ---- 4. uninstall ----------------------------------------------------------------------------------------
def contents(kube: Kube, namespace: str, kinds: str) -> set[tuple[str, str]]:
    """Every object in the namespace but Events (records that expire by themselves)."""
    objects = json.loads(kube.kubectl("get", kinds, "-n", namespace, "-o", "json").stdout)["items"]
    return {(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] != "Event"}


def test_uninstall_leaves_nothing_in_the_namespaces(kube: Kube, release: str, operators: Operators) -> None:
    kube.helm("uninstall", release, "-n", NAMESPACE)  # no --wait: it returns once it asked for the deletes
    # The release's engine needs no operator to go: no finalizer; the garbage collector takes its children.
    eventually(lambda: kube.get(ENGINES, "llama", NAMESPACE) is None, 30, "the release's engine gone")
    operators.stop()  # the kubelet stops the operator pods the release deleted
    # With no operator: a kubectl-made engine is deleted at once ...
    kube.kubectl("delete", ENGINES, "qwen", "-n", SERVED, "--timeout=30s")
    # ... and so is a program whose session is open (the session ends by the gateway's idle TTL) ...
    program = kube.get(PROGRAMS, "react", NAMESPACE)
    assert program is not None and program["status"]["sessionId"] and not program["status"].get("sessionEnded")
    began = time.monotonic()
    kube.kubectl("delete", PROGRAMS, "react", "-n", NAMESPACE, "--timeout=30s")
    assert kube.get(PROGRAMS, "react", NAMESPACE) is None and time.monotonic() - began < 15
    # ... and a namespace holding one: nothing in it waits for the operator.
    assert (kube.get(PROGRAMS, "chat", SERVED) or {}).get("status", {}).get("sessionId")
    kube.kubectl("delete", "namespace", SERVED, "--wait=false")

    def namespace_gone() -> bool:
        kube.play_kubelet(SERVED)
        return kube.get("namespace", SERVED) is None

    eventually(namespace_gone, 60, f"namespace {SERVED} deleted", interval=1)
    # What an older operator left: a program held by its finalizer, which one command releases.
    kube.apply(agent_program("older", NAMESPACE, finalizers=[FINALIZER]))
    kube.kubectl("delete", PROGRAMS, "older", "-n", NAMESPACE, "--wait=false")
    stuck = eventually(lambda: kube.get(PROGRAMS, "older", NAMESPACE), 10, "the program, held")
    assert stuck["metadata"].get("deletionTimestamp") and FINALIZER in stuck["metadata"]["finalizers"]
    time.sleep(2)
    assert kube.get(PROGRAMS, "older", NAMESPACE) is not None  # nothing else would release it
    done = subprocess.run([sys.executable, "-c", RELEASE_FINALIZERS, "release-finalizers", "-n", NAMESPACE],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "KUBECONFIG": str(kube.kubeconfig)})
    assert done.returncode == 0 and "agentprogram.autellix.ai/older" in done.stdout, done.stdout + done.stderr
    eventually(lambda: kube.get(PROGRAMS, "older", NAMESPACE) is None, 30, "the program gone")
    kube.kubectl("delete", PROGRAMS, "legacy", "-n", NAMESPACE, "--timeout=30s")  # the operator released it

    kinds = ",".join(kube.kubectl("api-resources", "--verbs=list", "--namespaced", "-o", "name").stdout.split())
    baseline = contents(kube, BASELINE, kinds)
    assert ("ServiceAccount", "default") in baseline

    def left(namespace: str) -> set[tuple[str, str]]:
        return contents(kube, namespace, kinds) - baseline

    def emptied() -> bool:
        kube.play_kubelet(NAMESPACE)
        kube.play_kubelet(SERVED)
        return not left(NAMESPACE) and not left(SERVED)

    try:
        eventually(emptied, 90, "both namespaces empty", interval=1)
    except AssertionError:
        raise AssertionError(f"left behind: {sorted(left(NAMESPACE))} in {NAMESPACE}, "
                             f"{sorted(left(SERVED))} in {SERVED}") from None
    assert kube.get("lease", OPERATOR, NAMESPACE) is None
    # nor anything cluster-wide of the release
    for kind in ("clusterroles", "clusterrolebindings", "validatingadmissionpolicies",
                 "validatingadmissionpolicybindings"):
        assert not [o for o in kube.items(kind) if OPERATOR in o["metadata"]["name"]], kind
