"""crds/examples against the release they are applied next to (`kubectl apply -n autellix -f ...` after
`helm install autellix charts/autellix -n autellix`): every Secret and claim their pods need exists, the
GPU engines can be placed on tainted GPU nodes, and the AgentProgram is a real multi-call agent that calls
with the release's tenant key and fails loudly. Their AutellixEngines and AgentPrograms are checked against
the CRDs by tests/kube/test_crds.py; the other objects here, with kubernetes-validate."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from autellix.kube.manifests import engine_deployment, program_job
from autellix.kube.spec import parse_engine, parse_program
from tests.chart import test_chart as chart
from tests.chart.test_chart import CHART, ROOT, VERSIONS, container

helm = chart.helm
EXAMPLES = ROOT / "crds" / "examples"
#: The README's install: release autellix in namespace autellix; the examples are applied there.
RELEASE = NAMESPACE = "autellix"
#: The taint of GPU nodes (NVIDIA's GPU operator, the test cluster's fake GPU nodes).
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"}


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def release(helm: Callable[..., subprocess.CompletedProcess]) -> list[dict[str, Any]]:
    done = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def engine_token_secret(release: list[dict[str, Any]]) -> str:
    [arg] = [a for a in container(release, "operator")["args"] if a.startswith("--engine-token-secret=")]
    return arg.split("=", 1)[1]


def pod_of(doc: dict[str, Any], release: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The pod spec an example object ends up running: the operator's for its resources, the object's own for
    workloads; None for what runs no pod (claims, autoscalers)."""
    name = doc["metadata"]["name"]
    if doc["kind"] == "AutellixEngine":
        made = engine_deployment(name, NAMESPACE, "uid", parse_engine(doc["spec"]),
                                 token_secret=engine_token_secret(release))
        return made["spec"]["template"]["spec"]
    if doc["kind"] == "AgentProgram":
        job = program_job(name, NAMESPACE, "uid", parse_program(doc["spec"]), gateway="http://gw", session_id="s")
        return job["spec"]["template"]["spec"]
    if doc["kind"] in ("Job", "Deployment"):
        return doc["spec"]["template"]["spec"]
    return None


def needs(pod: dict[str, Any]) -> set[tuple[str, str, str | None]]:
    """What a pod needs to start: ("PersistentVolumeClaim", name, None), ("Secret", name, data key or None)."""
    found: set[tuple[str, str, str | None]] = set()
    for volume in pod.get("volumes", []):
        if "persistentVolumeClaim" in volume:
            found.add(("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"], None))
        if "secret" in volume:
            found.add(("Secret", volume["secret"]["secretName"], None))
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        for entry in c.get("env", []):
            if ref := entry.get("valueFrom", {}).get("secretKeyRef"):
                found.add(("Secret", ref["name"], ref["key"]))
        for source in c.get("envFrom", []):
            if "secretRef" in source:
                found.add(("Secret", source["secretRef"]["name"], None))
    for pull in pod.get("imagePullSecrets", []):
        found.add(("Secret", pull["name"], None))
    return found


def provided(docs: list[dict[str, Any]]) -> set[tuple[str, str, str | None]]:
    """What manifests make: claims by name, Secrets by name and by each data key."""
    made: set[tuple[str, str, str | None]] = set()
    for doc in docs:
        if doc["kind"] == "PersistentVolumeClaim":
            made.add(("PersistentVolumeClaim", doc["metadata"]["name"], None))
        if doc["kind"] == "Secret" and doc["metadata"].get("namespace", NAMESPACE) == NAMESPACE:
            made.add(("Secret", doc["metadata"]["name"], None))
            made |= {("Secret", doc["metadata"]["name"], key) for key in {**doc.get("data", {}),
                                                                          **doc.get("stringData", {})}}
    return made


