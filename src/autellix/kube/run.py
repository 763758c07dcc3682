"""Run the operator: ``autellix operator`` in a pod, or in-process in the tests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import urllib.parse
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import aiohttp
import kopf
from aiohttp import web
from kubernetes_asyncio.client.exceptions import ApiException

from autellix.kube.context import Context, OperatorConfig, describe, expected
from autellix.kube.engines import engines_pass
from autellix.kube.gateway_client import GatewayClient
from autellix.kube.handlers import build_registry, default_login, settings_for
from autellix.kube.kubeapi import KubeApi
from autellix.kube.leader import LeaderElector, LeaseConfig
from autellix.kube.programs import programs_pass
from autellix.kube.recorder import EventRecorder

log = logging.getLogger("autellix.kube")

Flag = asyncio.Event | threading.Event


class LeadershipLost(RuntimeError):
    """Another replica may hold the Lease now: this one stopped reconciling (its pod restarts as a candidate)."""


async def _wait_flag(flag: Flag) -> None:
    while not flag.is_set():  # a threading.Event cannot be awaited; polled
        if isinstance(flag, asyncio.Event):
            await flag.wait()
        else:
            await asyncio.sleep(0.1)


async def periodically(interval: float, step: Callable[[], Awaitable[None]], what: str) -> None:
    """``step`` every ``interval`` seconds for as long as kopf runs (in the leader only). A step that fails
    for a passing reason (the API server away, a list refused) is one log line, and the next comes all the
    same; any other failure ends it, and the operator stops (saying why)."""
    while True:
        await asyncio.sleep(interval)
        try:
            await step()
        except Exception as exc:
            if not expected(exc) and not isinstance(exc, ApiException):
                raise
            log.warning("%s: %s", what, describe(exc))


@contextlib.asynccontextmanager
async def standby_liveness(endpoint: str | None) -> Any:
    """While a replica waits for the Lease, its liveness probe still answers (kopf's own endpoint, on the
    same address, only runs in the leader); else the kubelet would restart every standby replica."""
    if endpoint is None:
        yield
        return
    url = urllib.parse.urlsplit(endpoint)
    app = web.Application()
    app.router.add_get(url.path or "/", lambda _: web.json_response({"standby": True}))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, url.hostname or "0.0.0.0", url.port or 80).start()
    try:
        yield
    finally:
        await runner.cleanup()


async def run_operator(config: OperatorConfig, *, api: KubeApi | None = None, namespaces: Collection[str] = (),
                       login: Callable[..., Any] = default_login,
                       tune: Callable[[kopf.OperatorSettings], None] | None = None,
                       stop_flag: Flag | None = None, ready_flag: Flag | None = None,
                       liveness_endpoint: str | None = None, leader: LeaseConfig | None = None) -> None:
    """kopf's operator with our handlers; cluster-wide unless ``namespaces`` are given. With ``leader``, it
    first waits to hold that Lease, and reconciles only while it does (``LeadershipLost`` when it stops)."""
    settings = kopf.OperatorSettings()
    settings_for(settings)
    # Serving named namespaces, kopf needs no namespace list (it would retry a forbidden one for a minute
    # before every start): those namespaces, and the kinds present at start, are what it serves.
    settings.scanning.disabled = bool(namespaces)
    if tune is not None:
        tune(settings)
    api = api or await KubeApi.from_environment()
    # Named in the API server's audit log (and in the tests' check of what the operator touches).
    api.api_client.user_agent = "autellix-operator" + (f" ({leader.identity})" if leader else "")
    elector = LeaderElector(api, leader) if leader is not None else None
    try:
        if elector is not None:
            acquired = asyncio.ensure_future(elector.acquire())
            stopped = asyncio.ensure_future(_wait_flag(stop_flag)) if stop_flag is not None else None
            async with standby_liveness(liveness_endpoint):
                await asyncio.wait([t for t in (acquired, stopped) if t], return_when=asyncio.FIRST_COMPLETED)
            for task in (acquired, stopped):
                if task is not None and not task.done():
                    task.cancel()
            if not acquired.done() or acquired.cancelled():
                return  # stopped while standing by
            acquired.result()
        kopf_stop = asyncio.Event()
        watchers = [asyncio.ensure_future(_wait_flag(stop_flag))] if stop_flag is not None else []
        holding = asyncio.ensure_future(elector.hold()) if elector is not None else None
        for task in [*watchers, *([holding] if holding else [])]:
            task.add_done_callback(lambda _: kopf_stop.set())
        try:
            async with aiohttp.ClientSession() as http:
                client = GatewayClient(http, config.gateway_api_key, default_gateway=config.gateway_url,
                                       admin_url=config.gateway_admin_url, admin_key=config.gateway_admin_key)
                events = EventRecorder(api, instance=leader.identity if leader else socket.gethostname())
                ctx = Context(api=api, gateway=client, config=config, events=events, namespaces=tuple(namespaces))
                loop = asyncio.get_running_loop()
                for interval, step, what in (
                        (config.autoscale_interval, lambda: engines_pass(ctx, loop.time()), "the engines' pass"),
                        (config.program_poll_interval, lambda: programs_pass(ctx), "the programs' pass")):
                    task = asyncio.ensure_future(periodically(interval, step, what))
                    task.add_done_callback(lambda _: kopf_stop.set())  # it ends only by failing: stop, say why
                    watchers.append(task)
                await kopf.operator(registry=build_registry(config, login), settings=settings,
                                    memo=kopf.Memo(ctx=ctx), clusterwide=not namespaces, namespaces=list(namespaces),
                                    standalone=True, stop_flag=kopf_stop, ready_flag=ready_flag,
                                    liveness_endpoint=liveness_endpoint)
        finally:
            lost = holding is not None and holding.done() and not holding.cancelled()
            for task in [*watchers, *([holding] if holding else [])]:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if lost:
            raise LeadershipLost(f"lost Lease {leader.namespace}/{leader.name}")  # type: ignore[union-attr]
        if elector is not None:
            await elector.release()
    finally:
        await api.close()
