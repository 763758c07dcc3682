"""AutellixEngine through kopf and the emulator: create, update, delete, drift repair, status."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from autellix.kube.kubeapi import KubeApi
from tests.kube.conftest import NAMESPACE, OperatorFactory, eventually
from tests.kube.kmock_cluster import Cluster

pytestmark = pytest.mark.asyncio

DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
SERVICES = f"/api/v1/namespaces/{NAMESPACE}/services"


def engine(name: str = "llama", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "autellix.ai/v1alpha1", "kind": "AutellixEngine",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"model": {"name": "llama-8b", "source": {"hub": "meta-llama/Llama-3.1-8B-Instruct"}},
                     "resources": {"gpus": 1}, "replicas": 2, "vllmArgs": ["--max-num-seqs", "64"], **spec}}


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


async def test_create_update_delete_drive_deployment_and_service(
        cluster: Cluster, api: KubeApi, operator: OperatorFactory, engine_path: Callable[..., str]) -> None:
    await operator()
    created = await api.create(engine_path(), engine())

    deployment = await eventually(lambda: api.get(f"{DEPLOYMENTS}/llama"), what="the Deployment")
    service = await eventually(lambda: api.get(f"{SERVICES}/llama"), what="the Service")
    assert deployment["spec"]["replicas"] == 2
    args = container(deployment)["args"]
    assert args[:4] == ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama-8b"]
    assert "--enable-prefix-caching" in args and args[-2:] == ["--max-num-seqs", "64"]
    assert container(deployment)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    owner = deployment["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("AutellixEngine", created["metadata"]["uid"], True)
    assert service["metadata"]["labels"]["autellix.ai/engine"] == "llama"
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]

    async def status_says(ready: int, reason: str) -> dict[str, Any] | None:
        obj = await api.get(engine_path("llama"))
        st = obj.get("status", {})
        ok = st.get("readyReplicas") == ready and condition(obj, "Ready")["reason"] == reason
        return obj if ok and condition(obj, "Reconciled")["status"] == "True" else None

    await eventually(lambda: status_says(0, "EnginesStarting"), what="status: 0/2 ready")
    # The cluster's Deployment controller reports the pods ready: the engine's status follows.
    await api.merge_patch(f"{DEPLOYMENTS}/llama/status", {"status": {"readyReplicas": 2, "replicas": 2}})
    ready = await eventually(lambda: status_says(2, "EnginesReady"), what="status: 2/2 ready")
    assert condition(ready, "Ready")["status"] == "True"

    # Update: replicas and vLLM arguments reach the Deployment.
    await api.merge_patch(engine_path("llama"), {"spec": {"replicas": 3, "vllmArgs": ["--max-num-seqs", "128"]}})

    async def updated() -> dict[str, Any] | None:
        dep = await api.get(f"{DEPLOYMENTS}/llama")
        return dep if dep["spec"]["replicas"] == 3 and container(dep)["args"][-2:] == ["--max-num-seqs", "128"] \
            else None

    await eventually(updated, what="the Deployment updated")
    await eventually(lambda: status_says(2, "EnginesStarting"), what="status: 2/3 ready")

    # Delete: the garbage collector takes the children with their owner.
    await api.delete(engine_path("llama"))
    await eventually(lambda: _gone(api, f"{DEPLOYMENTS}/llama"), what="the Deployment deleted")
    await eventually(lambda: _gone(api, f"{SERVICES}/llama"), what="the Service deleted")


async def _gone(api: KubeApi, path: str) -> bool:
    return await api.get(path) is None


async def test_deleted_or_edited_children_are_restored(
        cluster: Cluster, api: KubeApi, operator: OperatorFactory, engine_path: Callable[..., str]) -> None:
    await operator()
    await api.create(engine_path(), engine("qwen", replicas=1))
    first = await eventually(lambda: api.get(f"{DEPLOYMENTS}/qwen"), what="the Deployment")

    await api.delete(f"{DEPLOYMENTS}/qwen")  # behind the operator's back

    async def recreated() -> dict[str, Any] | None:
        dep = await api.get(f"{DEPLOYMENTS}/qwen")
        return dep if dep and dep["metadata"]["uid"] != first["metadata"]["uid"] else None

    again = await eventually(recreated, what="the Deployment recreated")
    assert again["spec"]["replicas"] == 1 and container(again)["args"] == container(first)["args"]

    # An edit by hand (someone scales the Deployment, changes the Service's port) is put back.
    await api.merge_patch(f"{DEPLOYMENTS}/qwen", {"spec": {"replicas": 5}})
    await api.merge_patch(f"{SERVICES}/qwen", {"spec": {"ports": [{"name": "http", "port": 9999}]}})

    async def repaired() -> bool:
        dep, svc = await api.get(f"{DEPLOYMENTS}/qwen"), await api.get(f"{SERVICES}/qwen")
        return dep["spec"]["replicas"] == 1 and svc["spec"]["ports"][0]["port"] == 8000

    await eventually(repaired, what="the edits reverted")


async def test_invalid_spec_is_reported_in_status(
        cluster: Cluster, api: KubeApi, operator: OperatorFactory, engine_path: Callable[..., str]) -> None:
    """A spec the schema lets through but the scheduler refuses (CEL is not evaluated by the emulator)."""
    await operator()
    await api.create(engine_path(), engine("bad", scheduler={"boundaries": [1, 2], "quanta": [8, 16]}))

    async def refused() -> dict[str, Any] | None:
        obj = await api.get(engine_path("bad"))
        cond = condition(obj, "Reconciled")
        return cond if cond["status"] == "False" else None

    cond = await eventually(refused, what="Reconciled=False")
    assert cond["reason"] == "InvalidSpec"
    assert cond["message"] == "spec.scheduler.quanta: expected 3 values (one per queue, 2 boundaries), got 2"
    assert await api.get(f"{DEPLOYMENTS}/bad") is None


async def test_a_child_name_taken_by_someone_else_is_not_taken_over(
        cluster: Cluster, api: KubeApi, operator: OperatorFactory, engine_path: Callable[..., str]) -> None:
    theirs = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "taken", "namespace": NAMESPACE},
              "spec": {"ports": [{"name": "web", "port": 80}]}}
    await api.create(SERVICES, theirs)
    await operator()
    await api.create(engine_path(), engine("taken"))

    async def refused() -> dict[str, Any] | None:
        cond = condition(await api.get(engine_path("taken")), "Reconciled")
        return cond if cond["reason"] == "NameTaken" else None

    cond = await eventually(refused, what="Reconciled=False NameTaken")
    assert cond["status"] == "False" and cond["message"].startswith("Service 'taken' exists and belongs to")
    assert (await api.get(f"{SERVICES}/taken"))["spec"]["ports"] == [{"name": "web", "port": 80}]


async def test_scale_subresource_drives_the_deployment(
        cluster: Cluster, api: KubeApi, operator: OperatorFactory, engine_path: Callable[..., str]) -> None:
    """What `kubectl scale axe/llama --replicas 4`, an HPA or KEDA do."""
    await operator()
    await api.create(engine_path(), engine("scaled", replicas=1))
    await eventually(lambda: api.get(f"{DEPLOYMENTS}/scaled"), what="the Deployment")
    scale = await api.merge_patch(engine_path("scaled", "scale"), {"spec": {"replicas": 4}})
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 4

    async def scaled() -> bool:
        return (await api.get(f"{DEPLOYMENTS}/scaled"))["spec"]["replicas"] == 4

    await eventually(scaled, what="the Deployment at 4 replicas")