def documented(path: Path) -> set[tuple[str, str, str | None]]:
    """Secrets the file's comments say how to make: `kubectl create secret generic NAME -n autellix
    --from-literal=KEY=...`."""
    made: set[tuple[str, str, str | None]] = set()
    comments = "\n".join(line.lstrip("# ") for line in path.read_text().splitlines() if line.startswith("#"))
    for command in re.findall(r"kubectl create secret generic .*", comments):
        words = command.split()
        name = words[4]
        assert words[5:7] == ["-n", NAMESPACE], f"{path.name}: {command} (the namespace the examples go in)"
        made.add(("Secret", name, None))
        made |= {("Secret", name, key) for key in re.findall(r"--from-literal=([^=\s]+)=", command)}
    return made


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_secret_and_claim_an_example_needs_is_made(path: Path, release: list[dict[str, Any]]) -> None:
    """... by the same file, by the release, or by a command its comments give."""
    docs = documents(path)
    wanted = {need for doc in docs if (pod := pod_of(doc, release)) is not None for need in needs(pod)}
    there = provided(docs) | provided(release) | documented(path)
    assert wanted <= there, sorted(wanted - there, key=str)


def test_the_reference_check_can_fail(release: list[dict[str, Any]]) -> None:
    """What the check above reads: a hub token, a cache claim, a key Secret the release does not make."""
    engine = {"kind": "AutellixEngine", "metadata": {"name": "e"},
              "spec": {"model": {"name": "m", "source": {"hub": "org/m"}, "hubTokenSecret": {"name": "hf"},
                                 "cache": {"pvc": {"claimName": "cache"}}}}}
    program = {"kind": "AgentProgram", "metadata": {"name": "p"},
               "spec": {"image": "python", "apiKeySecret": {"name": f"{RELEASE}-autellix-tenant-keys", "key": "x"}}}
    wanted = needs(pod_of(engine, release) or {}) | needs(pod_of(program, release) or {})
    missing = wanted - provided(release)
    assert missing == {("Secret", "hf", "token"), ("PersistentVolumeClaim", "cache", None),
                       ("Secret", f"{RELEASE}-autellix-tenant-keys", "x")}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_examples_other_objects_are_valid_kubernetes(version: str) -> None:
    """Claims and Jobs shipped with the examples (their AutellixEngines and AgentPrograms: tests/kube/test_crds.py,
    the autoscalers: tests/kube/test_external_autoscalers.py)."""
    checked = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in documents(path):
            if doc["apiVersion"] in ("v1", "batch/v1", "apps/v1"):
                kubernetes_validate.validate(doc, version, strict=True)
                checked.append((path.name, doc["kind"]))
    assert ("engine-llama.yaml", "PersistentVolumeClaim") in checked
    assert ("engine-pvc.yaml", "PersistentVolumeClaim") in checked


