"""AutellixEngine: its children applied, its status and Events, and the engines' pass (the autoscaler).

``reconcile_engine`` applies the children (``engine_children``: Deployment,
Service, PodDisruptionBudget, and the InferencePool and endpoint picker when
enabled) and writes the status; kopf calls it on create/update/resume and on
its children's events (drift repair). The engines' pass (``engines_pass``,
repeated by ``run.py`` every ``autoscale_interval`` in the leader) reconciles
again the engines whose reconcile failed for a passing reason and runs one
autoscaler step per engine: sample the load the gateway reports, decide
(``autoscaler.plan``), drain or undrain in the gateway, remove drained engines,
set ``spec.replicas``. It is not a kopf timer: a timer would put kopf's
finalizer on every engine, and an engine needs none (its children carry owner
references, and the garbage collector removes them).

Every change the operator makes is a Normal Event on the engine (Applied,
Scaled, Drained, Undrained); a lasting failure (InvalidSpec, NameTaken,
NoInferencePoolAPI, GatewayUnreachable, ExternalAutoscaler) a Warning when it
starts.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from autellix.kube import API_VERSION, ENGINE_KIND, ENGINE_PLURAL, GROUP
from autellix.kube.autoscaler import EngineLoad, LoadHistory, Sample, desired_replicas, external_autoscalers, plan
from autellix.kube.conditions import condition, set_condition
from autellix.kube.context import Context, describe, expected, named, recovered, report, write_status
from autellix.kube.endpoints import endpoint_pods
from autellix.kube.gateway_client import GatewayError
from autellix.kube.kubeapi import NotOwned, object_path
from autellix.kube.manifests import INFERENCE_POOL_API, POD_DELETION_COST, engine_children, selector_string
from autellix.kube.spec import SpecError, parse_engine
from autellix.kube.status import engine_status, load_status, now_iso

log = logging.getLogger("autellix.kube")

#: The Autoscaling condition's reason while an HPA (or KEDA's) targets the engine.
EXTERNAL_AUTOSCALER = "ExternalAutoscaler"
#: The Reconciled condition's reason while the cluster has no InferencePool API (its CRD's arrival ends it).
NO_INFERENCE_POOL_API = "NoInferencePoolAPI"
#: Reconciled: (status, reason, message).
Outcome = tuple[bool, str, str]


def engine_path(namespace: str, name: str) -> str:
    return object_path(API_VERSION, ENGINE_KIND, namespace, name)


async def served_engines(ctx: Context) -> list[dict[str, Any]]:
    """Every AutellixEngine the operator serves: one list per namespace, or one of the whole cluster."""
    if not ctx.namespaces:
        return await ctx.api.list(f"/apis/{API_VERSION}/{ENGINE_PLURAL}")
    return [e for ns in ctx.namespaces for e in await ctx.api.list(object_path(API_VERSION, ENGINE_KIND, ns))]


async def write_engine_status(ctx: Context, engine: dict[str, Any], desired: int, deployment: dict[str, Any] | None,
                              reconciled: Outcome) -> None:
    """The engine's replicas, selector and Reconciled/Ready conditions, written when they changed."""
    meta, status = engine["metadata"], engine.get("status") or {}
    await write_status(ctx, engine_path(meta["namespace"], meta["name"]), status, engine_status(
        status, desired=desired, deployment=deployment, reconciled=reconciled, now=now_iso(),
        generation=meta.get("generation"), selector=selector_string(meta["name"])))


