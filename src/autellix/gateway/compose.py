"""The gateway's composition root: the whole gateway built from its configuration, in one place.

``build_gateway`` makes every part once and hands each module what it uses:
the program store (in memory, or shared through Redis with ``store_url``) and
the session rules over it; the stored-response records; the engines' HTTP
client, the engine pool and the request controller; the tenants' keys, limits
and slots; the call path; engine drains (shared by replicas with a store); the
metrics; the admin listener; and the services whose lives the app runs, in
start order. ``create_app`` puts the tenants' routes over it and installs the
process's life cycle (readiness, the drain on SIGTERM, per-replica counters)
and the heap trim. ``autellix.gateway.serve`` runs the result.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from autellix.backends import EngineBackend, backend_by_name
from autellix.control import MemoryProgramStore, ProgramStore, RequestController, RetryPolicy, Sessions
from autellix.control.admission import ProgramGate
from autellix.control.keys import ENV_ADMIN_KEYS, ENV_API_KEYS, KeyRing, sources_from
from autellix.control.limits import TenantLimiter
from autellix.control.response_records import MemoryResponseRecords, RedisResponseRecords
from autellix.control.standing import TenantStanding
from autellix.core import Policy, QueueSpec, balancer_from_config, policy_by_name
from autellix.core.admission import ProgramAdmission
from autellix.gateway.admin import AdminListener
from autellix.gateway.call_path import CallPath, TenantSlots
from autellix.gateway.config import GatewayConfig
from autellix.gateway.engine_http import EngineHttp
from autellix.gateway.engines import EnginePool, StaticDiscovery
from autellix.gateway.heap import install_heap_trim
from autellix.gateway.lifecycle import Lifecycle, open_store
from autellix.gateway.metrics import AdmissionCollector, GatewayMetrics, MetricsObserver
from autellix.gateway.parts import Gateway, LocalDrains, NoAdminListener, Service
from autellix.gateway.routes import create_tenant_app
from autellix.gateway.service_check import EngineServiceCheck, takeover_metrics
from autellix.gateway.tokens import estimate_tokens, tokenizer_counter
from autellix.gateway.upkeep import KeyReload, SessionExpiry
from autellix.gateway.views import engine_label
from autellix.protocol import ENGINE_TOKEN_ENV

#: aiohttp's HTTP parser limits (its defaults: 8,190 bytes a header line): up to them, the gateway's
#: own checks answer (an over-long session header: 400 ``invalid_header``); over them, the parser
#: refuses the request before any route runs and ``GatewayRunner`` answers 431 ``header_too_large``,
#: both in the OpenAI shape.
SERVER_LIMITS: dict[str, int] = {"max_line_size": 65_536, "max_field_size": 65_536}


class _Started:
    """A part whose start and stop are two given functions (a store's close, the shared drains' start)."""

    def __init__(self, start: Callable[[], Awaitable[object]] | None = None,
                 stop: Callable[[], Awaitable[object]] | None = None) -> None:
        self._start, self._stop = start, stop

    async def start(self) -> None:
        if self._start is not None:
            await self._start()

    async def stop(self) -> None:
        if self._stop is not None:
            await self._stop()


def build_gateway(config: GatewayConfig, *, store: ProgramStore | None = None, store_url: str | None = None,
                  backend: EngineBackend | None = None) -> tuple[Gateway, Callable[[], Awaitable[object]] | None]:
    """Every part of one gateway, wired; and the store's ping when it is shared (``store_url``)."""
    sched = config.scheduler
    policy = policy_by_name(sched.policy)
    shared = _SharedParts(store_url, config, policy) if store_url is not None else None
    if shared is not None:
        store, responses, drains = shared.store, shared.responses, shared.drains
    else:
        store = store if store is not None else MemoryProgramStore(policy, idle_ttl=sched.program_idle_ttl)
        responses, drains = MemoryResponseRecords(ttl=config.response_ttl), LocalDrains()
    backend = backend or backend_by_name(config.backend)
    http = EngineHttp(token=config.engine_token or os.environ.get(ENGINE_TOKEN_ENV) or None)
    pool = EnginePool(config.discovery or StaticDiscovery(config.engines), http, poll_interval=config.poll_interval,
                      on_removed=store.drop_engine, backend=backend)
    gate = ProgramGate(ProgramAdmission(), lambda: pool.engine_loads(config.engine_slots)) \
        if config.program_admission else None
    sessions = Sessions(store, TenantStanding(config.standing_half_life) if config.standing_half_life else None,
                        gate)
    tenant_keys = KeyRing(sources_from([config.api_keys_file] if config.api_keys_file else [], ENV_API_KEYS,
                                       os.environ))
    admin_keys = KeyRing(sources_from([config.admin_keys_file] if config.admin_keys_file else [], ENV_ADMIN_KEYS,
                                      os.environ))
    limiter = TenantLimiter(config.tenant_limits, config.per_tenant_limits)
    metrics = GatewayMetrics(lambda: [(e.waiting, e.service) for e in store.programs()],
                             lambda: {engine_label(u): e.inflight for u, e in pool.engines.items()},
                             lambda: _breakers(pool))
    controller = RequestController(
        store=store, engines=pool, backend=backend, balancer=balancer_from_config(sched),
        queues=QueueSpec.from_config(sched), policy=policy, send_priority=config.engine_priority,
        retry=RetryPolicy(max_attempts=config.max_attempts, backoff_base=config.retry_backoff),
        observer=MetricsObserver(metrics), on_program_left=sessions.program_left,
        on_call_done=gate.call_finished if gate is not None else None)
    if gate is not None:
        metrics.registry.register(AdmissionCollector(gate))
    store.check_takeovers(EngineServiceCheck(http, pool, backend), takeover_metrics(metrics.registry))
    counter = tokenizer_counter(config.tokenizer) if config.tokenizer else estimate_tokens
    calls = CallPath(config=config, controller=controller, pool=pool, slots=TenantSlots(limiter), backend=backend,
                     http=http, count_tokens=counter)
    listener = None if config.admin_port is None else AdminListener(
        lambda: gateway, admin_keys if admin_keys.enabled else None, config.admin_host, config.admin_port,
        SERVER_LIMITS)
    # started in this order, stopped in reverse: the admin listener first; the store's last write behind
    # (and, when shared, its close) last
    services: list[Service] = [
        _Started(stop=store.flush) if shared is None else shared.store_life,
        _Started(stop=responses.close),
        http,
        pool,
        *([shared.drains_life(pool)] if shared is not None else []),
        SessionExpiry(store, sessions, limiter),
        *([gate] if gate is not None else []),
        KeyReload({"tenant": tenant_keys, "admin": admin_keys}, config.keys_reload_interval),
        *([listener] if listener is not None else []),
    ]
    gateway = Gateway(config=config, store=store, sessions=sessions, responses=responses, pool=pool,
                      controller=controller, calls=calls, limiter=limiter, tenant_keys=tenant_keys,
                      admin_keys=admin_keys, metrics=metrics, drains=drains, admission=gate,
                      admin=listener if listener is not None else NoAdminListener(), services=services)
    return gateway, shared.ping if shared is not None else None


