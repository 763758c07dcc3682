"""`autellix operator` as the pod runs it: a process, credentials from a kubeconfig, the emulator as its cluster."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autellix.kube.kubeapi import KubeApi
from tests.kube.conftest import NAMESPACE, eventually
from tests.kube.kmock_cluster import Cluster
from tests.kube.test_engine_operator import DEPLOYMENTS, engine

pytestmark = pytest.mark.asyncio


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
             "--autoscale-interval", "5"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "KUBECONFIG": str(kubeconfig),
                                                       "HOME": str(tmp_path)})
    try:
        await api.create(f"/apis/autellix.ai/v1alpha1/namespaces/{NAMESPACE}/autellixengines", engine("cli"))
        deployment = await eventually(lambda: api.get(f"{DEPLOYMENTS}/cli"), timeout=30,
                                      what=f"the Deployment (operator log: {log})")
        assert deployment["spec"]["replicas"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)  # what the kubelet sends: kopf stops gracefully
        code = await asyncio.to_thread(proc.wait, 20)
    assert code == 0, log.read_text()[-3000:]
