"""AutellixEngine through kopf and the emulator: create, update, delete, drift repair, status."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from autellix.kube import FINALIZER
from autellix.kube.kubeapi import KubeApi
from tests.kube.conftest import NAMESPACE, OperatorFactory, events_about, eventually
from tests.kube.kmock_cluster import Cluster

pytestmark = pytest.mark.asyncio

DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
SERVICES = f"/api/v1/namespaces/{NAMESPACE}/services"
BUDGETS = f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets"


def engine(name: str = "llama", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "autellix.ai/v1alpha1", "kind": "AutellixEngine",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"model": {"name": "llama-8b", "source": {"hub": "meta-llama/Llama-3.1-8B-Instruct"}},
                     "resources": {"gpus": 1}, "replicas": 2, "vllmArgs": ["--max-num-seqs", "64"], **spec}}


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    """The condition (empty until the operator has set it)."""
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


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
    # One pod made, not ready yet: status.replicas (and the scale subresource, what an HPA reads) counts it.
    await api.merge_patch(f"{DEPLOYMENTS}/llama/status", {"status": {"replicas": 1}})

    async def pods_counted() -> dict[str, Any] | None:
        scale = await api.get(engine_path("llama", "scale"))
        return scale if scale["status"]["replicas"] == 1 else None

    scale = await eventually(pods_counted, what="the scale subresource counting the pod")
    assert scale["spec"]["replicas"] == 2
    assert (await api.get(engine_path("llama")))["status"]["readyReplicas"] == 0
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

    # No finalizer on an engine: deleting one never waits for an operator.
    assert not (await api.get(engine_path("llama")))["metadata"].get("finalizers")
    # What `kubectl describe` shows: each change the operator made, as an Event on the engine.
    async def applied_twice() -> list[dict[str, Any]] | None:  # posted just after the status it goes with
        applied = [e for e in await events_about(api, created) if e["reason"] == "Applied"]
        return applied if len(applied) >= 2 else None

    applied = await eventually(applied_twice, what="an Applied Event for the creation and one for the update")
    assert applied[0]["type"] == "Normal" and applied[0]["message"] == (
        "Deployment llama created, Service llama created, PodDisruptionBudget llama created.")
    assert any(e["message"] == "Deployment llama patched." for e in applied[1:]), applied

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
    await api.merge_patch(f"{BUDGETS}/qwen", {"spec": {"maxUnavailable": 0}})  # would block every node drain

    async def repaired() -> bool:
        dep, svc = await api.get(f"{DEPLOYMENTS}/qwen"), await api.get(f"{SERVICES}/qwen")
        budget = await api.get(f"{BUDGETS}/qwen")
        return dep["spec"]["replicas"] == 1 and svc["spec"]["ports"][0]["port"] == 8000 and \
            budget["spec"]["maxUnavailable"] == 1

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
    # `kubectl get axe` shows the reason in its STATUS column (the Ready condition's reason)
    assert condition(await api.get(engine_path("bad")), "Ready")["reason"] == "InvalidSpec"
    # ... and `kubectl describe` one Warning, however often the engine is handled again while it lasts
    for touch in range(3):
        await api.merge_patch(engine_path("bad"), {"metadata": {"labels": {"touched": str(touch)}}})
    await asyncio.sleep(1.0)
    events = await events_about(api, await api.get(engine_path("bad")))
    assert [(e["type"], e["message"]) for e in events if e["reason"] == "InvalidSpec"] == [
        ("Warning", f"Invalid spec: {cond['message']}")]


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
    await asyncio.sleep(1.0)  # the engines' pass tries again every 0.2 s: one Warning all the same
    events = await events_about(api, await api.get(engine_path("taken")))
    assert [e["type"] for e in events if e["reason"] == "NameTaken"] == ["Warning"]

    # The Service goes: the next pass applies the engine's own.
    await api.delete(f"{SERVICES}/taken")

    async def applied() -> bool:
        return condition(await api.get(engine_path("taken")), "Reconciled")["reason"] == "Applied"

    await eventually(applied, what="Reconciled=True Applied")
    assert (await api.get(f"{SERVICES}/taken"))["spec"]["ports"][0]["port"] == 8000


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
    # what an HPA reads to find the engine's pods: the scale subresource's selector (status.selector)

    async def scale_selector() -> str | None:
        return (await api.get(engine_path("scaled", "scale")))["status"].get("selector")

    selector = await eventually(scale_selector, what="the scale subresource's selector")
    assert selector == "app.kubernetes.io/component=engine,autellix.ai/engine=scaled"
    pods = (await api.get(f"{DEPLOYMENTS}/scaled"))["spec"]["template"]["metadata"]["labels"]
    assert dict(part.split("=") for part in selector.split(",")).items() <= pods.items()
    budget = await api.get(f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets/scaled")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": {
        "autellix.ai/engine": "scaled", "app.kubernetes.io/component": "engine"}}}


HPAS = f"/apis/autoscaling/v2/namespaces/{NAMESPACE}/horizontalpodautoscalers"


async def test_the_builtin_autoscaler_does_not_fight_an_hpa(
        cluster: Cluster, api: KubeApi, operator: OperatorFactory, engine_path: Callable[..., str]) -> None:
    """An HPA (or KEDA's) targets an engine whose built-in autoscaler is on: the operator says so in a
    condition, leaves spec.replicas to the HPA (even outside its own bounds) and changes nothing."""
    await operator()
    await api.create(HPAS, {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                            "metadata": {"name": "keda-hpa-both", "namespace": NAMESPACE},
                            "spec": {"scaleTargetRef": {"apiVersion": "autellix.ai/v1alpha1",
                                                        "kind": "AutellixEngine", "name": "both"},
                                     "minReplicas": 1, "maxReplicas": 8}})
    await api.create(engine_path(), engine("both", replicas=1, autoscaling={"enabled": True, "maxReplicas": 2}))

    async def standing_down() -> dict[str, Any] | None:
        conditions = (await api.get(engine_path("both"))).get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["reason"] == "ExternalAutoscaler"), None)

    cond = await eventually(standing_down, what="Autoscaling=False ExternalAutoscaler")
    assert cond["status"] == "False" and "HorizontalPodAutoscaler keda-hpa-both" in cond["message"]
    await api.merge_patch(engine_path("both", "scale"), {"spec": {"replicas": 6}})  # the HPA scales up

    async def followed() -> bool:
        return (await api.get(f"{DEPLOYMENTS}/both"))["spec"]["replicas"] == 6

    await eventually(followed, what="the Deployment at the HPA's 6 replicas")
    assert (await api.get(engine_path("both")))["spec"]["replicas"] == 6


INFERENCE_POOL_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "inferencepools.inference.networking.k8s.io"},
    "spec": {"group": "inference.networking.k8s.io", "scope": "Namespaced",
             "names": {"kind": "InferencePool", "plural": "inferencepools", "singular": "inferencepool"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]}}


async def test_an_inference_pool_per_engine_when_enabled(
        cluster: Cluster, api: KubeApi, operator: OperatorFactory, engine_path: Callable[..., str]) -> None:
    await api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", INFERENCE_POOL_CRD)
    await operator(inference_pool=True)
    await api.create(engine_path(), engine("pooled"))
    pool = await eventually(lambda: api.get(
        f"/apis/inference.networking.k8s.io/v1/namespaces/{NAMESPACE}/inferencepools/pooled"), what="the pool")
    assert pool["spec"]["selector"]["matchLabels"] == {"autellix.ai/engine": "pooled",
                                                      "app.kubernetes.io/component": "engine"}
    assert pool["metadata"]["ownerReferences"][0]["name"] == "pooled"


async def test_an_engine_finalized_by_an_older_operator_is_released(
        cluster: Cluster, api: KubeApi, operator: OperatorFactory, engine_path: Callable[..., str]) -> None:
    """Engines once carried kopf's finalizer (an autoscaler timer): the operator drops it when it resumes them."""
    old = engine("older")
    old["metadata"]["finalizers"] = [FINALIZER]
    await api.create(engine_path(), old)
    await operator()

    async def released() -> bool:
        return not (await api.get(engine_path("older")))["metadata"].get("finalizers")

    await eventually(released, what="the finalizer dropped")
    await eventually(lambda: api.get(f"{DEPLOYMENTS}/older"), what="the Deployment")

