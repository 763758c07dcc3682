"""The gateway's transport: aiohttp routes, validation, the upstream relay.

Layers, each replaceable: this module translates HTTP to calls on the request
controller (``autellix.control``: sessions, routing, retries, settlement) and
back; program state sits behind ``ProgramStore``; the engine pool
(``engines.py``) knows which engines serve which model and how loaded they
are; the engine backend (``autellix.backends``) knows what is engine-specific.
``Gateway`` wires them together.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import ipaddress
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from autellix.backends import DEFAULT_BACKEND, EngineBackend, backend_by_name
from autellix.control import Attempt, CallSpec, MemoryProgramStore, ProgramStore, RequestController, RetryPolicy
from autellix.control.keys import ENV_ADMIN_KEYS, ENV_API_KEYS, KeyRing, sources_from
from autellix.control.limits import TenantLimiter, TenantLimits, Ticket
from autellix.control.sessions import Sessions
from autellix.control.standing import TenantStanding
from autellix.core import SchedulerConfig, balancer_from_config, policy_by_name
from autellix.core.mlq import QueueSpec
from autellix.gateway.admin import create_admin_app
from autellix.gateway.engines import Discovery, EnginePool, StaticDiscovery
from autellix.gateway.errors import APIError, GatewayRunner, bad_request, error_response, not_found, unavailable
from autellix.gateway.lifecycle import LIFECYCLE_KEY
from autellix.gateway.metrics import GatewayMetrics
from autellix.gateway.openapi import OPENAPI_PATH, tenant_document
from autellix.gateway.service_check import EngineServiceCheck, takeover_metrics
from autellix.gateway.tokens import Counter, estimate_tokens, prompt_text, tokenizer_counter
from autellix.gateway.upstream import open_upstream, relay_stream, relay_whole
from autellix.gateway.validation import MAX_N, MAX_TOKENS, check_body
from autellix.protocol import (
    CHAT_COMPLETIONS_PATH,
    COMPLETIONS_PATH,
    ENGINE_TOKEN_ENV,
    ENGINE_TOKEN_HEADER,
    HEALTH_PATH,
    METRICS_PATH,
    MODELS_PATH,
    READY_PATH,
    SESSION_OBJECT,
    SESSION_ROUTE,
    SESSIONS_PATH,
)

log = logging.getLogger("autellix.gateway")

JSON_HEADERS = {"Content-Type": "application/json"}
#: aiohttp's HTTP parser limits (its defaults: 8,190 bytes a header line): up to them, the gateway's
#: own checks answer (an over-long session header: 400 ``invalid_header``); over them, the parser
#: refuses the request before any route runs and ``GatewayRunner`` answers 431 ``header_too_large``,
#: both in the OpenAI shape.
SERVER_LIMITS: dict[str, int] = {"max_line_size": 65_536, "max_field_size": 65_536}
#: Idle connections to engines are closed after this many seconds, before the engine closes them
#: (vLLM's API server, uvicorn: 5 s, ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``): a call sent on a connection
#: the engine is closing is dropped unread (``gateway.upstream.open_upstream`` sends it once more).
ENGINE_KEEPALIVE_S = 4.0
#: Prompts up to this many characters are tokenised inline (well under a millisecond); longer ones on a thread.
INLINE_TOKENIZE_CHARS = 16_384


@dataclass
class GatewayConfig:
    engines: list[str] = field(default_factory=list)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    #: Largest accepted request body.
    max_body_bytes: int = 4 * 1024 * 1024
    #: Send the program's queue level as the engine's priority (vLLM engines need
    #: ``--scheduling-policy priority`` or the Autellix scheduler).
    engine_priority: bool = True
    poll_interval: float = 1.0
    #: Tenants' keys: a file or a mounted Secret's directory (``autellix.control.keys``), and/or
    #: ``$AUTELLIX_API_KEYS``. None of both: no tenant auth (only on loopback or with ``--allow-anonymous``).
    api_keys_file: Path | None = None
    #: Keys of the admin listener: a file or a Secret's directory, and/or ``$AUTELLIX_ADMIN_KEYS``.
    admin_keys_file: Path | None = None
    #: The admin listener (engines, drain, calls, sessions on a tenant's behalf), apart from the
    #: tenants' port; None: no admin listener; 0: any free port (``Gateway.admin_url`` says which).
    admin_port: int | None = None
    admin_host: str = "127.0.0.1"
    #: Serve tenants without keys beyond loopback (``--allow-anonymous``); off, such a start is refused.
    allow_anonymous: bool = False
    #: Per-tenant limits (``autellix.control.limits``); the default limits nothing.
    tenant_limits: TenantLimits = field(default_factory=TenantLimits)
    #: Half-life (seconds) of a tenant's standing: its new programs start at the service its recent
    #: programs carried (``autellix.control.standing``); None or 0: off. Named tenants only.
    standing_half_life: float | None = 60.0
    #: Tenants with limits of their own (tenant name -> limits).
    per_tenant_limits: dict[str, TenantLimits] = field(default_factory=dict)
    #: Seconds between two checks of the key files for changes (reload without restart).
    keys_reload_interval: float = 5.0
    #: The token engines take calls with (header ``X-Autellix-Engine-Token``); None: ``$AUTELLIX_ENGINE_TOKEN``.
    engine_token: str | None = None
    tokenizer: Path | None = None
    #: Upper bounds of a call's ``n`` and ``max_tokens`` (``max_completion_tokens``): larger is a 400.
    max_n: int = MAX_N
    max_tokens: int = MAX_TOKENS
    #: Engines one call may try in all (its retry budget), when engines fail before answering.
    max_attempts: int = 3
    #: Full-jitter backoff between attempts: up to this many seconds, doubling per failed attempt.
    retry_backoff: float = 0.05
    #: Seconds an engine has to answer a streamed call's headers (vLLM does so
    #: once the call is queued); after that the call moves to another engine.
    stream_header_timeout: float | None = 30.0
    #: Timeouts of one attempt at an engine (seconds; None: none): connecting; a whole call's answer
    #: (its headers come with its last token: first byte and total in one); a stream's silence
    #: between two chunks once its headers are in; the whole attempt; and a client that reads
    #: nothing of its stream (a slow reader holds its call and its engine's slot).
    connect_timeout: float | None = 5.0
    whole_timeout: float | None = 600.0
    idle_read_timeout: float | None = 120.0
    attempt_timeout: float | None = 1800.0
    write_timeout: float | None = 60.0
    discovery: Discovery | None = None
    #: The engines' kind (``autellix.backends.BACKENDS``).
    backend: str = DEFAULT_BACKEND


class _MetricsObserver:
    """The request controller's events as Prometheus metrics."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.m = metrics
        self._attempts: dict[str, Any] = {}  # labelled children, looked up once (the hot path)
        self._sources: dict[str, Any] = {}

    def routed(self, added_latency: float) -> None:
        self.m.added_latency.observe(added_latency)

    def attempt(self, reason: str, retried: bool) -> None:
        child = self._attempts.get(reason) or self._attempts.setdefault(reason, self.m.attempts.labels(reason))
        child.inc()
        if retried:
            self.m.retries.inc()

    def settled(self, source: str, wait: float) -> None:
        child = self._sources.get(source) or self._sources.setdefault(source, self.m.model_time_source.labels(source))
        child.inc()
        self.m.call_wait.observe(wait)