# ---- GPU engines are placed on GPU nodes ------------------------------------------------------------------
def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, str]) -> bool:
    """Kubernetes' ToleratesTaint: an empty key with Exists tolerates everything; effect empty = every effect."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if not t.get("key"):
            if t.get("operator") == "Exists":
                return True
            continue
        if t["key"] != taint["key"]:
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value", "") == taint["value"]:
            return True
    return False


def test_example_gpu_engines_tolerate_the_gpu_nodes_taint(release: list[dict[str, Any]]) -> None:
    engines = [d for path in sorted(EXAMPLES.glob("engine-*.yaml")) for d in documents(path)
               if d["kind"] == "AutellixEngine" and parse_engine(d["spec"]).gpus > 0]
    assert {"llama-8b", "qwen-7b"} <= {d["metadata"]["name"] for d in engines}
    placed = {d["metadata"]["name"]: pod_of(d, release) or {} for d in engines}
    for doc in engines:
        pod = placed[doc["metadata"]["name"]]
        assert tolerates(pod.get("tolerations", []), GPU_TAINT), doc["metadata"]["name"]
        assert pod.get("nodeSelector") == {"nvidia.com/gpu.present": "true"}, doc["metadata"]["name"]
    for doc in engines:  # asking for GPUs and naming no image: the operator's GPU engine image, not the CPU one
        assert "image" not in doc["spec"], doc["metadata"]["name"]
    assert not tolerates([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "x"}], GPU_TAINT)
    assert not tolerates([], GPU_TAINT)


# ---- the AgentProgram: a multi-call agent with the release's key ----------------------------------------------
def program() -> dict[str, Any]:
    [doc] = documents(EXAMPLES / "program-react.yaml")
    return doc


def test_the_program_calls_with_the_releases_tenant_key(release: list[dict[str, Any]]) -> None:
    spec = program()["spec"]
    [keys] = [d for d in release if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-tenant-keys")]
    assert spec["apiKeySecret"] == {"name": keys["metadata"]["name"], "key": "default"}
    assert "default" in keys["data"]  # the tenant the release generates
    job = program_job("react-demo", NAMESPACE, "uid", parse_program(spec), gateway="http://gw", session_id="s")
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["OPENAI_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": keys["metadata"]["name"],
                                                                   "key": "default"}}


@dataclass
class FakeGateway:
    """The gateway's chat completions route, answering the replies it is given in turn (or ``status``)."""

    replies: list[str]
    status: int = 200
    body: dict[str, Any] | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.calls.append({"path": self.path, "headers": dict(self.headers), "body": request})
                if fake.status != 200:
                    answer: dict[str, Any] = {"error": {"message": "invalid api key", "code": "invalid_api_key"}}
                elif fake.body is not None:
                    answer = fake.body
                else:
                    answer = {"choices": [{"message": {"role": "assistant", "content": fake.replies.pop(0)}}]}
                data = json.dumps(answer).encode()
                self.send_response(fake.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                return None
        return Handler


@pytest.fixture
def fake_gateway() -> Iterator[Callable[..., FakeGateway]]:
    servers: list[ThreadingHTTPServer] = []

    def start(**kwargs: Any) -> FakeGateway:
        fake = FakeGateway(**kwargs)
        server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        fake.url = f"http://127.0.0.1:{server.server_address[1]}"
        return fake
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def run_program(gateway_url: str, key: str = "sk-tenant-default-0123456789") -> subprocess.CompletedProcess[str]:
    """The example's container as its Job runs it: its command and args, the environment the operator gives it
    (the key's Secret resolved to ``key``)."""
    spec = program()["spec"]
    job = program_job("react-demo", NAMESPACE, "uid", parse_program(spec), gateway=gateway_url, session_id="sess-1")
    made = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value", key) for e in made["env"]}
    assert made["command"] == ["python", "-c"]
    return subprocess.run([sys.executable, "-c", *made["args"]], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], **env})


def test_the_program_is_a_react_loop_carrying_its_conversation(fake_gateway: Callable[..., FakeGateway]) -> None:
    fake = fake_gateway(replies=[
        "Thought: count the GPUs, then take away the ones down.\nAction: calculate[3 * 14 * 8 - 37]",
        "Thought: now the share.\nAction: calculate[299 / (3 * 14 * 8)]",
        "Thought: done.\nFinal Answer: 299 GPUs are up, 89% of them.",
    ])
    done = run_program(fake.url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "answer: 299 GPUs are up, 89% of them." in done.stdout
    assert len(fake.calls) == 3
    for call in fake.calls:
        assert call["path"] == "/v1/chat/completions"
        assert call["headers"]["Authorization"] == "Bearer sk-tenant-default-0123456789"
        assert call["headers"]["X-Autellix-Session"] == "sess-1"
        assert call["body"]["model"] == "llama-3.1-8b"
    # each call carries the conversation so far: the one before, its answer, and the tool's observation
    first, second, third = (c["body"]["messages"] for c in fake.calls)
    assert [m["role"] for m in first] == ["system", "user"]
    assert second[:2] == first and second[2]["role"] == "assistant" and "calculate[3 * 14 * 8 - 37]" in \
        second[2]["content"]
    assert second[3] == {"role": "user", "content": "Observation: 299"}
    assert third[:4] == second and third[5]["content"].startswith("Observation: 0.889")


def test_the_program_fails_loudly(fake_gateway: Callable[..., FakeGateway]) -> None:
    refused = run_program(fake_gateway(replies=[], status=401).url)
    assert refused.returncode != 0
    assert "401" in refused.stderr and "invalid_api_key" in refused.stderr
    odd = run_program(fake_gateway(replies=[], body={"object": "list", "data": []}).url)
    assert odd.returncode != 0 and "not a chat completion" in odd.stderr
    nobody = run_program("http://127.0.0.1:9")
    assert nobody.returncode != 0 and "Connection refused" in nobody.stderr