async def scaled_by(ctx: Context, namespace: str, name: str) -> list[str]:
    """The HPAs (KEDA's included) that target this engine."""
    hpas = await ctx.api.list(f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers")
    return external_autoscalers(hpas, name, GROUP)


async def apply_children(ctx: Context, children: list[dict[str, Any]]) -> tuple[Outcome, list[str]]:
    """Apply each child in turn: Reconciled says what was done, and the list names the children created or
    patched. An InferencePool whose API the cluster lacks (404) is reported, not raised: the engine serves
    without it until the CRD arrives."""
    results: list[str] = []
    for child in children:
        try:
            results.append(f"{child['kind']} {child['metadata']['name']} {await ctx.api.apply(child)}")
        except ApiException as exc:
            if exc.status != 404 or child["kind"] != "InferencePool":
                raise
            return (False, NO_INFERENCE_POOL_API, f"InferencePool ({INFERENCE_POOL_API}) is not installed in the "
                                                  f"cluster; the engine serves without it. {', '.join(results)}."), \
                _changed(results)
    return (True, "Applied", ", ".join(results) + "."), _changed(results)


def _changed(results: list[str]) -> list[str]:
    return [r for r in results if r.endswith((" created", " patched"))]


async def reconcile_engine(ctx: Context, engine: dict[str, Any]) -> None:
    """Apply the engine's children and write its status. An invalid spec or a child's name taken is
    reported (status, a Warning Event, one log line); a taken name is tried again by the engines' pass."""
    meta = engine["metadata"]
    if meta.get("deletionTimestamp"):
        return  # being deleted: the garbage collector removes its children
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    try:
        spec = parse_engine(engine.get("spec") or {}, default_image=ctx.config.engine_image,
                            default_gpu_image=ctx.config.engine_gpu_image)
    except SpecError as exc:
        ctx.retry.discard(uid)  # an edit of the spec brings it back
        await write_engine_status(ctx, engine, 0, None, (False, "InvalidSpec", str(exc)))
        await report(ctx, engine, "reconcile", "InvalidSpec", f"Invalid spec: {exc}")
        return
    if spec.autoscaling.enabled and await scaled_by(ctx, namespace, name):  # its spec.replicas, unclamped
        spec = dataclasses.replace(spec, autoscaling=dataclasses.replace(spec.autoscaling, enabled=False))
    children = engine_children(name, namespace, uid, spec, token_secret=ctx.config.engine_token_secret,
                               inference_pool=ctx.config.inference_pool, picker=ctx.config.endpoint_picker)
    try:
        outcome, changed = await apply_children(ctx, children)
    except NotOwned as exc:
        ctx.retry.add(uid)
        await write_engine_status(ctx, engine, spec.desired_replicas, None, (False, "NameTaken", str(exc)))
        await report(ctx, engine, "reconcile", "NameTaken", str(exc))
        return
    ctx.retry.discard(uid)
    live = await ctx.api.get(object_path("apps/v1", "Deployment", namespace, name))
    await write_engine_status(ctx, engine, spec.desired_replicas, live, outcome)
    if changed:
        await ctx.events.post(engine, "Normal", "Applied", ", ".join(changed) + ".")
        log.info("%s: %s", named(engine), ", ".join(changed))
    if outcome[0]:
        recovered(ctx, engine, "reconcile")
    else:
        await report(ctx, engine, "reconcile", outcome[1], outcome[2])


async def reconcile_or_retry(ctx: Context, engine: dict[str, Any]) -> None:
    """``reconcile_engine`` on the engine as it is now, one at a time per engine (the create handler, a
    child's event and the engines' pass can each start one); a failure that passes (an API conflict, the
    API server away) is one log line, and the engines' pass tries again."""
    meta = engine["metadata"]
    try:
        async with ctx.engine_lock(meta["uid"]):
            now = await ctx.api.get(engine_path(meta["namespace"], meta["name"]))
            if now is not None and now["metadata"]["uid"] == meta["uid"]:  # else gone, or another of its name
                await reconcile_engine(ctx, now)
    except Exception as exc:
        if not expected(exc):
            raise
        ctx.retry.add(engine["metadata"]["uid"])
        log.warning("%s: cannot reconcile now (%s); the next pass tries again", named(engine), describe(exc))


def _owner(body: dict[str, Any], kind: str) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == kind and ref.get("apiVersion", "").startswith(GROUP + "/"):
            return ref.get("name")
    return None


async def engine_child_event(ctx: Context, body: dict[str, Any]) -> None:
    """A child changed, vanished or progressed: re-apply what drifted and refresh the status."""
    owner, namespace = _owner(body, ENGINE_KIND), body.get("metadata", {}).get("namespace")
    if owner is None or namespace is None:
        return
    engine = await ctx.api.get(engine_path(namespace, owner))
    if engine is not None:
        await reconcile_or_retry(ctx, engine)


async def inference_pool_api_arrived(ctx: Context) -> None:
    """The InferencePool CRD is established: apply the engines that went without their pool."""
    for engine in await served_engines(ctx):
        reconciled = condition((engine.get("status") or {}).get("conditions"), "Reconciled") or {}
        if reconciled.get("reason") == NO_INFERENCE_POOL_API:
            log.info("InferencePool API installed: applying %s/%s's pool", engine["metadata"]["namespace"],
                     engine["metadata"]["name"])
            await reconcile_or_retry(ctx, engine)


async def engine_loads(ctx: Context, namespace: str, name: str) -> list[EngineLoad]:
    """This engine's pods as the gateway sees them: its Service's ready endpoints joined with /admin/engines."""
    slices = await ctx.api.list(f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
                                label_selector=f"kubernetes.io/service-name={name}")
    pods = endpoint_pods(slices)
    for url in [u for u in ctx.removed if u not in pods]:
        del ctx.removed[url]  # its endpoint is gone: forget it
    seen = await ctx.gateway.engines(ctx.config.gateway_url)
    return [dataclasses.replace(e, pod=pods[e.url]) for e in seen if e.url in pods and e.url not in ctx.removed]


def autoscaling_condition(status: dict[str, Any], enabled: bool, external: list[str]) -> list[dict[str, Any]]:
    """Who drives spec.replicas: the built-in autoscaler, an HPA/KEDA (the built-in one then stands down),
    or nobody (kubectl scale)."""
    if external:
        who = ", ".join(f"HorizontalPodAutoscaler {n}" for n in external)
        message = f"{who} scales this engine" + (
            "; the built-in autoscaler stands down (set spec.autoscaling.enabled: false)" if enabled else ".")
        reason, active = (EXTERNAL_AUTOSCALER, not enabled)
    elif enabled:
        reason, active, message = "BuiltIn", True, "The operator's autoscaler sets spec.replicas from the load."
    else:
        reason, active, message = "Manual", False, "spec.replicas is set by hand (kubectl scale) or by nobody."
    return set_condition(status.get("conditions"), "Autoscaling", active, reason, message, now_iso())


def _engine_named(engine: EngineLoad) -> str:
    return f"{engine.url} (pod {engine.pod})" if engine.pod else engine.url


async def autoscale(ctx: Context, engine: dict[str, Any], now: float) -> None:
    """One autoscaler step of one engine: sample the load, decide, drain or undrain, remove drained engines,
    set replicas (with autoscaling off, or an HPA or KEDA driving the engine: only show the load)."""
    meta, status = engine["metadata"], engine.get("status") or {}
    name, namespace = meta["name"], meta["namespace"]
    path = engine_path(namespace, name)
    try:
        spec = parse_engine(engine.get("spec") or {})
    except SpecError:
        return  # reported by reconcile_engine
    policy = spec.autoscaling
    external = await scaled_by(ctx, namespace, name)
    conditions = autoscaling_condition(status, policy.enabled, external)
    if conditions != status.get("conditions"):
        # Written whatever the load, onto the conditions as they are now: the listed body may be older
        # than the Reconciled/Ready conditions an event handler wrote since.
        fresh = (await ctx.api.get(path) or {}).get("status") or {}
        status = {**status, "conditions": autoscaling_condition(fresh, policy.enabled, external)}
        await ctx.api.merge_patch(path + "/status", {"status": {"conditions": status["conditions"]}})
    if external and policy.enabled:
        await report(ctx, engine, "autoscaling", EXTERNAL_AUTOSCALER,
                     str((condition(conditions, "Autoscaling") or {}).get("message", "")))
    else:
        recovered(ctx, engine, "autoscaling")
    engines = await engine_loads(ctx, namespace, name)
    recovered(ctx, engine, "gateway")
    if not policy.enabled or external:  # the load is still shown
        await write_status(ctx, path, status, load_status(engines))
        return
    total = sum(e.load for e in engines)
    history = ctx.history.setdefault(meta["uid"], LoadHistory(since=now))
    history.add(Sample(now, total), policy)
    current = spec.desired_replicas
    desired = desired_replicas(history.samples, current, policy, now, since=history.since)
    step = plan(current, desired, engines)
    by_url = {e.url: e for e in engines}
    why = f"load {total:g} (running + waiting calls) at a target of {policy.target_load:g} per engine"
    for url in step.undrain:
        await ctx.gateway.drain(ctx.config.gateway_url, url, draining=False)
        await ctx.events.post(engine, "Normal", "Undrained", f"Engine {_engine_named(by_url[url])} takes calls "
                                                              f"again: {why} needs {desired} engines.")
    for url in step.drain:
        await ctx.gateway.drain(ctx.config.gateway_url, url, draining=True)
        await ctx.events.post(engine, "Normal", "Drained", f"Engine {_engine_named(by_url[url])} drained in the "
                                                            f"gateway (no new calls; removed once idle): {why} "
                                                            f"needs {desired} engines.")
    for gone in step.remove:
        if gone.pod:  # the Deployment removes the pod with the lowest deletion cost first
            await ctx.api.merge_patch(object_path("v1", "Pod", namespace, gone.pod),
                                      {"metadata": {"annotations": {POD_DELETION_COST: "-1000"}}})
        ctx.removed[gone.url] = now
    previous = engine.get("spec", {}).get("replicas")
    if step.replicas != previous:
        removed = f"; removing drained, idle {', '.join(_engine_named(e) for e in step.remove)}" \
            if step.remove else ""
        message = f"Scaled from {previous} to {step.replicas} engines: {why}{removed}."
        log.info("autoscaler: %s/%s: %s", namespace, name, message)
        await ctx.api.merge_patch(path, {"spec": {"replicas": step.replicas}})
        await ctx.events.post(engine, "Normal", "Scaled", message)
    draining = set(step.drain) | {e.url for e in engines if e.draining and e.url not in step.undrain}
    shown = [dataclasses.replace(e, draining=e.url in draining) for e in engines if e not in step.remove]
    autoscaling = {"desiredReplicas": step.replicas, "draining": sorted(draining - {e.url for e in step.remove})}
    await write_status(ctx, path, status, {**load_status(shown), "autoscaling": autoscaling})


async def engines_pass(ctx: Context, now: float) -> None:
    """One pass over every served engine (``run.py`` repeats it every ``autoscale_interval``): reconcile again
    an engine whose reconcile failed for a passing reason, then its autoscaler step. An engine whose step
    fails is tried again at the next pass; an unreachable gateway is one Warning per engine while it lasts."""
    engines = [e for e in await served_engines(ctx) if not e["metadata"].get("deletionTimestamp")]
    uids = {e["metadata"]["uid"] for e in engines}
    for uid in ctx.history.keys() - uids:
        del ctx.history[uid]  # deleted: its samples go with it
    for uid in ctx.engines_seen - uids:
        ctx.events.forget(uid)
        if not (lock := ctx.engine_locks.get(uid)) or not lock.locked():
            ctx.engine_locks.pop(uid, None)
    ctx.retry &= uids
    ctx.engines_seen = uids
    for engine in engines:
        if engine["metadata"]["uid"] in ctx.retry:
            await reconcile_or_retry(ctx, engine)
        try:
            async with ctx.engine_lock(engine["metadata"]["uid"]):
                await autoscale(ctx, engine, now)
        except GatewayError as exc:  # nothing is decided on no data
            await report(ctx, engine, "gateway", "GatewayUnreachable",
                         f"Cannot read the engines' load from the gateway: {exc}")
        except Exception as exc:
            if not expected(exc) and not isinstance(exc, ApiException):
                raise
            log.warning("autoscaler: %s: %s", named(engine), describe(exc))
