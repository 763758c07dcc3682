"""`helm upgrade` of a running release on a real control plane: turning the gateway's HPA on keeps the gateways
that run (the Deployment's spec.replicas, watched through the upgrade, never drops), an HPA's count survives a
later upgrade, and the generated store password is kept (lookup). Its own namespace and release, beside
test_release.py's."""

from __future__ import annotations

import base64
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cluster.conftest import ROOT, Kube, eventually

CHART = ROOT / "charts" / "autellix"
NAMESPACE = "upgrade"
RELEASE = "scaling"
GATEWAY = f"{RELEASE}-autellix-gateway"
STORE_PASSWORD = f"{RELEASE}-autellix-store-password"


@pytest.fixture(scope="module")
def release(kube: Kube) -> Iterator[str]:
    kube.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", "--set", "gateway.replicas=2",
              "--set", "auth.keepOnUninstall=false")
    yield RELEASE
    kube.helm("uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", check=False)
    eventually(lambda: not kube.items("deployments", NAMESPACE), 60, "the release's Deployments to go")
    kube.play_kubelet(NAMESPACE)
    kube.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


@contextmanager
def watched_replicas(kube: Kube, deployment: str) -> Iterator[list[int]]:
    """spec.replicas of every version of the Deployment from now on (kubectl's watch: each change is an event)."""
    seen: list[int] = []
    watch = subprocess.Popen(
        [str(kube.kubectl_binary), "--kubeconfig", str(kube.kubeconfig), "get", "deployment", deployment,
         "-n", NAMESPACE, "--watch", "-o", "jsonpath={.spec.replicas}{\"\\n\"}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def read() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:
            if line.strip():
                seen.append(int(line))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        eventually(lambda: seen, 30, f"the watch of {deployment} to start")
        yield seen
    finally:
        watch.terminate()
        watch.wait(10)
        reader.join(10)


def replicas(kube: Kube) -> int:
    return int((kube.get("deployment", GATEWAY, NAMESPACE) or {})["spec"]["replicas"])


def store_password(kube: Kube) -> str:
    return base64.b64decode((kube.get("secret", STORE_PASSWORD, NAMESPACE) or {})["data"]["password"]).decode()


def hpa_has_acted(kube: Kube) -> bool:
    """The HPA controller has looked at the gateway's HPA (it writes its conditions when it does)."""
    hpa = kube.get("horizontalpodautoscaler", GATEWAY, NAMESPACE) or {}
    return bool((hpa.get("status") or {}).get("conditions"))


def test_turning_the_gateway_hpa_on_keeps_the_running_gateways(kube: Kube, release: str, tmp_path: Path) -> None:
    assert replicas(kube) == 2
    assert kube.get("horizontalpodautoscaler", GATEWAY, NAMESPACE) is None
    password = store_password(kube)
    with watched_replicas(kube, GATEWAY) as seen:
        kube.helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
                  "--set", "gateway.autoscaling.enabled=true")
        # the HPA controller (15 s sync) would raise a dropped count back to minReplicas: watch until it has acted
        eventually(lambda: hpa_has_acted(kube), 60, "the HPA controller to act on the gateway's HPA", interval=1)
        time.sleep(2)
    assert seen and min(seen) >= 2, f"spec.replicas through the upgrade: {seen}"
    assert replicas(kube) == 2
    hpa = kube.get("horizontalpodautoscaler", GATEWAY, NAMESPACE) or {}
    assert hpa["spec"]["minReplicas"] == 2 and hpa["spec"]["scaleTargetRef"]["name"] == GATEWAY
    assert store_password(kube) == password  # kept by lookup, not generated anew


def test_an_upgrade_keeps_the_count_the_hpa_reached(kube: Kube, release: str) -> None:
    """What runs under the HPA (here scaled to 3 as the HPA would) stays through a later upgrade."""
    if kube.get("horizontalpodautoscaler", GATEWAY, NAMESPACE) is None:
        kube.helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
                  "--set", "gateway.autoscaling.enabled=true")
    kube.kubectl("scale", "deployment", GATEWAY, "-n", NAMESPACE, "--replicas=3")
    eventually(lambda: replicas(kube) == 3, 30, "the gateway at 3 replicas")
    with watched_replicas(kube, GATEWAY) as seen:
        kube.helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
                  "--set", "gateway.autoscaling.maxReplicas=5", "--set", "gateway.shutdownGrace=20")
        # the upgrade changes the pods' template (the grace period): the Deployment is rewritten
        eventually(lambda: (kube.get("deployment", GATEWAY, NAMESPACE) or {})["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"] == 35, 30, "the upgrade's Deployment")
        time.sleep(2)
    assert min(seen) == 3, f"spec.replicas through the upgrade: {seen}"
    assert replicas(kube) == 3
    assert (kube.get("horizontalpodautoscaler", GATEWAY, NAMESPACE) or {})["spec"]["maxReplicas"] == 5
