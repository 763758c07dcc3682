"""The operator's xDS membership (``autellix.mesh.kube_source``) against the emulated cluster: the gateway
Service's EndpointSlices, as the cluster changes them, reach the control plane's snapshot (what Envoy gets).

Sorted before ``test_rbac.py``: its requests (list and watch of EndpointSlices, named as the operator's)
count in the RBAC check.
"""

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
from kubernetes_asyncio import client

from autellix.child_processes import free_ports
from autellix.kube.kubeapi import KubeApi
from autellix.mesh.control_plane import ControlPlane
from autellix.mesh.envoy import start_envoy, wait_envoy_ready
from autellix.mesh.kube_source import GatewayMembership
from autellix.mesh.resources import ENDPOINT_TYPE, GatewayEndpoint, MeshSettings
from autellix.mesh.snapshot import ANY_NODE
from tests.kube.conftest import NAMESPACE, ROOT, eventually
from tests.kube.kmock_cluster import Cluster
from tests.live import chat, http

pytestmark = pytest.mark.asyncio
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
SERVICE = "autellix-gateway"


def gateway_slice(name: str, service: str, endpoints: list[tuple[str, bool, bool]]) -> dict[str, Any]:
    """A slice as the EndpointSlice controller keeps it: (pod IP, ready, terminating) per pod."""
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NAMESPACE,
                     "labels": {"kubernetes.io/service-name": service, "app.kubernetes.io/component": "gateway"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready, "serving": True, "terminating": terminating},
                       "targetRef": {"kind": "Pod", "name": f"gateway-{ip}", "namespace": NAMESPACE}}
                      for ip, ready, terminating in endpoints],
    }


def snapshot_addresses(plane: ControlPlane) -> set[str]:
    """The gateway addresses in the endpoints Envoy would be sent now."""
    snapshot = plane.cache.get(ANY_NODE)
    assert snapshot is not None
    assignments = snapshot.select(ENDPOINT_TYPE, [MeshSettings().cluster_name])
    return {f"{lb.endpoint.address.socket_address.address}:{lb.endpoint.address.socket_address.port_value}"
            for assignment in assignments for locality in assignment.endpoints for lb in locality.lb_endpoints}


async def test_gateway_endpointslices_reach_the_snapshot(cluster: Cluster, api: KubeApi) -> None:
    plane = ControlPlane(MeshSettings())
    await plane.start()
    membership = GatewayMembership(plane, SERVICE, NAMESPACE,
                                   configuration=client.Configuration(host=str(cluster.servers[0].url).rstrip("/")))
    watching = asyncio.create_task(membership.run())
    try:
        async def published(*addresses: str) -> bool:
            return snapshot_addresses(plane) == set(addresses) and \
                plane.gateways() == {GatewayEndpoint(a.split(":")[0], int(a.split(":")[1])) for a in addresses}

        await eventually(lambda: published(), what="an empty membership at first")
        await api.create(SLICES, gateway_slice("gw-a", SERVICE, [("10.0.0.1", True, False),
                                                                  ("10.0.0.2", True, False),
                                                                  ("10.0.0.3", False, False)]))
        # another Service's slice (e.g. the admin Service's) is not the gateway's OpenAI endpoint
        await api.create(SLICES, gateway_slice("gw-admin-a", "autellix-gateway-admin", [("10.0.0.9", True, False)]))
        await eventually(lambda: published("10.0.0.1:8000", "10.0.0.2:8000"), what="the two ready pods")
        # a rolling update: 10.0.0.2 terminates (SIGTERM: not ready), 10.0.0.3 passed its readiness probe
        await api.replace(f"{SLICES}/gw-a", {**(await api.get(f"{SLICES}/gw-a") or {}),
                                             "endpoints": gateway_slice("gw-a", SERVICE, [
                                                 ("10.0.0.1", True, False), ("10.0.0.2", False, True),
                                                 ("10.0.0.3", True, False)])["endpoints"]})
        await eventually(lambda: published("10.0.0.1:8000", "10.0.0.3:8000"), what="the terminating pod out")
        # a second slice of the Service (large Services have several) adds up; deleting one takes its pods out
        await api.create(SLICES, gateway_slice("gw-b", SERVICE, [("10.0.1.1", True, False)]))
        await eventually(lambda: published("10.0.0.1:8000", "10.0.0.3:8000", "10.0.1.1:8000"), what="slice b")
        await api.delete(f"{SLICES}/gw-a")
        await eventually(lambda: published("10.0.1.1:8000"), what="slice a deleted")
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await membership.aclose()
        await plane.close()


def kubeconfig_for(cluster: Cluster, path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": str(cluster.servers[0].url).rstrip("/")}}],
        "users": [{"name": "me", "user": {"token": "test"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "me"}}]}))
    return path


def call_status(url: str) -> int:
    try:
        return http("POST", url + "/v1/chat/completions", chat(max_tokens=1))[0]
    except OSError:
        return 0


async def test_operator_command_serves_envoy_the_gateway_pods(cluster: Cluster, api: KubeApi,
                                                               tmp_path: Path) -> None:
    """`autellix operator --xds-port`, a real gateway process and real Envoy: a gateway pod published in the
    gateway Service's EndpointSlice takes calls through Envoy; its slice gone, Envoy has no replica."""
    engine_port, gateway_port, xds_port, envoy_port = free_ports(4)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig_for(cluster, tmp_path / "kubeconfig")), "HOME": str(tmp_path)}
    argvs = {
        "engine": [sys.executable, str(ROOT / "experiments" / "instant_engine.py"), "--port", str(engine_port)],
        "gateway": [sys.executable, "-m", "autellix", "gateway", "--port", str(gateway_port),
                    "--engine", f"http://127.0.0.1:{engine_port}"],
        "operator": [sys.executable, "-m", "autellix", "operator", "--gateway-url", "http://127.0.0.1:9",
                     "--xds-port", str(xds_port), "--xds-namespace", NAMESPACE, "--xds-gateway-service", SERVICE,
                     "--xds-listen-host", "127.0.0.1", "--xds-listen-port", str(envoy_port)],
    }
    procs: dict[str, subprocess.Popen[bytes]] = {}
    envoy = None
    try:
        for name, argv in argvs.items():
            with (tmp_path / f"{name}.log").open("wb") as log:
                procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        envoy = start_envoy("127.0.0.1", xds_port, listen_port=envoy_port, workdir=tmp_path / "envoy")
        await asyncio.to_thread(wait_envoy_ready, envoy, 30)  # its listener and cluster came from the operator
        await api.create(SLICES, gateway_slice("gw-real", SERVICE, [("127.0.0.1", True, False)]) | {
            "ports": [{"name": "http", "port": gateway_port, "protocol": "TCP"}]})
        await eventually(lambda: asyncio.to_thread(lambda: call_status(envoy.listen_url) == 200), timeout=30,
                         what=f"a call through Envoy (logs in {tmp_path})")
        await api.delete(f"{SLICES}/gw-real")
        await eventually(lambda: asyncio.to_thread(lambda: call_status(envoy.listen_url) == 503), timeout=5,
                         what="no replica in Envoy once the slice is gone")
    finally:
        if envoy is not None:
            envoy.stop()
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                await asyncio.to_thread(proc.wait, 15)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert procs["operator"].returncode == 0, (tmp_path / "operator.log").read_text()[-3000:]
