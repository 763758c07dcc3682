"""Operator HA: two `autellix operator` processes on one Lease; exactly one reconciles, and when it is
killed (SIGKILL: no hand-over) the other takes over once the Lease has gone a lease duration unrenewed."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from autellix.kube.kubeapi import KubeApi
from autellix.kube.leader import LeaderElector, LeaseConfig, Observation, decide, lease_spec, record_of
from tests.kube.conftest import NAMESPACE, eventually
from tests.kube.kmock_cluster import Cluster
from tests.kube.test_engine_operator import DEPLOYMENTS, engine

LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/autellix-operator"


def lease(holder: str, renewed: str = "t1", version: str = "5") -> dict:
    return {"metadata": {"resourceVersion": version}, "spec": {"holderIdentity": holder, "renewTime": renewed}}


def test_decide() -> None:
    assert decide(None, "a", None, 0.0, 8) == "create"
    assert decide(lease("a"), "a", None, 0.0, 8) == "renew"
    assert decide(lease(""), "a", None, 0.0, 8) == "take"  # handed back
    seen = Observation(record_of(lease("b")), since=100.0)
    assert decide(lease("b"), "a", seen, 107.9, 8) == "wait"  # renewed less than a lease duration ago
    assert decide(lease("b"), "a", seen, 108.0, 8) == "take"  # unchanged for a whole lease duration
    assert decide(lease("b", renewed="t2", version="6"), "a", seen, 200.0, 8) == "wait"  # renewed since
    taken = lease_spec(lease("b"), "a", 8, taking=True)
    assert taken["holderIdentity"] == "a" and taken["leaseDurationSeconds"] == 8
    assert taken["leaseTransitions"] == 1 and taken["acquireTime"] == taken["renewTime"]
    assert "acquireTime" not in lease_spec(lease("a"), "a", 8, taking=False)


@pytest.mark.asyncio
async def test_a_lease_handed_back_is_taken_at_once_and_two_never_hold_it(cluster: Cluster, api: KubeApi) -> None:
    server = str(cluster.servers[0].url)
    a = LeaderElector(KubeApi.for_server(server), LeaseConfig(NAMESPACE, "autellix-operator", "a"))
    b = LeaderElector(KubeApi.for_server(server), LeaseConfig(NAMESPACE, "autellix-operator", "b"))
    try:
        assert await a.try_once() and not await b.try_once()
        assert await a.try_once() and not await b.try_once()  # renewed; b waits
        # both see the Lease free at once: one PUT wins, the other gets 409
        await a.release()
        assert (await api.get(LEASE))["spec"]["holderIdentity"] == ""
        won = await asyncio.gather(a.try_once(), b.try_once())
        assert sorted(won) == [False, True]
        lease = await api.get(LEASE)
        assert lease["spec"]["holderIdentity"] == ("a" if won[0] else "b")
        assert lease["spec"]["leaseTransitions"] == 1
    finally:
        await a.api.close()
        await b.api.close()


class Replicas:
    """`autellix operator --leader-lease` processes by name (their POD_NAME), each with its log."""

    def __init__(self, kubeconfig: Path, folder: Path) -> None:
        self.kubeconfig, self.folder = kubeconfig, folder
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str) -> None:
        with self.log(name).open("wb") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "autellix", "operator", "--gateway-url", "http://127.0.0.1:9",
                 "--leader-lease", f"{NAMESPACE}/autellix-operator", *args],
                stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.folder), "POD_NAME": name})

    def log(self, name: str) -> Path:
        return self.folder / f"{name}.log"

    def handled(self, name: str) -> int:
        """kopf's handler lines in the replica's log: what it reconciled."""
        return self.log(name).read_text().count("Handler 'engine")


@pytest.fixture
def replicas(cluster: Cluster, tmp_path: Path) -> Iterator[Replicas]:
    server = str(cluster.servers[0].url).rstrip("/")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "me", "user": {"token": "test"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "me"}}]}))
    running = Replicas(kubeconfig, tmp_path)
    yield running
    for proc in running.procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.asyncio
async def test_one_replica_reconciles_and_the_other_takes_over_when_it_dies(
        cluster: Cluster, api: KubeApi, replicas: Replicas) -> None:
    # The chart makes the Lease (helm uninstall removes it); the operator may update it, not create one.
    await api.create(LEASE.rsplit("/", 1)[0], {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                               "metadata": {"name": "autellix-operator", "namespace": NAMESPACE}})
    replicas.start("op-a")
    async def held() -> dict | None:
        lease = await api.get(LEASE)
        return lease if (lease.get("spec") or {}).get("holderIdentity") else None

    holder = await eventually(held, timeout=30, what="op-a to take the Lease")
    assert holder["spec"]["holderIdentity"] == "op-a"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    replicas.start("op-b", "--liveness", f"http://127.0.0.1:{port}/healthz")

    async def standing_by() -> bool:
        return any(agent == "autellix-operator (op-b)" for agent, *_ in cluster.requests)

    await eventually(standing_by, timeout=30, what="op-b to stand by")

    async def alive() -> bool:  # the kubelet's liveness probe of a standby replica
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as r:
            return r.status == 200

    await eventually(alive, timeout=10, what="op-b's liveness endpoint while it stands by")
    await api.create(f"/apis/autellix.ai/v1alpha1/namespaces/{NAMESPACE}/autellixengines", engine("ha"))
    await eventually(lambda: api.get(f"{DEPLOYMENTS}/ha"), timeout=20, what="op-a to reconcile")
    await asyncio.sleep(2)  # time for a second reconciler, if there were one, to act
    # exactly one reconciles: op-b's client touched nothing but the Lease, and kopf never ran in it
    touched = {(verb, res) for agent, verb, _, res, _ in cluster.requests if agent == "autellix-operator (op-b)"}
    assert touched and touched <= {("get", "leases"), ("update", "leases")}, touched
    assert replicas.handled("op-a") > 0 and replicas.handled("op-b") == 0

    replicas.procs["op-a"].send_signal(signal.SIGKILL)  # a crash: the Lease is not handed back
    await api.delete(f"{DEPLOYMENTS}/ha")
    await eventually(lambda: api.get(f"{DEPLOYMENTS}/ha"), timeout=30, what="op-b to take over")
    assert (await api.get(LEASE))["spec"]["holderIdentity"] == "op-b"

    async def reconciled_by_b() -> bool:
        return replicas.handled("op-b") > 0

    await eventually(reconciled_by_b, timeout=5, what="op-b's handler log")


@pytest.mark.asyncio
async def test_sigterm_stops_a_standby_replica_and_the_leader_alike(cluster: Cluster, api: KubeApi,
                                                                    replicas: Replicas) -> None:
    """What the kubelet sends a pod it deletes: each replica exits at once and cleanly, the leader handing
    the Lease back. A standby waiting for the Lease runs no kopf, whose signal handlers the leader has; in a
    container it is PID 1, which the kernel spares any signal without a handler, so it would sit out the
    pod's whole grace period (and hold up a namespace's deletion that long)."""
    await api.create(LEASE.rsplit("/", 1)[0], {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                               "metadata": {"name": "autellix-operator", "namespace": NAMESPACE}})
    replicas.start("op-a")

    async def held_by_a() -> bool:
        return ((await api.get(LEASE)).get("spec") or {}).get("holderIdentity") == "op-a"

    await eventually(held_by_a, timeout=30, what="op-a to take the Lease")
    replicas.start("op-b")

    async def standing_by() -> bool:
        return any(agent == "autellix-operator (op-b)" for agent, *_ in cluster.requests)

    await eventually(standing_by, timeout=30, what="op-b to stand by")
    for name in ("op-b", "op-a"):
        replicas.procs[name].send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(replicas.procs[name].wait, 10)
        assert code == 0, replicas.log(name).read_text()[-2000:]
    assert (await api.get(LEASE))["spec"]["holderIdentity"] == ""  # handed back: a new leader takes it at once
