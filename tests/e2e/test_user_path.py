"""The user's path, on a real node, in order: install, an engine, the endpoint from another namespace, an
AgentProgram, autoscaling up under a Job of programs, faults while programs run, autoscaling down, uninstall.

Each test is one step of the README's "Deploy on Kubernetes" as a user takes it, on the images `make images`
built; they share one release and run in file order. What the cluster cannot have here is said where it
matters: no registry (the images are loaded on the node), no GPU (the engines run the CPU image and the tiny
model of crds/examples/engine-cpu.yaml), and a network that does not enforce NetworkPolicies (tests/chart
checks their intent).
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import yaml

from tests.cluster.conftest import ROOT, eventually
from tests.e2e.conftest import REPORT, Images, Node

pytestmark = pytest.mark.timeout(3600)  # the first step builds every image (from nothing on a fresh machine)

T = TypeVar("T")
CHART = ROOT / "charts" / "autellix"
EXAMPLES = ROOT / "crds" / "examples"
SCRIPTS = ROOT / "tests" / "e2e" / "pod_scripts"
NAMESPACE = RELEASE = "autellix"
#: Where tenants' agents run: another namespace than the release's.
AGENTS = "agents"
ENDPOINT = f"http://{RELEASE}-envoy.{NAMESPACE}.svc/v1"
MODEL = "tiny-llama"
ENGINE = "tiny"
#: Within the autoscaler's design, short enough for a test: a surge must last 10 s, a lull 30 s.
AUTOSCALING = {"enabled": True, "minReplicas": 1, "maxReplicas": 2, "targetLoad": 4,
               "scaleUpWindowSeconds": 10, "scaleDownWindowSeconds": 30}


@dataclass
class Cluster:
    node: Node
    images: Images

    def kubectl(self, *args: str, **kwargs: Any) -> Any:
        return self.node.kube.kubectl(*args, **kwargs)

    def get(self, kind: str, name: str, namespace: str = NAMESPACE) -> dict[str, Any] | None:
        return self.node.kube.get(kind, name, namespace)

    def items(self, kind: str, namespace: str = NAMESPACE, selector: str | None = None) -> list[dict[str, Any]]:
        return self.node.kube.items(kind, namespace, selector)

    def apply(self, *objects: dict[str, Any]) -> None:
        self.node.kube.apply(*objects)

    def secret(self, name: str, key: str, namespace: str = NAMESPACE) -> str:
        secret = self.get("secret", name, namespace)
        assert secret is not None, f"no Secret {namespace}/{name}"
        return base64.b64decode(secret["data"][key]).decode().strip().splitlines()[0]

    def service_url(self, name: str, port: int, namespace: str = NAMESPACE) -> str:
        """A ClusterIP Service's address: kube-proxy routes it from this host too."""
        service = self.get("service", name, namespace)
        assert service is not None, f"no Service {namespace}/{name}"
        return f"http://{service['spec']['clusterIP']}:{port}"

    def admin(self, path: str, *, pod_ip: str | None = None) -> Any:
        """The gateway's admin API (its own Service, with the operator's admin key), or one replica's."""
        key = self.secret(f"{RELEASE}-admin-keys", "operator")
        base = f"http://{pod_ip}:9000" if pod_ip else self.service_url(f"{RELEASE}-gateway-admin", 9000)
        request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer)

    def pods(self, selector: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        return [p for p in self.items("pods", namespace, selector) if not p["metadata"].get("deletionTimestamp")]

    def ready_pods(self, selector: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        return [p for p in self.pods(selector, namespace) if ready(p)]

    def job_logs(self, job: str, namespace: str = AGENTS) -> list[str]:
        pods = self.items("pods", namespace, f"job-name={job}")
        return [self.kubectl("logs", p["metadata"]["name"], "-n", namespace, check=False).stdout for p in pods]


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions", []))


def timed(name: str, check: Callable[[], T], timeout: float, what: str, interval: float = 1.0) -> T:
    with REPORT.phase(name):
        return eventually(check, timeout, what, interval)


def engine_pods(cluster: Cluster) -> list[dict[str, Any]]:
    return cluster.pods(f"autellix.ai/engine={ENGINE}")


def engine_urls(cluster: Cluster) -> set[str]:
    return {f"http://{p['status']['podIP']}:8000" for p in engine_pods(cluster) if p["status"].get("podIP")}


def gateway_engines(cluster: Cluster) -> list[dict[str, Any]]:
    return list(cluster.admin("/admin/engines")["data"])


# ---- the release ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(node: Node, images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """`helm install --wait` with the images built here: the chart's own three under its default registry
    and version, Envoy and the store from PyPI's wheels instead of Docker Hub's (`make images`), and
    requests sized for a 2-core node."""
    envoy, envoy_tag = images.envoy.rsplit(":", 1)
    store, store_tag = images.store.rsplit(":", 1)
    small = {"requests": {"cpu": "50m", "memory": "128Mi"}}
    values = {
        "gateway": {"resources": small},
        "operator": {"autoscaleInterval": 3, "programPollInterval": 2, "resources": small},
        "mesh": {"envoy": {"image": {"repository": envoy, "tag": envoy_tag}, "resources": small}},
        "store": {"image": {"repository": store, "tag": store_tag}, "resources": small},
    }
    file = tmp_path_factory.mktemp("release") / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    with REPORT.phase("helm install --wait"):
        node.kube.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", "--wait",
                       "--timeout", "10m", "-f", str(file), timeout=700)
    yield Cluster(node, images)
    node.kube.helm("uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", check=False, timeout=300)


def test_install_runs_every_pod(cluster: Cluster) -> None:
    """Every pod of the release is Running and Ready: two gateways, two Envoys, the store, two operators,
    one of which holds the Lease."""
    expected = {"gateway": 2, "envoy": 2, "store": 1, "operator": 2}
    for component, count in expected.items():
        pods = cluster.ready_pods(f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}")
        assert len(pods) == count, (component, [(p["metadata"]["name"], p["status"].get("phase")) for p in pods])
    operators = {p["metadata"]["name"] for p in cluster.pods("app.kubernetes.io/component=operator")}
    lease = eventually(lambda: (cluster.get("lease", f"{RELEASE}-operator") or {}).get("spec", {})
                       .get("holderIdentity"), 60, "an operator to hold the Lease")
    assert lease in operators, (lease, operators)


def test_engine_serves_through_the_gateway(cluster: Cluster) -> None:
    """crds/examples/engine-cpu.yaml: an AutellixEngine on the CPU engine image serving the tiny model;
    the gateway finds its pod through the Service's EndpointSlices."""
    engine = yaml.safe_load((EXAMPLES / "engine-cpu.yaml").read_text())
    engine["metadata"]["namespace"] = NAMESPACE
    engine["spec"]["autoscaling"] = AUTOSCALING
    cluster.apply(engine)
    timed("engine ready", lambda: len(cluster.ready_pods(f"autellix.ai/engine={ENGINE}")) == 1, 600,
          "the engine pod to be ready")
    [pod] = engine_pods(cluster)
    assert pod["spec"]["containers"][0]["image"] == cluster.images.engine
    url = f"http://{pod['status']['podIP']}:8000"
    seen = timed("gateway sees the engine", lambda: [e for e in gateway_engines(cluster)
                                                    if e["url"] == url and e["healthy"] and MODEL in e["models"]],
                 120, f"the gateway to list {url} serving {MODEL}")
    assert seen
    status = eventually(lambda: (cluster.get("autellixengine", ENGINE) or {}).get("status", {}), 60, "a status")
    assert status.get("readyReplicas") == 1, status


def run_job(cluster: Cluster, name: str, script: str, env: dict[str, str], *, parallelism: int = 1) -> None:
    """A Job in the agents' namespace running one of pod_scripts/ on the plain Debian base, with the tenant
    key from a Secret of that namespace."""
    container = {
        "name": "agent", "image": cluster.images.base, "imagePullPolicy": "IfNotPresent",
        "command": ["python3", f"/scripts/{script}"],
        "env": [{"name": k, "value": v} for k, v in env.items()]
        + [{"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "autellix-key", "key": "api-key"}}}],
        "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}},
        "volumeMounts": [{"name": "scripts", "mountPath": "/scripts"}],
    }
    cluster.apply({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": AGENTS},
                   "spec": {"parallelism": parallelism, "completions": parallelism, "backoffLimit": 0,
                            "template": {"spec": {"restartPolicy": "Never", "containers": [container],
                                                  "volumes": [{"name": "scripts",
                                                               "configMap": {"name": "scripts"}}]}}}})


def job_finished(cluster: Cluster, name: str) -> str | None:
    job = cluster.get("job", name, AGENTS) or {}
    for condition in job.get("status", {}).get("conditions", []):
        if condition["status"] == "True" and condition["type"] in ("Complete", "Failed"):
            return str(condition["type"])
    return None


def load_summaries(cluster: Cluster, job: str) -> list[dict[str, Any]]:
    """The JSON summary each of the Job's pods printed last (agent_load.py)."""
    return [json.loads(log.strip().splitlines()[-1]) for log in cluster.job_logs(job) if log.strip()]


def shown(summaries: list[dict[str, Any]]) -> str:
    """Job summaries for an assertion's message: whole, with every error (pytest shortens a list's repr)."""
    return json.dumps(summaries, indent=1)


def test_endpoint_from_another_namespace(cluster: Cluster) -> None:
    """A pod in another namespace calls http://autellix-envoy.autellix.svc/v1 with a tenant key read from the
    release's Secret: models, chat streamed and not, the Responses API with a chain, Anthropic's Messages,
    and a wrong key refused in OpenAI's shape."""
    cluster.kubectl("create", "namespace", AGENTS)
    key = cluster.secret(f"{RELEASE}-tenant-keys", "default")
    cluster.kubectl("create", "secret", "generic", "autellix-key", "-n", AGENTS, f"--from-literal=api-key={key}")
    cluster.kubectl("create", "configmap", "scripts", "-n", AGENTS, *(f"--from-file={s}" for s in
                                                                      sorted(SCRIPTS.glob("*.py"))))
    run_job(cluster, "endpoint", "endpoint_check.py", {"BASE_URL": ENDPOINT, "MODEL": MODEL})
    outcome = timed("endpoint checks", lambda: job_finished(cluster, "endpoint"), 300, "the endpoint Job")
    [log] = cluster.job_logs("endpoint")
    checks = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert outcome == "Complete" and checks and all(c["ok"] for c in checks), log
    assert {c["check"] for c in checks} == {"models", "chat", "chat_streamed", "responses", "messages",
                                            "wrong_key"}


def example_program(cluster: Cluster, name: str) -> dict[str, Any]:
    """crds/examples/program-react.yaml as shipped, but for two things this cluster lacks: a registry
    (python:3.12-slim cannot be pulled: the Debian base with its Python runs the same standard-library
    script) and a Llama 3.1 engine (the tiny model answers instead)."""
    program = yaml.safe_load((EXAMPLES / "program-react.yaml").read_text())
    program["metadata"] = {"name": name, "namespace": NAMESPACE}
    program["spec"]["image"] = cluster.images.base
    program["spec"]["command"] = ["python3", "-c"]
    program["spec"]["model"] = MODEL
    return program


def test_agent_program_runs_to_completion(cluster: Cluster) -> None:
    """The README's AgentProgram runs a multi-call ReAct program as a Job to completion; the gateway's table
    showed its session while it ran, and its status reports the calls, tokens and model time."""
    cluster.apply(example_program(cluster, "react-demo"))
    views: list[dict[str, Any]] = []

    def finished() -> str | None:
        status = (cluster.get("agentprogram", "react-demo") or {}).get("status", {})
        if status.get("phase") in ("Pending", "Running") and status.get("sessionId"):
            with contextlib.suppress(urllib.error.HTTPError):  # ended between the two reads
                views.append(cluster.admin(f"/admin/sessions/{status['sessionId']}"))
        return status.get("phase") if status.get("phase") in ("Succeeded", "Failed") else None

    phase = timed("AgentProgram to completion", finished, 600, "the AgentProgram to finish", interval=0.5)
    status = (cluster.get("agentprogram", "react-demo") or {})["status"]
    job_log = cluster.kubectl("logs", f"job/{status.get('jobName', 'react-demo')}", "-n", NAMESPACE,
                              check=False).stdout
    assert phase == "Succeeded", (status, job_log[-2000:])
    assert status["calls"] >= 2 and status["completionTokens"] > 0 and status["attainedService"] > 0, status
    assert status["sessionEnded"] is True, status
    assert any(v.get("calls_done", 0) + v.get("calls_active", 0) > 0 for v in views), views[-3:]
    REPORT.facts["agent_program"] = {k: status.get(k) for k in ("calls", "completionTokens", "attainedService",
                                                                  "programTokenLatency")}


def test_a_failed_program_says_why(cluster: Cluster) -> None:
    """The example program with a key the gateway does not know: its Job fails on the 401, and the
    AgentProgram shows phase Failed with the reason, as its status and as an Event `kubectl describe`
    prints."""
    cluster.kubectl("create", "secret", "generic", "wrong-key", "-n", NAMESPACE, "--from-literal=default=not-a-key")
    program = example_program(cluster, "wrong-key")
    program["spec"]["apiKeySecret"] = {"name": "wrong-key", "key": "default"}
    cluster.apply(program)
    status = eventually(lambda: (cluster.get("agentprogram", "wrong-key") or {}).get("status", {}).get("phase")
                        in ("Succeeded", "Failed") and cluster.get("agentprogram", "wrong-key"), 300,
                        "the program to end")["status"]
    assert status["phase"] == "Failed" and status["reason"] == "JobFailed", status
    described = cluster.kubectl("describe", "agentprogram", "wrong-key", "-n", NAMESPACE).stdout
    events = described[described.index("Events:"):]
    assert "JobFailed" in events and "autellix-operator" in events, described
    REPORT.facts["describe failed program"] = events


def served_by(cluster: Cluster, url: str) -> int:
    """Calls that an engine answered, over every gateway replica's recent calls."""
    count = 0
    for pod in cluster.ready_pods(f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=gateway"):
        calls = cluster.admin("/admin/calls?limit=1000", pod_ip=pod["status"]["podIP"])["data"]
        count += sum(1 for c in calls if c["result"] == "ok" and c["attempts"] and c["attempts"][-1]["engine"] == url)
    return count


def test_load_scales_the_engine_up(cluster: Cluster) -> None:
    """A Job of programs raises the engines' load above the target: the operator scales the engine from 1 to
    2, and the new engine pod serves calls."""
    first = engine_urls(cluster)
    run_job(cluster, "load", "agent_load.py", {"BASE_URL": ENDPOINT, "MODEL": MODEL, "PROGRAMS": "6",
                                               "TURNS": "6", "MAX_TOKENS": "128", "FULL_REPLIES": "1",
                                               "PAUSE_S": "0.1"}, parallelism=2)
    timed("scale up decided", lambda: (cluster.get("autellixengine", ENGINE) or {})["spec"].get("replicas") == 2,
          300, "the operator to set 2 replicas")
    timed("second engine ready", lambda: len(cluster.ready_pods(f"autellix.ai/engine={ENGINE}")) == 2, 600,
          "two ready engine pods")
    [new] = engine_urls(cluster) - first
    timed("second engine serves", lambda: served_by(cluster, new) > 0, 300, f"a call answered by {new}")


def lease_holder(cluster: Cluster) -> str | None:
    return (cluster.get("lease", f"{RELEASE}-operator") or {}).get("spec", {}).get("holderIdentity")


def test_faults_lose_no_program(cluster: Cluster) -> None:
    """While programs run (the load Job, and an AgentProgram started now): delete a gateway pod, the leading
    operator pod and an engine pod. Every call of every program succeeds, and the AgentProgram finishes."""
    cluster.apply(example_program(cluster, "through-faults"))
    gateways = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=gateway"
    with REPORT.phase("fault: a gateway pod deleted, replaced"):
        victim = cluster.ready_pods(gateways)[0]["metadata"]["name"]
        cluster.kubectl("delete", "pod", victim, "-n", NAMESPACE, "--wait=false")
        eventually(lambda: len(cluster.ready_pods(gateways)) == 2 and victim not in
                   {p["metadata"]["name"] for p in cluster.pods(gateways)}, 180, "two gateways again")
    with REPORT.phase("fault: the leading operator deleted, Lease taken over"):
        leader = lease_holder(cluster)
        assert leader is not None
        cluster.kubectl("delete", "pod", leader, "-n", NAMESPACE, "--wait=false")
        eventually(lambda: lease_holder(cluster) not in (None, leader), 120, "another operator to take the Lease")
    with REPORT.phase("fault: an engine pod deleted, replaced"):
        victim = engine_pods(cluster)[0]["metadata"]["name"]
        cluster.kubectl("delete", "pod", victim, "-n", NAMESPACE, "--wait=false")
        eventually(lambda: len(cluster.ready_pods(f"autellix.ai/engine={ENGINE}")) == 2 and victim not in
                   {p["metadata"]["name"] for p in cluster.pods(f"autellix.ai/engine={ENGINE}")}, 600,
                   "two ready engines again")
    phase = eventually(lambda: (cluster.get("agentprogram", "through-faults") or {}).get("status", {}).get("phase")
                       in ("Succeeded", "Failed") and cluster.get("agentprogram", "through-faults"), 600,
                       "the AgentProgram to finish")["status"]
    assert phase["phase"] == "Succeeded", phase


def stop_job(cluster: Cluster, job: str) -> None:
    """Tell every running pod of the Job to finish the programs it is in (agent_load.py's stop file)."""
    for pod in cluster.pods(f"job-name={job}", AGENTS):
        if pod["status"].get("phase") == "Running":
            cluster.kubectl("exec", "-n", AGENTS, pod["metadata"]["name"], "--", "touch", "/tmp/stop", check=False)


def test_idle_engine_is_drained_then_removed(cluster: Cluster) -> None:
    """The load ends (a trickle goes on): the operator drains one engine in the gateway, and only then
    removes its pod, back to 1 engine; no call of the load or of the trickle failed."""
    run_job(cluster, "trickle", "agent_load.py", {"BASE_URL": ENDPOINT, "MODEL": MODEL, "PROGRAMS": "1",
                                                  "TURNS": "4", "MAX_TOKENS": "16", "PAUSE_S": "0.5"})
    stop_job(cluster, "load")
    assert timed("load Job ends", lambda: job_finished(cluster, "load"), 300, "the load Job") == "Complete", \
        shown(load_summaries(cluster, "load"))
    load = load_summaries(cluster, "load")
    assert len(load) == 2 and all(s["failed"] == 0 and s["calls"] > 0 for s in load), shown(load)
    REPORT.facts["load"] = load
    draining: dict[str, float] = {}
    gone: dict[str, float] = {}
    before = engine_urls(cluster)

    def scaled_down() -> bool:
        status = (cluster.get("autellixengine", ENGINE) or {}).get("status", {})
        for url in (status.get("autoscaling") or {}).get("draining", []):
            draining.setdefault(url, time.monotonic())
        for engine in gateway_engines(cluster):
            if engine["draining"]:
                draining.setdefault(engine["url"], time.monotonic())
        for url in before - engine_urls(cluster):
            gone.setdefault(url, time.monotonic())
        return bool(gone) and len(cluster.ready_pods(f"autellix.ai/engine={ENGINE}")) == 1

    timed("scale down: drained, removed", scaled_down, 300, "the engine to scale back to 1", interval=0.5)
    [removed] = gone
    assert removed in draining and draining[removed] <= gone[removed], (draining, gone)
    described = cluster.kubectl("describe", "autellixengine", ENGINE, "-n", NAMESPACE).stdout
    events = described[described.index("Events:"):]
    assert all(reason in events for reason in ("Scaled", "Drained")), described
    REPORT.facts["describe engine"] = events
    stop_job(cluster, "trickle")
    assert eventually(lambda: job_finished(cluster, "trickle"), 300, "the trickle Job") == "Complete"
    trickle = load_summaries(cluster, "trickle")
    assert trickle and all(s["failed"] == 0 and s["calls"] > 0 for s in trickle), shown(trickle)
    REPORT.facts["trickle"] = trickle


class PodsGone:
    """While a namespace is deleted: when each of its pods went (the slowest is what the deletion waits on)."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.pods = {p["metadata"]["name"] for p in cluster.items("pods", namespace)}
        self.seconds: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(0.5) and len(self.seconds) < len(self.pods):
            done = self.cluster.kubectl("get", "pods", "-n", self.namespace, "-o", "name", check=False)
            left = {line.removeprefix("pod/") for line in done.stdout.split()}
            for pod in self.pods - left - set(self.seconds):
                self.seconds[pod] = round(time.monotonic() - started, 1)

    def __enter__(self) -> PodsGone:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


#: After a pass that finds pods still terminating, Kubernetes' namespace controller looks again only after
#: half the longest grace period among them, plus a second (its ``ResourcesRemainingError`` estimate): with
#: an engine's 120 s (its drain window), 61 s, however soon the pods are gone.
NAMESPACE_RECHECK_S = 120 / 2 + 1


def test_uninstall_and_namespace_deletion_finish(cluster: Cluster) -> None:
    """`helm uninstall`, then deleting the namespace with an engine and a running AgentProgram in it: the
    uninstall finishes within 60 s, every pod is gone within 60 s, and the namespace follows (within the
    namespace controller's own second look): nothing is left waiting."""
    cluster.apply(example_program(cluster, "left-running"))
    eventually(lambda: (cluster.get("agentprogram", "left-running") or {}).get("status", {}).get("sessionId"), 120,
               "the program's session")
    started = time.monotonic()
    cluster.node.kube.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "60s", timeout=90)
    REPORT.phases["helm uninstall --wait"] = uninstall = round(time.monotonic() - started, 1)
    bound = 60 + NAMESPACE_RECHECK_S
    started = time.monotonic()
    with PodsGone(cluster, NAMESPACE) as gone:
        done = cluster.kubectl("delete", "namespace", NAMESPACE, f"--timeout={bound:.0f}s", check=False,
                               timeout=bound + 30)
    REPORT.phases["namespace deleted"] = deleted = round(time.monotonic() - started, 1)
    REPORT.facts["namespace deletion: seconds until each pod was gone"] = gone.seconds
    assert done.returncode == 0, done.stderr
    assert set(gone.seconds) == gone.pods and max(gone.seconds.values(), default=0) < 60, gone.seconds
    assert uninstall < 60 and deleted < bound, (uninstall, deleted)
    assert cluster.get("namespace", NAMESPACE, "") is None
    cluster.kubectl("delete", "namespace", AGENTS, "--timeout=60s", check=False, timeout=90)
