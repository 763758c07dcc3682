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
import logging
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
from autellix.control.sessions import Sessions
from autellix.core import SchedulerConfig, balancer_from_config, policy_by_name
from autellix.core.mlq import QueueSpec
from autellix.gateway.engines import Discovery, EnginePool, StaticDiscovery
from autellix.gateway.errors import APIError, bad_request, error_response, not_found, unavailable
from autellix.gateway.metrics import GatewayMetrics
from autellix.gateway.sessions import Authenticator, load_api_keys
from autellix.gateway.tokens import Counter, estimate_tokens, prompt_text, tokenizer_counter
from autellix.gateway.upstream import open_upstream, relay_stream, relay_whole
from autellix.gateway.validation import check_body
from autellix.protocol import (
    ADMIN_CALLS_PATH,
    ADMIN_DRAIN_PATH,
    ADMIN_ENGINES_PATH,
    ADMIN_UNDRAIN_PATH,
    CHAT_COMPLETIONS_PATH,
    COMPLETIONS_PATH,
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
    api_keys_file: Path | None = None
    tokenizer: Path | None = None
    #: Engines one call may try in all (its retry budget), when engines fail before answering.
    max_attempts: int = 3
    #: Full-jitter backoff between attempts: up to this many seconds, doubling per failed attempt.
    retry_backoff: float = 0.05
    #: Seconds an engine has to answer a streamed call's headers (vLLM does so
    #: once the call is queued); after that the call moves to another engine.
    stream_header_timeout: float | None = 30.0
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
        self.store: ProgramStore = store or MemoryProgramStore(self.policy, idle_ttl=sched.program_idle_ttl)
        self.sessions = Sessions(self.store)
        self.backend: EngineBackend = backend or backend_by_name(config.backend)
        self.queues = QueueSpec.from_config(sched)
        self.balancer = balancer_from_config(sched)
        self.auth = Authenticator(load_api_keys(config.api_keys_file))
        self.count_tokens: Counter = tokenizer_counter(config.tokenizer) if config.tokenizer else estimate_tokens
        self.metrics = GatewayMetrics(self._program_ratios, self._inflight)
        self.http: aiohttp.ClientSession | None = None
        self.pool: EnginePool | None = None
        self.controller: RequestController | None = None
        self._janitor: asyncio.Task | None = None

    # ---- life cycle ----------------------------------------------------------
    async def start(self, _app: web.Application | None = None) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self.http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None,
                                          sock_connect=5), auto_decompress=False)
        discovery = self.config.discovery or StaticDiscovery(self.config.engines)
        self.pool = EnginePool(discovery, self.http, poll_interval=self.config.poll_interval,
                               on_removed=self.store.drop_engine, backend=self.backend)
        self.controller = RequestController(
            store=self.store, engines=self.pool, backend=self.backend, balancer=self.balancer, queues=self.queues,
            policy=self.policy, send_priority=self.config.engine_priority,
            retry=RetryPolicy(max_attempts=self.config.max_attempts, backoff_base=self.config.retry_backoff),
            observer=_MetricsObserver(self.metrics))
        await self.pool.start()
        self._janitor = asyncio.create_task(self._expire_loop(), name="session-expiry")

    async def stop(self, _app: web.Application | None = None) -> None:
        if self._janitor:
            self._janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._janitor
        await self.store.flush()
        if self.pool:
            await self.pool.stop()
        if self.http:
            await self.http.close()

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(min(30.0, self.config.scheduler.program_idle_ttl / 4))
            for entry in await self.store.expire(time.monotonic()):
                log.info("program %s expired after %.0fs idle", entry.program_id, self.store.idle_ttl)

    def _program_ratios(self) -> list[tuple[float, float]]:
        return [(e.waiting, e.service) for e in self.store.programs()]

    def _inflight(self) -> dict[str, int]:
        return {u: e.inflight for u, e in self.pool.engines.items()} if self.pool else {}

    # ---- one call: the controller runs it, this sends each attempt --------------
    async def proxy(self, request: web.Request, path: str, body: dict[str, Any], received: float,
                    identity: str | None) -> web.StreamResponse:
        assert self.pool is not None and self.controller is not None
        model = body["model"]
        if not self.pool.loads():
            raise unavailable("No healthy engine is available.")
        if not self.pool.serves(model):
            names = ", ".join(sorted(m["id"] for m in self.pool.models()))
            raise not_found(f"The model {model!r} does not exist. Served models: {names}.", code="model_not_found")
        owner = await self.sessions.resolve(request.headers, identity, received)  # last check, first state change
        spec = CallSpec(path=path, body=body, model=model, owner=owner, stream=bool(body.get("stream")),
                        prompt_tokens=self.count_tokens(prompt_text(body)), received=received)
        wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return await self.controller.call(spec, functools.partial(self._send, request, wants_usage))

    async def _send(self, request: web.Request, wants_usage: bool, attempt: Attempt) -> web.StreamResponse:
        """One attempt at one engine: raises ``EngineFailure`` while the call may still move."""
        assert self.http is not None
        timeout = self.config.stream_header_timeout if attempt.stream else None
        upstream = await open_upstream(self.http, attempt.engine + attempt.path, attempt.body, JSON_HEADERS,
                                       header_timeout=timeout)
        if attempt.stream and upstream.status == 200:
            response, outcome = await relay_stream(request, upstream, self.backend, client_wants_usage=wants_usage,
                                                   on_done=attempt.settle)
        else:
            response, outcome = await relay_whole(upstream, self.backend)
        await attempt.settle(outcome)
        return response


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
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
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
    gateway.metrics.requests.labels(route, str(response.status)).inc()
    return response


