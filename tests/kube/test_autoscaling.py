"""Autoscaling end to end in the emulator: load rises and falls, replicas follow within bounds,
without flapping, and an engine is removed only after the gateway has drained it."""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from autellix.kube.kubeapi import KubeApi
from autellix.kube.manifests import POD_DELETION_COST
from tests.kube.conftest import NAMESPACE, Gateway, OperatorFactory, events_about, eventually
from tests.kube.fake_engine import FakeEngine, endpoint_slice
from tests.kube.kmock_cluster import Cluster

pytestmark = pytest.mark.asyncio

NAME = "llama"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
DEPLOYMENT = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{NAME}"


@dataclass
class Controllers:
    """Plays the cluster's Deployment and EndpointSlice controllers for one engine Deployment: keeps
    spec.replicas engine pods (each a FakeEngine with its EndpointSlice), removes the pod with the
    lowest pod-deletion-cost first, and spreads the offered load over the engines the gateway does
    not drain (a draining engine's calls have finished)."""

    api: KubeApi
    cluster: Cluster
    gateway: Gateway
    offered: float = 0.0
    pods: dict[str, FakeEngine] = field(default_factory=dict)
    #: spec.replicas of the Deployment, each time it changed.
    replicas: list[int] = field(default_factory=list)
    #: The gateway's view of each engine at the moment its pod was removed.
    removed: list[dict[str, Any]] = field(default_factory=list)
    serial: int = 0

    async def engines(self) -> dict[str, dict[str, Any]]:
        async with aiohttp.ClientSession() as http, http.get(f"{self.gateway.admin_url}/admin/engines") as r:
            return {e["url"]: e for e in (await r.json())["data"]}

    async def step(self) -> None:
        deployment = self.cluster.get("apps/v1/deployments", NAMESPACE, NAME)
        want = deployment["spec"]["replicas"] if deployment else 0
        if deployment and (not self.replicas or self.replicas[-1] != want):
            self.replicas.append(want)
        while len(self.pods) < want:
            self.serial += 1
            pod, engine = f"{NAME}-{self.serial}", await FakeEngine().start()
            await self.api.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": pod, "namespace": NAMESPACE, "labels": {"autellix.ai/engine": NAME}},
                "spec": {"containers": [{"name": "engine", "image": "engine"}]}})
            await self.api.create(SLICES, endpoint_slice(NAME, NAMESPACE, pod, engine.port))
            self.pods[pod] = engine
        while len(self.pods) > want:
            def cost(pod: str) -> int:
                meta = self.cluster.get("v1/pods", NAMESPACE, pod)["metadata"]
                return int((meta.get("annotations") or {}).get(POD_DELETION_COST, "0"))
            pod = min(self.pods, key=cost)
            engine = self.pods.pop(pod)
            self.removed.append((await self.engines()).get(engine.url, {"url": engine.url, "unknown": True}))
            await self.api.delete(f"{SLICES}/{NAME}-{pod}")
            await self.api.delete(f"{PODS}/{pod}")
            await engine.stop()
        if deployment and deployment.get("status", {}).get("readyReplicas") != len(self.pods):
            await self.api.merge_patch(f"{DEPLOYMENT}/status", {"status": {"readyReplicas": len(self.pods),
                                                                           "replicas": len(self.pods)}})
        seen = await self.engines()
        serving = [e for e in self.pods.values() if not seen.get(e.url, {}).get("draining")]
        for engine in self.pods.values():
            engine.running = self.offered / len(serving) if engine in serving else 0.0

    async def run(self) -> None:
        while True:
            await self.step()
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        for engine in self.pods.values():
            await engine.stop()


async def test_replicas_follow_load_within_bounds_without_flapping(
        cluster: Cluster, api: KubeApi, gateway: Gateway, operator: OperatorFactory) -> None:
    controllers = Controllers(api, cluster, gateway, offered=4.0)
    loop = asyncio.create_task(controllers.run())
    try:
        await operator(gateway_url=gateway.url, autoscale_interval=0.2)
        await api.create(f"/apis/autellix.ai/v1alpha1/namespaces/{NAMESPACE}/autellixengines", {
            "apiVersion": "autellix.ai/v1alpha1", "kind": "AutellixEngine",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {"model": {"name": "tiny-llama", "source": {"path": "/models/tiny"}}, "replicas": 1,
                     "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 3, "targetLoad": 10,
                                     "scaleUpWindowSeconds": 0.6, "scaleDownWindowSeconds": 1.2}}})

        async def load_seen(total: float) -> bool:
            obj = await api.get(f"/apis/autellix.ai/v1alpha1/namespaces/{NAMESPACE}/autellixengines/{NAME}")
            return obj.get("status", {}).get("load") == total

        # Low load: one engine is enough (the status shows the load the autoscaler reads).
        await eventually(lambda: load_seen(4.0), what="load 4 in status")
        await asyncio.sleep(1.0)
        assert controllers.replicas == [1]

        # Load rises to 25 calls at 10 per engine: three engines (the maximum), and it stays there.
        controllers.offered = 25.0
        await eventually(lambda: _equals(controllers, 3), timeout=15, what="3 replicas")
        await asyncio.sleep(1.5)
        assert controllers.replicas[-1] == 3

        # Load falls to nothing: after the scale-down window the extra engines are drained, then removed.
        controllers.offered = 0.0
        await eventually(lambda: _equals(controllers, 1, settled=True), timeout=15, what="back to 1 replica")
        await asyncio.sleep(1.0)
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
        await controllers.stop()

    history = controllers.replicas
    assert all(1 <= r <= 3 for r in history), history
    peak = history.index(3)
    assert history[: peak + 1] == sorted(history[: peak + 1]), history  # only up, then ...
    assert history[peak:] == sorted(history[peak:], reverse=True), history  # ... only down: no flapping
    assert history[-1] == 1 and len(controllers.removed) == 2
    for engine in controllers.removed:  # never an engine with work: drained and idle in the gateway
        assert engine.get("draining") is True and engine["inflight"] == 0 and engine["load"] == 0, engine

    # `kubectl describe` tells the story: each scaling with the load that decided it, each drained engine.
    events = await events_about(api, await api.get(f"/apis/autellix.ai/v1alpha1/namespaces/{NAMESPACE}/"
                                                  f"autellixengines/{NAME}"))
    scaled = [e["message"] for e in events if e["reason"] == "Scaled"]
    assert scaled[0] == "Scaled from 1 to 3 engines: load 25 (running + waiting calls) at a target of 10 per engine."
    assert re.match(r"Scaled from [23] to 1 engines: load 0 .*; removing drained, idle http", scaled[-1]), scaled
    drained = [e["message"] for e in events if e["reason"] == "Drained"]
    for engine in controllers.removed:
        assert any(f"Engine {engine['url']} (pod " in m for m in drained), (engine, drained)
    assert {e["type"] for e in events if e["reason"] in ("Scaled", "Drained")} == {"Normal"}


async def _equals(controllers: Controllers, replicas: int, settled: bool = False) -> bool:
    return bool(controllers.replicas) and controllers.replicas[-1] == replicas and \
        (not settled or len(controllers.pods) == replicas)