class Gateway:
    """One gateway: program store, engine pool, request controller, auth and metrics, wired together."""

    def __init__(self, config: GatewayConfig, *, store: ProgramStore | None = None,
                 backend: EngineBackend | None = None) -> None:
        self.config = config
        sched = config.scheduler
        self.policy = policy_by_name(sched.policy)
        self.store: ProgramStore = (store if store is not None
                                    else MemoryProgramStore(self.policy, idle_ttl=sched.program_idle_ttl))
        self.sessions = Sessions(self.store, TenantStanding(config.standing_half_life)
                                 if config.standing_half_life else None)
        self.backend: EngineBackend = backend or backend_by_name(config.backend)
        self.queues = QueueSpec.from_config(sched)
        self.balancer = balancer_from_config(sched)
        self.tenant_keys = KeyRing(sources_from([config.api_keys_file] if config.api_keys_file else [],
                                                ENV_API_KEYS, os.environ))
        self.admin_keys = KeyRing(sources_from([config.admin_keys_file] if config.admin_keys_file else [],
                                               ENV_ADMIN_KEYS, os.environ))
        self.limiter = TenantLimiter(config.tenant_limits, config.per_tenant_limits)
        self._admission: dict[int, asyncio.Future[None]] = {}
        self.engine_token = config.engine_token or os.environ.get(ENGINE_TOKEN_ENV) or None
        #: Where the admin listener serves, once it does.
        self.admin_url: str | None = None
        self._admin_runner: web.AppRunner | None = None
        self._keys_task: asyncio.Task | None = None
        self.count_tokens: Counter = tokenizer_counter(config.tokenizer) if config.tokenizer else estimate_tokens
        self.metrics = GatewayMetrics(self._program_ratios, self._inflight, self._breakers)
        self.http: aiohttp.ClientSession | None = None
        self.pool: EnginePool | None = None
        self.controller: RequestController | None = None
        self._janitor: asyncio.Task | None = None
        #: With a shared store: engine drains shared by every replica (``autellix.control.shared_drains``).
        self.shared_drains: Any = None

    # ---- life cycle ----------------------------------------------------------
    async def start(self, _app: web.Application | None = None) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=ENGINE_KEEPALIVE_S)
        # every request to an engine (calls, probes, feedback) carries the engine token: engines trust only us
        engine_headers = {ENGINE_TOKEN_HEADER: self.engine_token} if self.engine_token else None
        self.http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None,
                                          sock_connect=5), auto_decompress=False, headers=engine_headers)
        discovery = self.config.discovery or StaticDiscovery(self.config.engines)
        self.pool = EnginePool(discovery, self.http, poll_interval=self.config.poll_interval,
                               on_removed=self.store.drop_engine, backend=self.backend)
        self.controller = RequestController(
            store=self.store, engines=self.pool, backend=self.backend, balancer=self.balancer, queues=self.queues,
            policy=self.policy, send_priority=self.config.engine_priority,
            retry=RetryPolicy(max_attempts=self.config.max_attempts, backoff_base=self.config.retry_backoff),
            observer=_MetricsObserver(self.metrics), on_program_left=self.sessions.program_left)
        check_takeovers = getattr(self.store, "check_takeovers", None)
        if check_takeovers is not None:  # a shared store: programs taken over are checked against the engines
            check_takeovers(EngineServiceCheck(self.http, self.pool, self.backend),
                            takeover_metrics(self.metrics.registry))
        await self.pool.start()
        self._janitor = asyncio.create_task(self._expire_loop(), name="session-expiry")
        self._keys_task = asyncio.create_task(self._keys_loop(), name="keys-reload")
        if self.config.admin_port is not None:
            self._admin_runner = GatewayRunner(create_admin_app(self, self.admin_keys if self.admin_keys.enabled
                                                                else None), access_log=None, **SERVER_LIMITS)
            await self._admin_runner.setup()
            site = web.TCPSite(self._admin_runner, self.config.admin_host, self.config.admin_port)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.admin_url = f"http://{self.config.admin_host}:{port}"
            log.info("admin listener on %s", self.admin_url)

    async def stop(self, _app: web.Application | None = None) -> None:
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
        for task in (self._janitor, self._keys_task):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.store.flush()
        if self.pool:
            await self.pool.stop()
        if self.http:
            await self.http.close()

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(min(30.0, self.config.scheduler.program_idle_ttl / 4))
            now = time.monotonic()
            for entry in await self.store.expire(now):
                self.limiter.session_closed(entry.owner, entry.program_id, now)
                self.sessions.program_left(entry, now)
                log.info("program %s expired after %.0fs idle", entry.program_id, self.store.idle_ttl)

    async def _keys_loop(self) -> None:
        """Key files changed (a Secret rotated): reload; a broken change keeps the old keys."""
        while True:
            await asyncio.sleep(self.config.keys_reload_interval)
            for name, ring in (("tenant", self.tenant_keys), ("admin", self.admin_keys)):
                if ring.refresh():
                    log.info("%s keys reloaded: %d keys", name, len(ring))
                elif ring.last_error:
                    log.error("%s keys not reloaded, the previous ones stay: %s", name, ring.last_error)

    def identify(self, authorization: str | None) -> str | None:
        """The caller's tenant; None when tenant auth is off; 401 for a missing or wrong key."""
        if not self.tenant_keys.enabled:
            return None
        tenant = self.tenant_keys.identify(authorization)
        if tenant is None:
            raise APIError(401, "Invalid or missing API key (Authorization: Bearer ...).",
                           type="authentication_error", code="invalid_api_key")
        return tenant.name

    # ---- per-tenant admission -------------------------------------------------------
    async def admit(self, tenant: str | None) -> Ticket:
        """A slot for one call of ``tenant``: at once, after waiting in its queue, or a ``Refusal`` (429)."""
        ticket = self.limiter.enter_call(tenant, time.monotonic())
        if ticket.admitted:
            return ticket
        waiter = asyncio.get_running_loop().create_future()
        self._admission[ticket.number] = waiter
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.limiter.limits_of(tenant).queue_timeout_s)
        except TimeoutError:
            if not ticket.admitted:
                self.release(tenant, ticket)
                raise self.limiter.queue_timeout(tenant, time.monotonic()) from None
        except BaseException:  # the client left while queued (or was admitted as it left)
            self.release(tenant, ticket)
            raise
        finally:
            self._admission.pop(ticket.number, None)
        return ticket

    def release(self, tenant: str | None, ticket: Ticket, *, tokens_used: int = 0,
                held_since: float | None = None) -> None:
        for admitted in self.limiter.leave_call(tenant, ticket, time.monotonic(), tokens_used=tokens_used,
                                                held_since=held_since):
            waiter = self._admission.get(admitted.number)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def prompt_tokens(self, body: dict[str, Any]) -> int:
        """The prompt's length; a long text is tokenised on a thread, so it never stalls the
        event loop (and every stream on it)."""
        text = prompt_text(body)
        if len(text) <= INLINE_TOKENIZE_CHARS or self.count_tokens is estimate_tokens:
            return self.count_tokens(text)
        return await asyncio.to_thread(self.count_tokens, text)

    def exposure_error(self, host: str) -> str | None:
        """Why serving on ``host`` (and the admin listener) would be open to anyone, or None."""
        if not self.tenant_keys.enabled and not self.config.allow_anonymous and not _loopback(host):
            return (f"refusing to listen on {host} without tenant keys (--api-keys-file or $AUTELLIX_API_KEYS); "
                    "--allow-anonymous serves without them")
        if self.config.admin_port is not None and not self.admin_keys.enabled and not _loopback(
                self.config.admin_host):
            return (f"refusing an admin listener on {self.config.admin_host} without admin keys "
                    "(--admin-keys-file or $AUTELLIX_ADMIN_KEYS)")
        return None

    def _program_ratios(self) -> list[tuple[float, float]]:
        return [(e.waiting, e.service) for e in self.store.programs()]

    def _breakers(self) -> dict[str, tuple[str, int]]:
        now = time.monotonic()
        return {engine_label(u): (e.breaker.state(now).value, e.breaker.opened_total)
                for u, e in self.pool.engines.items()} if self.pool else {}

    def _inflight(self) -> dict[str, int]:
        """In-flight calls per engine, labelled without the engine's address (``/metrics`` is on
        the tenants' port); ``GET /admin/engines`` maps each label to its URL."""
        return {engine_label(u): e.inflight for u, e in self.pool.engines.items()} if self.pool else {}

    # ---- one call: the controller runs it, this sends each attempt --------------
    async def proxy(self, request: web.Request, path: str, body: dict[str, Any], received: float,
                    identity: str | None) -> web.StreamResponse:
        assert self.pool is not None and self.controller is not None
        model = body["model"]
        if not self.pool.available():
            raise unavailable("No healthy engine is available.")
        if not self.pool.serves(model):
            names = ", ".join(sorted(m["id"] for m in self.pool.models()))
            raise not_found(f"The model {model!r} does not exist. Served models: {names}.", code="model_not_found")
        ticket = await self.admit(identity)  # a 429 here changes nothing
        held_since, used = time.monotonic(), _Usage()
        try:
            owner = await self.sessions.resolve(request.headers, identity, received)  # last check, first change
            spec = CallSpec(path=path, body=body, model=model, owner=owner, stream=bool(body.get("stream")),
                            prompt_tokens=await self.prompt_tokens(body), received=received)
            used.prompt = spec.prompt_tokens
            wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self.controller.call(spec, functools.partial(self._send, request, wants_usage, used))
        finally:
            self.release(identity, ticket, tokens_used=used.tokens(), held_since=held_since)

    async def _send(self, request: web.Request, wants_usage: bool, used: _Usage,
                    attempt: Attempt) -> web.StreamResponse:
        """One attempt at one engine: raises ``EngineFailure`` while the call may still move."""
        assert self.http is not None
        config = self.config
        header_timeout = config.stream_header_timeout if attempt.stream else None
        timeouts = aiohttp.ClientTimeout(total=config.attempt_timeout, sock_connect=config.connect_timeout,
                                         sock_read=config.idle_read_timeout if attempt.stream else config.whole_timeout)
        upstream = await open_upstream(self.http, attempt.engine + attempt.path, attempt.body, JSON_HEADERS,
                                       header_timeout=header_timeout, timeout=timeouts)
        if attempt.stream and upstream.status == 200:
            response, outcome = await relay_stream(request, upstream, self.backend, client_wants_usage=wants_usage,
                                                   on_done=attempt.settle, write_timeout=config.write_timeout)
        else:
            response, outcome = await relay_whole(upstream, self.backend)
        used.outcome = outcome
        assert self.pool is not None
        if self.pool.record_answer(attempt.engine, upstream.status):  # 5xx count against the engine's breaker
            log.warning("engine %s: circuit breaker opened", attempt.engine)
        await attempt.settle(outcome)
        return response


