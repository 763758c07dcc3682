"""What the operator's handlers and passes share: its configuration, its clients, what it remembers.

Also the one rule for failures that are part of running in a cluster (the
gateway unreachable or erroring, an API conflict, the API server away for a
moment): ``expected`` says which they are; the operator logs each as one line
(no traceback), shows it in status and tries again at its next pass.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from autellix.kube.autoscaler import LoadHistory
from autellix.kube.gateway_client import GatewayClient, GatewayError
from autellix.kube.kubeapi import KubeApi
from autellix.kube.manifests import PickerSettings
from autellix.kube.recorder import EventRecorder
from autellix.kube.spec import DEFAULT_ENGINE_GPU_IMAGE, DEFAULT_ENGINE_IMAGE

log = logging.getLogger("autellix.kube")

#: API answers that say "not now" rather than "never": a conflict, throttling, the server unavailable.
PASSING_STATUSES = frozenset({409, 429, 500, 502, 503, 504})


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
    #: Seconds between two passes over the engines (the autoscaler, and reconciles to try again).
    autoscale_interval: float = 15.0
    #: Seconds between two passes over the running AgentPrograms (their sessions read, their Jobs checked).
    program_poll_interval: float = 5.0
    #: Seconds before a failed kopf handler runs again (an unexpected error).
    retry_backoff: float = 10.0
    #: The engine image of an AutellixEngine whose spec names none and asks for no GPU.
    engine_image: str = DEFAULT_ENGINE_IMAGE
    #: ... and of one whose spec names none and asks for GPUs (``resources.gpus > 0``): the CUDA image.
    engine_gpu_image: str = DEFAULT_ENGINE_GPU_IMAGE
    #: Also make a Gateway API InferencePool per engine (once its CRD is installed).
    inference_pool: bool = False
    #: Also run ``autellix epp`` as each engine's endpoint picker (implies the InferencePool; docs/epp.md).
    endpoint_picker: PickerSettings | None = None


@dataclass
class ProgramState:
    """What this operator knows of one AgentProgram beyond its status; the lock keeps the program's start,
    its pass and its deletion from interleaving."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: The session opened for it and its gateway (kept until they are in status: a failed Job creation
    #: reuses the session, and a deletion before then ends it).
    session: str | None = None
    gateway: str | None = None
    #: Its start is written to status (a pass acting on an older listing must not start it again).
    started: bool = False


@dataclass
class Context:
    """What every handler and pass needs; kopf hands it over in ``memo``."""

    api: KubeApi
    gateway: GatewayClient
    config: OperatorConfig
    events: EventRecorder
    #: The namespaces served; empty: the whole cluster.
    namespaces: tuple[str, ...] = ()
    #: Engine URL -> when the autoscaler removed it (a pod on its way out is not counted again).
    removed: dict[str, float] = field(default_factory=dict)
    #: Engine uid -> its load samples within the autoscaler's windows.
    history: dict[str, LoadHistory] = field(default_factory=dict)
    #: Engine uids whose reconcile failed for a passing reason: the engines' pass tries them again.
    retry: set[str] = field(default_factory=set)
    #: The engine uids of the last pass (the states of an engine gone are forgotten).
    engines_seen: set[str] = field(default_factory=set)
    #: Engine uid -> the lock every read-modify-write of its status holds (a reconcile, an autoscaler step):
    #: status conditions are one list, and a merge patch replaces a list whole, so two writers that read
    #: before either wrote would drop the other's condition.
    engine_locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    #: AgentProgram uid -> this operator's state of it, while it runs.
    programs: dict[str, ProgramState] = field(default_factory=dict)
    #: AgentProgram uid -> when its DELETED event came (a pass that listed it before leaves it alone).
    gone: dict[str, float] = field(default_factory=dict)

    def program(self, uid: str) -> ProgramState:
        return self.programs.setdefault(uid, ProgramState())

    def engine_lock(self, uid: str) -> asyncio.Lock:
        return self.engine_locks.setdefault(uid, asyncio.Lock())


def expected(exc: BaseException) -> bool:
    """A failure of running in a cluster, to be tried again (not a bug): the gateway unreachable or erroring,
    an API conflict, throttling or an API server that is away."""
    if isinstance(exc, ApiException):
        return exc.status in PASSING_STATUSES
    return isinstance(exc, GatewayError | aiohttp.ClientError | OSError | TimeoutError)


def describe(exc: BaseException) -> str:
    """One line for a log or a status message."""
    if isinstance(exc, ApiException):
        return f"the API server answered {exc.status} {exc.reason}"
    return str(exc) or exc.__class__.__name__


async def write_status(ctx: Context, path: str, previous: dict[str, Any], changes: dict[str, Any]) -> None:
    """Merge-patch ``changes`` into the object's status, when any differs from ``previous``."""
    if any(previous.get(k) != v for k, v in changes.items()):
        await ctx.api.merge_patch(path + "/status", {"status": changes})


def named(obj: dict[str, Any]) -> str:
    """``AgentProgram team-a/react``: how log lines name a resource."""
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind', 'object')} {meta.get('namespace')}/{meta.get('name')}"


async def report(ctx: Context, obj: dict[str, Any], topic: str, reason: str, message: str) -> None:
    """A lasting failure of ``topic`` (the gateway, the spec, a name) of ``obj``: a Warning Event and a log
    warning when it starts or changes, a debug line at each later pass while it lasts."""
    if await ctx.events.warning(obj, topic, reason, message):
        log.warning("%s: %s", named(obj), message)
    else:
        log.debug("%s: still %s: %s", named(obj), reason, message)


def recovered(ctx: Context, obj: dict[str, Any], topic: str) -> None:
    """``topic`` of ``obj`` is fine again: said once, and its warning posts again if it comes back."""
    if (reason := ctx.events.resolved(obj, topic)) is not None:
        log.info("%s: %s no more", named(obj), reason)
