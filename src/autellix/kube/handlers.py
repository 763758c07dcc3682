"""kopf handlers: a few lines each over the pure parts and the two clients.

AutellixEngine: create/update/resume apply its children (``engine_children``:
Deployment, Service, PodDisruptionBudget, and an InferencePool when enabled) and
write its status; events of those children (a delete, an edit, a rollout's
progress) do the same, and so does the InferencePool CRD's arrival for the engines
that went without their pool. The autoscaler is a pass over every served engine
(``autoscale_engines``) that ``run.py`` repeats, not a kopf timer: a timer would
put kopf's finalizer on every engine, and an engine needs none (its children carry
owner references, and the garbage collector removes them), so deleting one never
waits for an operator. AgentProgram: create opens the session and starts the Job;
a timer mirrors the session into status and ends it when the Job finishes (or is
gone); deleting a program whose session is open ends it too. Those are the only
objects with the finalizer ``autellix.ai/finalizer``, and only while the session is
open (``autellix kube release-finalizers`` is the way out when no operator runs).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes_asyncio.client.exceptions import ApiException

from autellix.kube import (
    API_VERSION,
    ENGINE_KIND,
    ENGINE_PLURAL,
    FINALIZER,
    GROUP,
    PROGRAM_KIND,
    PROGRAM_PLURAL,
    VERSION,
)
from autellix.kube.autoscaler import EngineLoad, Sample, desired_replicas, external_autoscalers, plan, trim
from autellix.kube.conditions import condition, set_condition
from autellix.kube.endpoints import endpoint_pods
from autellix.kube.gateway_client import GatewayClient, GatewayError
from autellix.kube.kubeapi import KubeApi, NotOwned, object_path
from autellix.kube.manifests import (
    INFERENCE_POOL_API,
    INFERENCE_POOL_CRD,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    POD_DELETION_COST,
    PickerSettings,
    engine_children,
    job_name,
    job_outcome,
    program_job,
    selector_string,
)
from autellix.kube.spec import DEFAULT_ENGINE_IMAGE, EngineSpec, SpecError, parse_engine, parse_program
from autellix.kube.status import engine_status, load_status, now_iso, parse_iso, session_status

log = logging.getLogger("autellix.kube")

ENGINES = (GROUP, VERSION, ENGINE_PLURAL)
PROGRAMS = (GROUP, VERSION, PROGRAM_PLURAL)
RUNNING_PHASES = ("Pending", "Running")
#: The Autoscaling condition's reason while an HPA (or KEDA's) targets the engine.
EXTERNAL_AUTOSCALER = "ExternalAutoscaler"
#: The Reconciled condition's reason while the cluster has no InferencePool API (its CRD's arrival ends it).
NO_INFERENCE_POOL_API = "NoInferencePoolAPI"
#: Reconciled: (status, reason, message).
Outcome = tuple[bool, str, str]


@dataclass
class OperatorConfig:
    #: The gateway's base URL inside the cluster (the chart's gateway Service).
    gateway_url: str = "http://autellix-gateway"
    gateway_api_key: str | None = None
    #: The gateway's admin listener (its own port and keys): drains and AgentProgram sessions on a
    #: tenant's behalf go there, and the operator needs no tenant key. None: the tenant routes.
    gateway_admin_url: str | None = None
    gateway_admin_key: str | None = None
    #: A Secret (data key ``token``) in each engine's namespace holding the token engines accept calls
    #: with (``autellix.protocol.ENGINE_TOKEN_ENV``); None: engines answer anyone who reaches them.
    engine_token_secret: str | None = None
    #: Seconds between two autoscaler passes over the engines.
    autoscale_interval: float = 15.0
    #: Seconds between two reads of a running AgentProgram's session.
    program_poll_interval: float = 5.0
    #: Seconds before a failed handler runs again (an API or gateway error).
    retry_backoff: float = 10.0
    #: The engine image of an AutellixEngine whose spec names none (the chart's image registry and tag).
    engine_image: str = DEFAULT_ENGINE_IMAGE
    #: Also make a Gateway API InferencePool per engine (once its CRD is installed).
    inference_pool: bool = False
    #: Also run ``autellix epp`` as each engine's endpoint picker (implies the InferencePool; docs/epp.md).
    endpoint_picker: PickerSettings | None = None


@dataclass
class Context:
    """What every handler needs; kopf hands it over in ``memo``."""

    api: KubeApi
    gateway: GatewayClient
    config: OperatorConfig
    #: The namespaces served; empty: the whole cluster.
    namespaces: tuple[str, ...] = ()
    #: Engine URL -> when the autoscaler removed it (a pod on its way out is not counted again).
    removed: dict[str, float] = field(default_factory=dict)
    #: Engine uid -> its load samples within the autoscaler's windows.
    history: dict[str, list[Sample]] = field(default_factory=dict)


async def _write_status(ctx: Context, path: str, previous: dict[str, Any], changes: dict[str, Any]) -> None:
    if any(previous.get(k) != v for k, v in changes.items()):
        await ctx.api.merge_patch(path + "/status", {"status": changes})


# ---- AutellixEngine ---------------------------------------------------------------
def _engine_path(namespace: str, name: str) -> str:
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
    await _write_status(ctx, _engine_path(meta["namespace"], meta["name"]), status, engine_status(
        status, desired=desired, deployment=deployment, reconciled=reconciled, now=now_iso(),
        generation=meta.get("generation"), selector=selector_string(meta["name"])))


async def scaled_by(ctx: Context, namespace: str, name: str) -> list[str]:
    """The HPAs (KEDA's included) that target this engine."""
    hpas = await ctx.api.list(f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers")
    return external_autoscalers(hpas, name, GROUP)


async def apply_children(ctx: Context, children: list[dict[str, Any]]) -> Outcome:
    """Apply each child in turn; Reconciled says what was done. An InferencePool whose API the cluster
    lacks (404) is reported, not raised: the engine serves without it until the CRD arrives."""
    results: list[str] = []
    for child in children:
        try:
            results.append(f"{child['kind']} {await ctx.api.apply(child)}")
        except ApiException as exc:
            if exc.status != 404 or child["kind"] != "InferencePool":
                raise
            return (False, NO_INFERENCE_POOL_API, f"InferencePool ({INFERENCE_POOL_API}) is not installed in the "
                                                  f"cluster; the engine serves without it. {', '.join(results)}.")
    return True, "Applied", ", ".join(results) + "."


async def reconcile_engine(ctx: Context, engine: dict[str, Any]) -> EngineSpec:
    """Apply the engine's children and write its status (an invalid spec: kopf.PermanentError, reported)."""
    meta = engine["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    try:
        spec = parse_engine(engine.get("spec") or {}, default_image=ctx.config.engine_image)
    except SpecError as exc:
        await write_engine_status(ctx, engine, 0, None, (False, "InvalidSpec", str(exc)))
        raise kopf.PermanentError(str(exc)) from None
    if spec.autoscaling.enabled and await scaled_by(ctx, namespace, name):  # its spec.replicas, unclamped
        spec = dataclasses.replace(spec, autoscaling=dataclasses.replace(spec.autoscaling, enabled=False))
    children = engine_children(name, namespace, meta["uid"], spec, token_secret=ctx.config.engine_token_secret,
                               inference_pool=ctx.config.inference_pool, picker=ctx.config.endpoint_picker)
    try:
        outcome = await apply_children(ctx, children)
    except NotOwned as exc:
        await write_engine_status(ctx, engine, spec.desired_replicas, None, (False, "NameTaken", str(exc)))
        raise kopf.TemporaryError(str(exc), delay=ctx.config.retry_backoff * 6) from None
    live = await ctx.api.get(object_path("apps/v1", "Deployment", namespace, name))
    await write_engine_status(ctx, engine, spec.desired_replicas, live, outcome)
    return spec


async def reconcile_quietly(ctx: Context, engine: dict[str, Any]) -> None:
    """``reconcile_engine`` where an invalid spec or a taken name is only reported in the engine's status."""
    if engine["metadata"].get("deletionTimestamp"):
        return  # being deleted: the garbage collector removes its children
    with contextlib.suppress(kopf.PermanentError, kopf.TemporaryError):
        await reconcile_engine(ctx, engine)


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
    engine = await ctx.api.get(_engine_path(namespace, owner))
    if engine is not None:
        await reconcile_quietly(ctx, engine)


async def inference_pool_api_arrived(ctx: Context) -> None:
    """The InferencePool CRD is established: apply the engines that went without their pool."""
    for engine in await served_engines(ctx):
        reconciled = condition((engine.get("status") or {}).get("conditions"), "Reconciled") or {}
        if reconciled.get("reason") == NO_INFERENCE_POOL_API:
            log.info("InferencePool API installed: applying %s/%s's pool", engine["metadata"]["namespace"],
                     engine["metadata"]["name"])
            await reconcile_quietly(ctx, engine)


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


async def autoscale(ctx: Context, engine: dict[str, Any], now: float) -> None:
    """One autoscaler step of one engine: sample the load, decide, drain or undrain, remove drained engines,
    set replicas (with autoscaling off, or an HPA or KEDA driving the engine: only show the load)."""
    meta, status = engine["metadata"], engine.get("status") or {}
    name, namespace = meta["name"], meta["namespace"]
    path = _engine_path(namespace, name)
    try:
        spec = parse_engine(engine.get("spec") or {})
    except SpecError:
        return  # reported by reconcile_engine
    policy = spec.autoscaling
    external = await scaled_by(ctx, namespace, name)
    previous = condition(status.get("conditions"), "Autoscaling") or {}
    if autoscaling_condition(status, policy.enabled, external) != status.get("conditions"):
        # Written whatever the load, onto the conditions as they are now: the listed body may be older
        # than the Reconciled/Ready conditions an event handler wrote since.
        if external and policy.enabled and previous.get("reason") != EXTERNAL_AUTOSCALER:
            log.warning("autoscaler: %s/%s is scaled by %s: standing down", namespace, name, ", ".join(external))
        fresh = (await ctx.api.get(path) or {}).get("status") or {}
        status = {**status, "conditions": autoscaling_condition(fresh, policy.enabled, external)}
        await ctx.api.merge_patch(path + "/status", {"status": {"conditions": status["conditions"]}})
    engines = await engine_loads(ctx, namespace, name)
    if not policy.enabled or external:  # the load is still shown
        await _write_status(ctx, path, status, load_status(engines))
        return
    history = trim([*ctx.history.get(meta["uid"], []), Sample(now, sum(e.load for e in engines))], policy, now)
    ctx.history[meta["uid"]] = history
    current = spec.desired_replicas
    step = plan(current, desired_replicas(history, current, policy, now), engines)
    for url in step.undrain:
        await ctx.gateway.drain(ctx.config.gateway_url, url, draining=False)
    for url in step.drain:
        await ctx.gateway.drain(ctx.config.gateway_url, url, draining=True)
    for gone in step.remove:
        if gone.pod:  # the Deployment removes the pod with the lowest deletion cost first
            await ctx.api.merge_patch(object_path("v1", "Pod", namespace, gone.pod),
                                      {"metadata": {"annotations": {POD_DELETION_COST: "-1000"}}})
        ctx.removed[gone.url] = now
    if step.replicas != engine.get("spec", {}).get("replicas"):
        log.info("autoscaler: %s/%s %s -> %s replicas", namespace, name, current, step.replicas)
        await ctx.api.merge_patch(path, {"spec": {"replicas": step.replicas}})
    draining = set(step.drain) | {e.url for e in engines if e.draining and e.url not in step.undrain}
    shown = [dataclasses.replace(e, draining=e.url in draining) for e in engines if e not in step.remove]
    autoscaling = {"desiredReplicas": step.replicas, "draining": sorted(draining - {e.url for e in step.remove})}
    await _write_status(ctx, path, status, {**load_status(shown), "autoscaling": autoscaling})


async def autoscale_engines(ctx: Context, now: float) -> None:
    """One autoscaler pass over every served engine (``run.py`` repeats it every ``autoscale_interval``);
    an engine whose step fails is tried again at the next pass."""
    engines = [e for e in await served_engines(ctx) if not e["metadata"].get("deletionTimestamp")]
    for uid in ctx.history.keys() - {e["metadata"]["uid"] for e in engines}:
        del ctx.history[uid]  # deleted: its samples go with it
    for engine in engines:
        try:
            await autoscale(ctx, engine, now)
        except (GatewayError, ApiException) as exc:  # nothing is decided on no data
            log.warning("autoscaler: %s/%s: %s", engine["metadata"]["namespace"], engine["metadata"]["name"], exc)


# ---- AgentProgram -------------------------------------------------------------------
def _program_path(namespace: str, name: str) -> str:
    return object_path(API_VERSION, PROGRAM_KIND, namespace, name)


def _elapsed(status: dict[str, Any]) -> float | None:
    start = status.get("startTime")
    if not start:
        return None
    return (datetime.datetime.now(datetime.UTC) - parse_iso(start)).total_seconds()


async def start_program(ctx: Context, program: dict[str, Any], memo: kopf.Memo) -> None:
    """Open the session (once) and create the Job (if absent)."""
    meta, status = program["metadata"], program.get("status") or {}
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    path = _program_path(namespace, name)
    if status.get("phase") in ("Succeeded", "Failed"):
        return
    try:
        spec = parse_program(program.get("spec") or {})
    except SpecError as exc:
        await _write_status(ctx, path, status, {"phase": "Failed", "message": str(exc)})
        raise kopf.PermanentError(str(exc)) from None
    gateway = status.get("gateway") or spec.gateway or ctx.config.gateway_url
    session = status.get("sessionId") or memo.get("session_id")
    if not session:
        try:
            session = await ctx.gateway.open_session(gateway, spec.tenant, spec.priority)
        except GatewayError as exc:
            raise kopf.TemporaryError(f"cannot open a session in the gateway: {exc}") from exc
    memo.session_id = session  # survives a failed Job creation: the retry reuses the session
    try:
        await ctx.api.apply(program_job(name, namespace, uid, spec, gateway=gateway, session_id=session),
                            create_only=True)
    except NotOwned as exc:
        await _write_status(ctx, path, status, {"phase": "Pending", "message": str(exc)})
        raise kopf.TemporaryError(str(exc), delay=ctx.config.retry_backoff * 6) from None
    await _write_status(ctx, path, status, {"phase": status.get("phase") or "Pending", "sessionId": session,
                                            "gateway": gateway, "jobName": job_name(name),
                                            "startTime": status.get("startTime") or now_iso()})


async def watch_program(ctx: Context, program: dict[str, Any]) -> None:
    """Mirror the session into status; when the Job has finished, end the session and record the outcome."""
    meta, status = program["metadata"], program.get("status") or {}
    name, namespace = meta["name"], meta["namespace"]
    session, gateway = status.get("sessionId"), status.get("gateway")
    if not session or not gateway or status.get("phase") not in RUNNING_PHASES:
        return
    job = await ctx.api.get(object_path("batch/v1", "Job", namespace, job_name(name)))
    outcome = job_outcome(job) if job else None
    entry = await ctx.gateway.get_session(gateway, session)
    changes: dict[str, Any] = session_status(entry, _elapsed(status))
    if outcome is not None:
        final = await ctx.gateway.end_session(gateway, session)
        changes |= session_status(final or entry, _elapsed(status))
        changes |= {"phase": outcome, "sessionEnded": True, "completionTime": now_iso()}
    elif job is not None:
        changes["phase"] = "Running" if job.get("status", {}).get("active") or status.get("phase") == "Running" \
            else "Pending"
    elif status.get("phase") == "Running":  # deleted, or collected (ttlSecondsAfterFinished) while we were away
        final = await ctx.gateway.end_session(gateway, session)
        changes |= session_status(final or entry, _elapsed(status))
        changes |= {"phase": "Failed", "sessionEnded": True, "completionTime": now_iso(),
                    "message": f"Job {job_name(name)} is gone and its outcome was not seen."}
    await _write_status(ctx, _program_path(namespace, name), status, changes)


async def end_program(ctx: Context, program: dict[str, Any]) -> None:
    """The resource is being deleted: end its session unless that is done already."""
    status = program.get("status") or {}
    if session_open(status) and status.get("gateway"):
        await ctx.gateway.end_session(status["gateway"], status["sessionId"])


def session_open(status: dict[str, Any]) -> bool:
    """The program's session was opened and not ended: deleting it has something to do."""
    return bool(status.get("sessionId")) and not status.get("sessionEnded")


# ---- wiring -------------------------------------------------------------------------
def settings_for(settings: kopf.OperatorSettings) -> None:
    """Keep kopf's bookkeeping under our own prefix, in annotations (the status schema stays strict)."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP,
                                                                            key="last-handled-configuration")
    settings.peering.standalone = True  # replicas elect a leader on a Lease instead (leader.py)
    # A deleted program keeps its finalizer until its timer has exited. A timer that does not exit
    # at once (a tick awaiting the gateway) is re-checked after this many seconds, unless an event
    # on the resource comes first; kopf's default of 60 s can hold a deleted program for a minute.
    settings.background.cancellation_polling = 1.0


async def default_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod: its service account; elsewhere: the current kubeconfig context (exec plugins included),
    loaded by kubernetes_asyncio as ``KubeApi.from_environment`` does."""
    return await kopf.login_via_async_client(**kwargs)


def build_registry(config: OperatorConfig, login: Any = default_login) -> kopf.OperatorRegistry:
    """Every handler of the operator, on a registry of its own (the tests build one per operator)."""
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(login)
    # the engine's children and its endpoint picker's: a deleted one is restored at once
    children = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_COMPONENT: lambda value, **_: value in ("engine", "epp")}
    backoff = config.retry_backoff

    def ctx_of(memo: Any) -> Context:
        return memo.ctx

    @kopf.on.resume(*ENGINES, id="engine", registry=registry, backoff=backoff)
    @kopf.on.create(*ENGINES, id="engine", registry=registry, backoff=backoff)
    @kopf.on.update(*ENGINES, id="engine", registry=registry, backoff=backoff)
    async def engine_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await reconcile_engine(ctx_of(memo), _plain(body))

    @kopf.on.event("apps", "v1", "deployments", id="engine-child", labels=children, registry=registry)
    @kopf.on.event("", "v1", "services", id="engine-child", labels=children, registry=registry)
    @kopf.on.event("policy", "v1", "poddisruptionbudgets", id="engine-child", labels=children, registry=registry)
    async def engine_child_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await engine_child_event(ctx_of(memo), _plain(body))

    if config.inference_pool:
        @kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions", id="inference-pool-api",
                       field="metadata.name", value=INFERENCE_POOL_CRD, registry=registry)
        async def inference_pool_crd(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
            established = condition(body.get("status", {}).get("conditions"), "Established") or {}
            if type != "DELETED" and established.get("status") == "True":
                await inference_pool_api_arrived(ctx_of(memo))

    @kopf.on.resume(*PROGRAMS, id="program", registry=registry, backoff=backoff)
    @kopf.on.create(*PROGRAMS, id="program", registry=registry, backoff=backoff)
    async def program_created(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await start_program(ctx_of(memo), _plain(body), memo)

    @kopf.timer(*PROGRAMS, id="progress", interval=config.program_poll_interval, registry=registry,
                when=lambda status, **_: status.get("phase") in RUNNING_PHASES)
    async def program_progress(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await watch_program(ctx_of(memo), _plain(body))

    # Only a program with an open session carries the finalizer (kopf adds it while this filter, or the
    # timer's, matches): a finished or sessionless one is deleted without the operator.
    @kopf.on.delete(*PROGRAMS, id="session-end", registry=registry, retries=5, backoff=backoff,
                    when=lambda status, **_: session_open(status))
    async def program_deleted(body: kopf.Body, memo: kopf.Memo, retry: int, **_: Any) -> None:
        try:
            await end_program(ctx_of(memo), _plain(body))
        except GatewayError as exc:
            if retry < 4:
                raise kopf.TemporaryError(f"cannot end the session: {exc}", delay=backoff) from exc
            log.warning("giving up ending the session of %s: %s", body.metadata.name, exc)

    return registry


def _plain(body: kopf.Body) -> dict[str, Any]:
    """kopf's live body view as a plain dict snapshot."""
    return copy.deepcopy(dict(body))