def _proxy_handler(route: str, path: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        received = time.monotonic()
        gateway = request.app[GATEWAY_KEY]
        identity = gateway.auth.identify(request.headers.get("Authorization"))
        body = check_body(await _read_json(request), route)
        return await gateway.proxy(request, path, body, received, identity)
    return handler


async def models(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    gateway.auth.identify(request.headers.get("Authorization"))
    assert gateway.pool is not None
    return web.json_response({"object": "list", "data": gateway.pool.models()}, dumps=_dumps)


def _session_view(gateway: Gateway, entry: Any) -> dict[str, Any]:
    return {**entry.to_dict(), "object": SESSION_OBJECT, "pins": gateway.store.pins(entry.program_id)}


async def open_session(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    identity = gateway.auth.identify(request.headers.get("Authorization"))
    entry = await gateway.sessions.open(time.monotonic(), identity)
    return web.json_response({"id": entry.program_id, "object": SESSION_OBJECT}, status=201, dumps=_dumps)


async def get_session(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    identity = gateway.auth.identify(request.headers.get("Authorization"))
    entry = await gateway.sessions.get(request.match_info["session_id"], identity)
    return web.json_response(_session_view(gateway, entry), dumps=_dumps)


async def end_session(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    identity = gateway.auth.identify(request.headers.get("Authorization"))
    session_id = request.match_info["session_id"]
    entry = await gateway.sessions.get(session_id, identity)
    view = _session_view(gateway, entry)
    await gateway.sessions.end(session_id, identity)
    if entry.completion_tokens:
        elapsed = time.monotonic() - entry.created_at
        gateway.metrics.token_latency.observe(elapsed / entry.completion_tokens)
    return web.json_response({**view, "deleted": True}, dumps=_dumps)


# ---- admin: the engine pool (the operator's autoscaler drains before it removes) --
async def list_engines(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    gateway.auth.identify(request.headers.get("Authorization"))
    assert gateway.pool is not None
    return web.json_response({"object": "list", "data": gateway.pool.describe()}, dumps=_dumps)


async def list_calls(request: web.Request) -> web.Response:
    """Recent calls, newest first, each with its attempts (engine, reason, seconds)."""
    gateway = request.app[GATEWAY_KEY]
    gateway.auth.identify(request.headers.get("Authorization"))
    assert gateway.controller is not None
    raw = request.query.get("limit", "100")
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise bad_request("'limit' must be an integer from 1 to 1000.", param="limit")
    calls = list(gateway.controller.recent)[::-1][:int(raw)]
    return web.json_response({"object": "list", "data": [c.to_dict() for c in calls]}, dumps=_dumps)


def _engine_url(body: Any, known: set[str]) -> str:
    if not isinstance(body, dict) or set(body) != {"url"} or not isinstance(body["url"], str) or not body["url"]:
        raise bad_request('The body must be {"url": "<engine base URL>"}.', param="url")
    url = body["url"].rstrip("/")
    if url not in known:
        listed = ", ".join(sorted(known)) or "none"
        raise bad_request(f"No engine {url!r} in the pool. Engines: {listed}.", param="url", code="engine_not_found")
    return url


def _drain_handler(draining: bool) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        gateway = request.app[GATEWAY_KEY]
        gateway.auth.identify(request.headers.get("Authorization"))
        assert gateway.pool is not None
        url = _engine_url(await _read_json(request), set(gateway.pool.engines))  # every check before the change
        gateway.pool.set_draining(url, draining)
        return web.json_response(next(e for e in gateway.pool.describe() if e["url"] == url), dumps=_dumps)
    return handler


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    healthy = sorted(gateway.pool.loads()) if gateway.pool else []
    return web.json_response({"ready": bool(healthy), "engines": healthy}, status=200 if healthy else 503)


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
    app.router.add_get(ADMIN_ENGINES_PATH, list_engines)
    app.router.add_post(ADMIN_DRAIN_PATH, _drain_handler(True))
    app.router.add_post(ADMIN_UNDRAIN_PATH, _drain_handler(False))
    app.router.add_get(ADMIN_CALLS_PATH, list_calls)
    return app