def _breakers(pool: EnginePool) -> dict[str, tuple[str, int]]:
    now = time.monotonic()
    return {engine_label(u): (e.breaker.state(now).value, e.breaker.opened_total) for u, e in pool.engines.items()}


class _SharedParts:
    """What a shared store brings: the Redis program store, stored-response records and engine drains."""

    def __init__(self, store_url: str, config: GatewayConfig, policy: Policy) -> None:
        from autellix.control.shared_drains import SharedDrains  # redis: only with a store

        self.store, self.ping, close = open_store(store_url, policy, config.scheduler.program_idle_ttl)
        self.responses = RedisResponseRecords(store_url, ttl=config.response_ttl)
        self.drains = SharedDrains(store_url, poll_interval=config.poll_interval)

        self.store_life = _Started(stop=close)  # its close writes what is pending, if the store answers

    def drains_life(self, pool: EnginePool) -> Service:
        async def start() -> None:
            self.drains.start(pool)

        return _Started(start=start, stop=self.drains.stop)


def create_app(config: GatewayConfig, *, store: ProgramStore | None = None, store_url: str | None = None,
               replica: str | None = None, shutdown_grace: float = 30.0, heap_trim_every: float = 0.0,
               backend: EngineBackend | None = None) -> web.Application:
    """The gateway's app: its parts (``build_gateway``), the tenants' routes over them, the life cycle."""
    gateway, ping = build_gateway(config, store=store, store_url=store_url, backend=backend)
    app = create_tenant_app(gateway)
    lifecycle = Lifecycle(replica=replica or f"{socket.gethostname()}", shutdown_grace=shutdown_grace,
                          store_ping=ping, key_ttl=config.scheduler.program_idle_ttl)
    lifecycle.install(app, gateway.metrics.registry)
    install_heap_trim(app, heap_trim_every)
    return app


__all__ = ["SERVER_LIMITS", "build_gateway", "create_app"]