class _Usage:
    """The tokens one call used, for its tenant's tokens-per-minute: the engine's count when
    it answered, else the prompt the gateway counted (a call that failed or was left still
    had its prompt prefilled)."""

    def __init__(self) -> None:
        self.prompt = 0
        self.outcome: Any = None

    def tokens(self) -> int:
        if self.outcome is not None and (self.outcome.prompt_tokens or self.outcome.completion_tokens):
            return int(self.outcome.prompt_tokens + self.outcome.completion_tokens)
        return self.prompt


def engine_label(url: str) -> str:
    """An engine's name in metrics: stable, and no address a tenant could call directly."""
    return "engine-" + hashlib.sha256(url.encode()).hexdigest()[:8]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _read_json(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise APIError(413, f"Request body is larger than {request.app[CONFIG_KEY].max_body_bytes} bytes.",
                       code="request_too_large") from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"Invalid JSON body: {exc}.", code="invalid_json") from None


# ---- HTTP layer -------------------------------------------------------------------
GATEWAY_KEY = web.AppKey("gateway", Gateway)
CONFIG_KEY = web.AppKey("config", GatewayConfig)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    resource = request.match_info.route.resource
    route = resource.canonical if resource else "unmatched"
    try:
        response = await handler(request)
    except APIError as exc:
        response = error_response(exc)
        gateway.metrics.errors.labels(route, exc.code or exc.type).inc()
    except web.HTTPException as exc:  # aiohttp's own 404/405/413: same error shape
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status, "http_error")
        response = error_response(APIError(exc.status, exc.reason, code=code))
        gateway.metrics.errors.labels(route, code).inc()
    except Exception:
        log.exception("unhandled error on %s", request.path)
        response = error_response(APIError(500, "Internal gateway error.", type="server_error",
                                           code="internal_error"))
        gateway.metrics.errors.labels(route, "internal_error").inc()
    gateway.metrics.request_counted(route, response.status)
    return response


