"""The gateway's composition root: the whole gateway built from its configuration, in one place.

``build_gateway`` makes every part once and hands each module what it uses:
the store (``autellix.control.store.base``: programs, stored-response records
and engine drains, in memory or shared with other replicas through
``GatewayConfig.store_url``) and the session rules over it; the engines' HTTP
client, the engine pool and the request controller, queued as its policy lays
the queues out; the tenants' keys, limits and slots; the call path; the metrics
(the store's among them); the admin listener; and the services whose lives the
app runs, in start order. ``create_app`` puts the tenants' routes over it and
installs the process's life cycle (readiness, the drain on SIGTERM), the
per-replica counters and the heap trim. ``autellix.gateway.serve`` runs the result.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from autellix.backends import EngineBackend, backend_by_name
from autellix.control import RequestController, RetryPolicy, Sessions
from autellix.control.admission import ProgramGate
from autellix.control.keys import ENV_ADMIN_KEYS, ENV_API_KEYS, KeyRing, sources_from
from autellix.control.limits import TenantLimiter
from autellix.control.standing import TenantStanding
from autellix.control.store.base import GatewayStore, open_store
from autellix.core import PrefixIndex, balancer_from_config, policy_by_name, reads_cache
from autellix.core.admission import ProgramAdmission
from autellix.gateway.admin import AdminListener
from autellix.gateway.call_path import CallPath, TenantSlots
from autellix.gateway.config import GatewayConfig
from autellix.gateway.engine_http import EngineHttp
from autellix.gateway.engines import EnginePool, StaticDiscovery
from autellix.gateway.heap import install_heap_trim
from autellix.gateway.kv_events import KvEventFeed
from autellix.gateway.lifecycle import Lifecycle
from autellix.gateway.metrics import (
    AdmissionCollector,
    GatewayMetrics,
    KvIndexCollector,
    MetricsObserver,
    ReplicaCounters,
    TenantCollector,
)
from autellix.gateway.parts import Gateway, NoAdminListener, Service
from autellix.gateway.prompt_blocks import ChatPrompt, EngineTokenizers, PromptBlocks
from autellix.gateway.routes import create_tenant_app
from autellix.gateway.service_check import EngineServiceCheck
from autellix.gateway.tokens import estimate_tokens, tokenizer_counter
from autellix.gateway.upkeep import KeyReload, SessionExpiry
from autellix.gateway.views import engine_label
from autellix.protocol import ENGINE_TOKEN_ENV

#: aiohttp's HTTP parser limits (its defaults: 8,190 bytes a header line): up to them, the gateway's
#: own checks answer (an over-long session header: 400 ``invalid_header``); over them, the parser
#: refuses the request before any route runs and ``GatewayRunner`` answers 431 ``header_too_large``,
#: both in the OpenAI shape.
SERVER_LIMITS: dict[str, int] = {"max_line_size": 65_536, "max_field_size": 65_536}


def build_gateway(config: GatewayConfig, *, store: GatewayStore | None = None,
                  backend: EngineBackend | None = None) -> Gateway:
    """Every part of one gateway, wired; on ``store`` if one is given, else on ``config.store_url``'s."""
    sched = config.scheduler
    policy = policy_by_name(sched.policy)
    if store is None:
        store = open_store(config.store_url, policy, idle_ttl=sched.program_idle_ttl, response_ttl=config.response_ttl,
                           poll_interval=config.poll_interval)
    programs = store.programs
    backend = backend or backend_by_name(config.backend)
    http = EngineHttp(token=config.engine_token or os.environ.get(ENGINE_TOKEN_ENV) or None)
    feed = KvEventFeed(PrefixIndex()) if config.kv_index and reads_cache(sched) else None
    tokenizers = EngineTokenizers(http, ChatPrompt.from_model_dir(config.tokenizer) if config.tokenizer else None)

    def engine_removed(url: str) -> None:
        programs.drop_engine(url)
        if feed is not None:
            feed.engine_removed(url)

    def engine_described(url: str, events: Mapping[str, Any] | None) -> None:
        assert feed is not None
        feed.engine_described(url, events)
        if events is not None and url in pool.engines:
            tokenizers.engine_described(url, pool.engines[url].model_ids)

    pool = EnginePool(config.discovery or StaticDiscovery(config.engines), http, poll_interval=config.poll_interval,
                      on_removed=engine_removed, backend=backend,
                      on_described=engine_described if feed is not None else None)
    gate = ProgramGate(ProgramAdmission(), lambda: pool.engine_loads(config.engine_slots)) \
        if config.program_admission else None
    sessions = Sessions(programs, TenantStanding(config.standing_half_life) if config.standing_half_life else None,
                        gate)
    tenant_keys = KeyRing(sources_from([config.api_keys_file] if config.api_keys_file else [], ENV_API_KEYS,
                                       os.environ))
    admin_keys = KeyRing(sources_from([config.admin_keys_file] if config.admin_keys_file else [], ENV_ADMIN_KEYS,
                                      os.environ))
    limiter = TenantLimiter(config.tenant_limits, config.per_tenant_limits)
    weigh_tenants = lambda: programs.tenants.configure(tenant_keys.weights)  # noqa: E731
    weigh_tenants()
    metrics = GatewayMetrics(lambda: [(e.waiting, e.service) for e in programs.programs()],
                             lambda: {engine_label(u): e.inflight for u, e in pool.engines.items()},
                             lambda: _breakers(pool))
    for collector in store.collectors():
        metrics.registry.register(collector)
    metrics.registry.register(TenantCollector(programs.tenants))
    if feed is not None:
        metrics.registry.register(KvIndexCollector(feed.index, engine_label))
    controller = RequestController(
        store=programs, engines=pool, backend=backend, balancer=balancer_from_config(sched),
        queues=policy.queues(sched), policy=policy, send_priority=config.engine_priority,
        retry=RetryPolicy(max_attempts=config.max_attempts, backoff_base=config.retry_backoff),
        observer=MetricsObserver(metrics), on_program_left=sessions.program_left,
        on_call_done=gate.call_finished if gate is not None else None,
        kv_index=feed.index if feed is not None else None)
    if gate is not None:
        metrics.registry.register(AdmissionCollector(gate))
    store.check_takeovers(EngineServiceCheck(http, pool, backend))
    counter = tokenizer_counter(config.tokenizer) if config.tokenizer else estimate_tokens
    calls = CallPath(config=config, controller=controller, pool=pool, slots=TenantSlots(limiter), backend=backend,
                     http=http, count_tokens=counter,
                     prompt_blocks=PromptBlocks(tokenizers, feed) if feed is not None else None)
    listener = None if config.admin_port is None else AdminListener(
        lambda: gateway, admin_keys if admin_keys.enabled else None, config.admin_host, config.admin_port,
        SERVER_LIMITS)
    drains = store.drains.applied_to(pool)
    # started in this order, stopped in reverse: the admin listener first; the store (its last write behind
    # and, when shared, its connection's close) last
    services: list[Service] = [
        store,
        http,
        *([feed, tokenizers] if feed is not None else []),
        pool,
        *([drains] if drains is not None else []),
        SessionExpiry(programs, sessions, limiter),
        *([gate] if gate is not None else []),
        KeyReload({"tenant": tenant_keys, "admin": admin_keys}, config.keys_reload_interval, weigh_tenants),
        *([listener] if listener is not None else []),
    ]
    gateway = Gateway(config=config, store=store, sessions=sessions, pool=pool, controller=controller, calls=calls,
                      limiter=limiter, tenant_keys=tenant_keys, admin_keys=admin_keys, metrics=metrics,
                      admission=gate, admin=listener if listener is not None else NoAdminListener(),
                      services=services)
    return gateway


def _breakers(pool: EnginePool) -> dict[str, tuple[str, int]]:
    now = time.monotonic()
    return {engine_label(u): (e.breaker.state(now).value, e.breaker.opened_total) for u, e in pool.engines.items()}


def create_app(config: GatewayConfig, *, store: GatewayStore | None = None, replica: str | None = None,
               shutdown_grace: float = 30.0, heap_trim_every: float = 0.0,
               backend: EngineBackend | None = None) -> web.Application:
    """The gateway's app: its parts (``build_gateway``), the tenants' routes over them, the life cycle and the
    per-replica counters (``replica``: this replica's label, default the host's name)."""
    gateway = build_gateway(config, store=store, backend=backend)
    app = create_tenant_app(gateway)
    counters = ReplicaCounters(replica or socket.gethostname(), gateway.metrics.registry,
                               key_ttl=config.scheduler.program_idle_ttl)
    Lifecycle(shutdown_grace=shutdown_grace, on_request=counters.count).install(app)
    install_heap_trim(app, heap_trim_every)
    return app


__all__ = ["SERVER_LIMITS", "build_gateway", "create_app"]
