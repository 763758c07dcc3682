"""`autellix operator` as the pod runs it: a process, credentials from a kubeconfig, the emulator as its cluster."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from autellix.cli import app
from autellix.kube.kubeapi import KubeApi
from tests.kube.conftest import NAMESPACE, eventually
from tests.kube.kmock_cluster import Cluster
from tests.kube.test_engine_operator import DEPLOYMENTS, engine


@pytest.mark.asyncio
async def test_operator_command_serves_the_cluster_of_its_kubeconfig(cluster: Cluster, api: KubeApi,
                                                                      tmp_path: Path) -> None:
    server = str(cluster.servers[0].url).rstrip("/")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "me", "user": {"token": "test"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "me"}}]}))
    log = tmp_path / "operator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autellix", "operator", "--gateway-url", "http://127.0.0.1:9",
             "--autoscale-interval", "5", "--engine-image", "registry.example/engine:2",
             "--engine-gpu-image", "registry.example/engine-cuda:2", "--epp", "--epp-image", "registry.example/gw:2",
             "--epp-store-url", "redis://demo-store.autellix.svc:6379/0",
             "--epp-store-password-secret", "demo-autellix-store-password"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "KUBECONFIG": str(kubeconfig),
                                                       "HOME": str(tmp_path)})
    try:
        engines = f"/apis/autellix.ai/v1alpha1/namespaces/{NAMESPACE}/autellixengines"
        await api.create(engines, engine("cli"))  # one GPU per engine
        await api.create(engines, engine("cli-cpu", resources={}))
        deployment = await eventually(lambda: api.get(f"{DEPLOYMENTS}/cli"), timeout=30,
                                      what=f"the Deployment (operator log: {log})")
        assert deployment["spec"]["replicas"] == 2
        assert image(deployment) == "registry.example/engine-cuda:2"
        cpu = await eventually(lambda: api.get(f"{DEPLOYMENTS}/cli-cpu"), what="the CPU engine's Deployment")
        assert image(cpu) == "registry.example/engine:2"
        picker = await eventually(lambda: api.get(f"{DEPLOYMENTS}/cli-epp"), what="the engine's endpoint picker")
        env = {e["name"]: e for e in picker["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["AUTELLIX_STORE_PASSWORD"]["valueFrom"] == {"secretKeyRef": {
            "name": "demo-autellix-store-password", "key": "password"}}
        assert env["AUTELLIX_STORE"]["value"] == "redis://:$(AUTELLIX_STORE_PASSWORD)@demo-store.autellix.svc:6379/0"
    finally:
        proc.send_signal(signal.SIGTERM)  # what the kubelet sends: kopf stops gracefully
        code = await asyncio.to_thread(proc.wait, 20)
    assert code == 0, log.read_text()[-3000:]


def image(deployment: dict[str, Any]) -> str:
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


@pytest.mark.parametrize(("args", "error"), [
    (["--epp", "--epp-image", "gw:1", "--epp-store-password-secret", "pw"],
     "--epp-store-password-secret needs --epp-store-url"),
    (["--epp", "--epp-image", "gw:1", "--epp-store-url", "store:6379", "--epp-store-password-secret", "pw"],
     "--epp-store-url: expected redis://HOST:PORT/DB, got 'store:6379'"),
])
def test_bad_operator_flags_are_refused_naming_the_flag(args: list[str], error: str) -> None:
    result = CliRunner().invoke(app, ["operator", *args])
    assert result.exit_code == 2 and f"error: {error}" in result.output, result.output