def _proxy_handler(route: str, path: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        received = time.monotonic()
        gateway = request.app[GATEWAY_KEY]
        identity = gateway.identify(request.headers.get("Authorization"))
        body = check_body(await _read_json(request), route, max_n=gateway.config.max_n,
                          max_tokens=gateway.config.max_tokens)
        return await gateway.proxy(request, path, body, received, identity)
    return handler


async def models(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    gateway.identify(request.headers.get("Authorization"))
    assert gateway.pool is not None
    return web.json_response({"object": "list", "data": gateway.pool.models()}, dumps=_dumps)


def _session_view(gateway: Gateway, entry: Any) -> dict[str, Any]:
    return session_view(entry, gateway.store.pins(entry.program_id), engine_addresses=False)


#: The process table's times: on the monotonic clock (a gateway restart starts it anew).
_TIMES = ("created_at", "last_arrival", "last_finish")


def session_view(entry: Any, pins: dict[str, str], *, engine_addresses: bool) -> dict[str, Any]:
    """A session as clients see it: times as Unix timestamps (seconds), like OpenAI's ``created``.
    Engines by address only with ``engine_addresses`` (the admin listener); a tenant sees each
    engine's ``engine_label``, as ``/metrics`` names it: no address to call engines directly."""
    name: Callable[[str], str] = (lambda url: url) if engine_addresses else engine_label
    view = {**entry.to_dict(), "object": SESSION_OBJECT, "pins": {model: name(url) for model, url in pins.items()}}
    view["engines"] = sorted(name(url) for url in view["engines"])
    if view["pinned_engine"] is not None:
        view["pinned_engine"] = name(view["pinned_engine"])
    offset = time.time() - time.monotonic()
    for field_name in _TIMES:
        if view.get(field_name) is not None:
            view[field_name] = round(view[field_name] + offset, 3)
    for call in view.get("active", ()):
        call["arrival"] = round(call["arrival"] + offset, 3)
        if call["engine"] is not None:
            call["engine"] = name(call["engine"])
    return view


async def open_session(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    identity = gateway.identify(request.headers.get("Authorization"))
    now = time.monotonic()
    gateway.limiter.check_session(identity, now)  # a 429 here opens nothing
    entry = await gateway.sessions.open(now, identity)
    gateway.limiter.session_opened(identity, entry.program_id, now)
    return web.json_response({"id": entry.program_id, "object": SESSION_OBJECT}, status=201, dumps=_dumps)


async def get_session(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    identity = gateway.identify(request.headers.get("Authorization"))
    entry = await gateway.sessions.get(request.match_info["session_id"], identity)
    return web.json_response(_session_view(gateway, entry), dumps=_dumps)


async def end_session(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    identity = gateway.identify(request.headers.get("Authorization"))
    session_id = request.match_info["session_id"]
    entry = await gateway.sessions.get(session_id, identity)
    view = _session_view(gateway, entry)
    await gateway.sessions.end(session_id, identity)
    gateway.limiter.session_closed(identity, session_id, time.monotonic())
    if entry.completion_tokens:
        elapsed = time.monotonic() - entry.created_at
        gateway.metrics.token_latency.observe(elapsed / entry.completion_tokens)
    return web.json_response({**view, "deleted": True}, dumps=_dumps)


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    """How many engines are healthy, never which: engine addresses are for the admin listener."""
    gateway = request.app[GATEWAY_KEY]
    healthy = len(gateway.pool.loads()) if gateway.pool else 0
    lifecycle = request.app.get(LIFECYCLE_KEY)  # stopping, or the store unreachable: not ready either
    if lifecycle is not None and (reason := lifecycle.not_ready()) is not None:
        return web.json_response({"ready": False, "engines": healthy, "reason": reason}, status=503)
    return web.json_response({"ready": bool(healthy), "engines": healthy}, status=200 if healthy else 503)


async def openapi(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    served = [m["id"] for m in gateway.pool.models()] if gateway.pool else []
    return web.json_response(tenant_document(served), dumps=_dumps)


async def metrics(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    return web.Response(body=generate_latest(gateway.metrics.registry),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def create_app(config: GatewayConfig, *, store: ProgramStore | None = None) -> web.Application:
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[error_middleware])
    gateway = Gateway(config, store=store)
    app[GATEWAY_KEY] = gateway
    app[CONFIG_KEY] = config
    app.on_startup.append(gateway.start)
    app.on_cleanup.append(gateway.stop)
    app.router.add_post(CHAT_COMPLETIONS_PATH, _proxy_handler("chat", CHAT_COMPLETIONS_PATH))
    app.router.add_post(COMPLETIONS_PATH, _proxy_handler("completion", COMPLETIONS_PATH))
    app.router.add_get(MODELS_PATH, models)
    app.router.add_post(SESSIONS_PATH, open_session)
    app.router.add_get(SESSION_ROUTE, get_session)
    app.router.add_delete(SESSION_ROUTE, end_session)
    app.router.add_get(HEALTH_PATH, health)
    app.router.add_get(READY_PATH, ready)
    app.router.add_get(METRICS_PATH, metrics)
    app.router.add_get(OPENAPI_PATH, openapi)
    # No admin route here: they are on the admin listener (``admin.py``), with their own keys.
    return app
