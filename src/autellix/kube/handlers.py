"""kopf's registry of the operator: which kopf handler calls what, a few lines each (``engines``, ``programs``).

AutellixEngine: create/update/resume apply its children and write its status;
events of those children (a delete, an edit, a rollout's progress) do the same,
and so does the InferencePool CRD's arrival for the engines that went without
their pool. AgentProgram: create/resume open its session and create its Job;
its DELETED watch event (the last body, whose status names the session and the
gateway) ends the session. What runs periodically (the autoscaler, following
running programs) is not a kopf timer but a pass over the served objects that
``run.py`` repeats in the leader (``engines.engines_pass``,
``programs.programs_pass``).

No finalizer on either kind. kopf adds its finalizer to an object that one of
its timers, daemons or non-optional deletion handlers matches, and the operator
registers none: deleting an engine, a program or their namespace never waits
for an operator, whether one runs or not (``helm uninstall`` takes the operator
with it). An engine's children carry owner references, which the garbage
collector follows; a program deleted while no operator runs leaves its session
to the gateway's idle TTL. Objects an older version finalized
(``autellix.ai/finalizer``, kopf's finalizer under our name, which
``settings_for`` keeps) are released by kopf itself the first time it sees them,
since no handler needs the finalizer; ``autellix kube release-finalizers``
releases them when no operator runs.
"""

from __future__ import annotations

import copy
from typing import Any

import kopf

from autellix.kube import ENGINE_PLURAL, FINALIZER, GROUP, PROGRAM_PLURAL, VERSION
from autellix.kube.conditions import condition
from autellix.kube.context import Context, OperatorConfig
from autellix.kube.engines import engine_child_event, inference_pool_api_arrived, reconcile_or_retry
from autellix.kube.manifests import INFERENCE_POOL_CRD, LABEL_COMPONENT, LABEL_MANAGED_BY, MANAGED_BY
from autellix.kube.programs import program_deleted, start_or_retry

ENGINES = (GROUP, VERSION, ENGINE_PLURAL)
PROGRAMS = (GROUP, VERSION, PROGRAM_PLURAL)


def settings_for(settings: kopf.OperatorSettings) -> None:
    """Keep kopf's bookkeeping under our own prefix, in annotations (the status schema stays strict)."""
    # The finalizer kopf would set, and removes wherever no handler needs it: older versions set it.
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP,
                                                                            key="last-handled-configuration")
    settings.peering.standalone = True  # replicas elect a leader on a Lease instead (leader.py)


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
        await reconcile_or_retry(ctx_of(memo), _plain(body))

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
        await start_or_retry(ctx_of(memo), _plain(body))

    # A watch event, not a deletion handler: kopf would finalize every program for one (see above).
    @kopf.on.event(*PROGRAMS, id="program-deleted", registry=registry)
    async def program_gone(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
        if type == "DELETED":
            await program_deleted(ctx_of(memo), _plain(body))

    return registry


def _plain(body: kopf.Body) -> dict[str, Any]:
    """kopf's live body view as a plain dict snapshot."""
    return copy.deepcopy(dict(body))
