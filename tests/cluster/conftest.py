"""One real Kubernetes control plane per test session: ``../shared/kubernetes`` (kube-apiserver with RBAC
and admission, the controller manager with every controller, the scheduler, two fake 8-GPU nodes and a
CPU node; no kubelet), driven with real kubectl and helm (``tests/chart/kube_binaries.py``).

What it is for: what kmock cannot show (tests/kube keeps the fast handler tests): the chart installed by
helm, the operator under the chart's own service account, RBAC and admission as a real API server
decides them, the scheduler's placement, the HPA, the garbage collector, ``helm uninstall``. Skipped,
with the reason, when ``../shared/kubernetes`` or the clients are absent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.chart.kube_binaries import BinaryUnavailable, find_helm, find_kubectl, helm_env

ROOT = Path(__file__).resolve().parents[2]
CONTROL_PLANE = ROOT.parent / "shared" / "kubernetes" / "control-plane"
T = TypeVar("T")


def eventually(check: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
    """Poll ``check`` until it returns something truthy (controllers and the operator act asynchronously)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")
        time.sleep(interval)


@dataclass
class Kube:
    """The control plane of this session, and its clients as cluster-admin."""

    folder: Path
    kubeconfig: Path
    kubectl_binary: Path
    helm_binary: Path

    def kubectl(self, *args: str, stdin: str | None = None, kubeconfig: Path | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(self.kubectl_binary), "--kubeconfig", str(kubeconfig or self.kubeconfig), *args],
                              input=stdin, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    def helm(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {**helm_env(self.folder / "helm"), "KUBECONFIG": str(self.kubeconfig)}
        done = subprocess.run([str(self.helm_binary), *args], capture_output=True, text=True, env=env,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        scope = ["-n", namespace] if namespace else []
        done = self.kubectl("get", kind, name, *scope, "-o", "json", "--ignore-not-found")
        return json.loads(done.stdout) if done.stdout.strip() else None

    def items(self, kind: str, namespace: str | None = None, selector: str | None = None) -> list[dict[str, Any]]:
        scope = ["-n", namespace] if namespace else ["-A"]
        done = self.kubectl("get", kind, *scope, *(["-l", selector] if selector else []), "-o", "json")
        return list(json.loads(done.stdout)["items"])

    def apply(self, *objects: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))

    @property
    def server(self) -> str:
        return str(yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"])

    @property
    def ca_file(self) -> Path:
        return self.folder / "pki" / "ca.crt"

    def service_account_kubeconfig(self, namespace: str, account: str, path: Path, *,
                                   default_namespace: str | None = None) -> tuple[Path, str]:
        """A kubeconfig (and its bearer token) that acts as the service account, as its pod's would:
        a token from ``kubectl create token``."""
        token = self.kubectl("create", "token", account, "-n", namespace, "--duration", "2h").stdout.strip()
        context: dict[str, Any] = {"cluster": "local", "user": account}
        if default_namespace:
            context["namespace"] = default_namespace
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "local",
            "clusters": [{"name": "local", "cluster": {"server": self.server,
                                                       "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": "local", "context": context}]}))
        return path, token

    def play_kubelet(self, namespace: str) -> list[str]:
        """What a kubelet does once a deleted pod's containers have stopped: remove the pods already being
        deleted (there is no kubelet here, so they would stay Terminating). Returns their names."""
        gone = [p["metadata"]["name"] for p in self.items("pods", namespace)
                if p["metadata"].get("deletionTimestamp")]
        if gone:
            self.kubectl("delete", "pods", *gone, "-n", namespace, "--force", "--grace-period=0",
                         "--ignore-not-found", "--wait=false")
        return gone


def _missing_tools() -> str | None:
    for tool in ("openssl", "curl", "xz"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (the control plane's script needs it)"
    if shutil.which("etcd") is None and os.geteuid() != 0:
        return "etcd is not installed, and installing it (apt-get install etcd-server) needs root"
    return None


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    if not CONTROL_PLANE.is_file():
        pytest.skip(f"no Kubernetes control plane at {CONTROL_PLANE}")
    if reason := _missing_tools():
        pytest.skip(reason)
    try:
        kubectl, helm = find_kubectl(), find_helm()
    except BinaryUnavailable as exc:
        pytest.skip(f"no kubectl/helm: {exc}")
    folder = tmp_path_factory.mktemp("control-plane")
    try:
        up = subprocess.run([str(CONTROL_PLANE), "up", str(folder)], capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, f"control-plane up: {up.stdout}\n{up.stderr}"
        nodes = subprocess.run([str(CONTROL_PLANE), "nodes", str(folder)], capture_output=True, text=True,
                               timeout=120)
        assert nodes.returncode == 0, f"control-plane nodes: {nodes.stdout}\n{nodes.stderr}"
        yield Kube(folder, folder / "admin.kubeconfig", kubectl, helm)
    finally:
        subprocess.run([str(CONTROL_PLANE), "down", str(folder)], capture_output=True, timeout=120)
