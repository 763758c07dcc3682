"""The gateway's HTTP layer: routes, validation and the life of one call.

Transport (aiohttp), request control (sessions, validation, retries) and policy
(the core's priorities and Algorithm 2) stay separate: handlers translate HTTP
to calls on ``Gateway`` and back, and ``Gateway`` asks the policy core.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from autellix.core import NoEngine, ProcessTable, SchedulerConfig, balancer_from_config, policy_by_name
from autellix.core.mlq import QueueSpec
from autellix.engine.planner import XARG_CALL, XARG_PROGRAM, XARG_SERVICE, XARG_THREAD, XARG_WAIT
from autellix.gateway.engines import Discovery, EnginePool, StaticDiscovery
from autellix.gateway.errors import APIError, bad_request, not_found, unavailable, upstream_failed
from autellix.gateway.metrics import GatewayMetrics
from autellix.gateway.sessions import Authenticator, CallOwner, Sessions, load_api_keys
from autellix.gateway.tokens import Counter, estimate_tokens, prompt_text, tokenizer_counter
from autellix.gateway.upstream import EngineHung, EngineUnreachable, Outcome, open_upstream, relay_stream, relay_whole

log = logging.getLogger("autellix.gateway")



@dataclass
class GatewayConfig:
    engines: list[str] = field(default_factory=list)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    #: Largest accepted request body.
    max_body_bytes: int = 4 * 1024 * 1024
    #: Send the program's queue level as vLLM's ``priority`` (engines need
    #: ``--scheduling-policy priority`` or the Autellix scheduler).
    engine_priority: bool = True
    poll_interval: float = 1.0
    api_keys_file: Path | None = None
    tokenizer: Path | None = None
    #: Attempts per call across engines when an engine cannot be reached.
    max_attempts: int = 3
    #: Seconds an engine has to answer a streamed call's headers (vLLM does so
    #: once the call is queued); after that the call moves to another engine.
    stream_header_timeout: float | None = 30.0
    discovery: Discovery | None = None


class Gateway:
    """Request control: the process table, the engine pool and the policy core."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        sched = config.scheduler
        self.policy = policy_by_name(sched.policy)
        self.table = ProcessTable(self.policy, idle_ttl=sched.program_idle_ttl)
        self.sessions = Sessions(self.table)
        self.queues = QueueSpec.from_config(sched)
        self.balancer = balancer_from_config(sched)
        self.auth = Authenticator(load_api_keys(config.api_keys_file))
        self.count_tokens: Counter = tokenizer_counter(config.tokenizer) if config.tokenizer else estimate_tokens
        self.metrics = GatewayMetrics(self._program_ratios, self._inflight)
        self.http: aiohttp.ClientSession | None = None
        self.pool: EnginePool | None = None
        self._janitor: asyncio.Task | None = None

    # ---- life cycle ----------------------------------------------------------
    async def start(self, _app: web.Application | None = None) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self.http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None,
                                          sock_connect=5), auto_decompress=False)
        discovery = self.config.discovery or StaticDiscovery(self.config.engines)
        self.pool = EnginePool(discovery, self.http, poll_interval=self.config.poll_interval,
                               on_removed=self.table.drop_engine)
        await self.pool.start()
        self._janitor = asyncio.create_task(self._expire_loop(), name="session-expiry")

    async def stop(self, _app: web.Application | None = None) -> None:
        if self._janitor:
            self._janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._janitor
        if self.pool:
            await self.pool.stop()
        if self.http:
            await self.http.close()

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(min(30.0, self.config.scheduler.program_idle_ttl / 4))
            for entry in self.sessions.expire(time.monotonic()):
                log.info("program %s expired after %.0fs idle", entry.program_id, self.table.idle_ttl)

    def _program_ratios(self) -> list[tuple[float, float]]:
        return [(e.waiting, e.service) for e in self.table]

    def _inflight(self) -> dict[str, int]:
        return {u: e.inflight for u, e in self.pool.engines.items()} if self.pool else {}

    # ---- one call ------------------------------------------------------------
    def scheduling_fields(self, program_id: str, thread_id: str | None, call_id: str) -> dict[str, Any]:
        """What the gateway adds to a request: vLLM priority and the plugin's xargs."""
        entry = self.table[program_id]
        priority = self.table.priority(program_id) if self.policy.places_by_priority else 0.0
        added: dict[str, Any] = {"vllm_xargs": {
            XARG_PROGRAM: program_id,
            XARG_CALL: call_id,
            XARG_SERVICE: round(entry.service, 6),
            XARG_WAIT: round(entry.waiting, 6),
        }}
        if thread_id is not None:
            added["vllm_xargs"][XARG_THREAD] = thread_id
        if self.config.engine_priority:
            # The queue level, not the raw service: discrete priorities (the paper's
            # point) and FCFS inside a level, which vLLM's (priority, arrival) gives.
            added["priority"] = self.queues.level_for(priority)
        return added

    async def call(self, request: web.Request, path: str, body: dict[str, Any], owner: CallOwner,
                   received: float) -> web.StreamResponse:
        assert self.pool is not None and self.http is not None
        call_id = uuid.uuid4().hex
        program_id = owner.program_id
        start = time.monotonic()
        self.table.call_arrived(program_id, call_id, start, thread_id=owner.thread_id)
        outcome: Outcome | None = None
        engine: str | None = None
        try:
            upstream_body = {**body, **self.scheduling_fields(program_id, owner.thread_id, call_id)}
            xargs = body.get("vllm_xargs")
            if isinstance(xargs, dict):  # the client's own xargs survive next to ours
                upstream_body["vllm_xargs"] = {**xargs, **upstream_body["vllm_xargs"]}
            stream = bool(body.get("stream"))
            wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            if stream:
                upstream_body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            prompt_tokens = self.count_tokens(prompt_text(body))
            headers = {"Content-Type": "application/json"}
            tried: set[str] = set()
            for _ in range(self.config.max_attempts):
                engine, upstream = await self._dispatch(program_id, call_id, path, upstream_body, headers,
                                                        prompt_tokens, received, tried)
                try:
                    if stream and upstream.status == 200:
                        settle = functools.partial(self._settle, program_id, call_id, start, engine=engine)
                        response, outcome = await relay_stream(request, upstream, client_wants_usage=wants_usage,
                                                               on_done=settle)
                    else:
                        response, outcome = await relay_whole(upstream)
                    return response
                except EngineUnreachable as exc:
                    # Nothing reached the client yet: the call moves to another engine.
                    log.warning("call %s: engine %s failed before answering (%s); retrying", call_id, engine, exc)
                    self.pool.mark_failed(engine)
                    self.metrics.retries.inc()
                    tried.add(engine)
                finally:
                    self.pool.end(engine)
            raise upstream_failed("Every engine tried failed before answering the call.")
        finally:
            await self._settle(program_id, call_id, start, outcome, engine)
            if owner.ephemeral:
                self.table.end(program_id)

    async def _dispatch(self, program_id: str, call_id: str, path: str, body: dict[str, Any],
                        headers: dict[str, str], prompt_tokens: int, received: float,
                        tried: set[str]) -> tuple[str, aiohttp.ClientResponse]:
        """Algorithm 2 picks an engine; an unreachable one is skipped (and re-pinned)."""
        assert self.pool is not None and self.http is not None
        for attempt in range(self.config.max_attempts):
            loads = self.pool.loads(exclude=tried)
            try:
                route = self.balancer.choose(loads, prompt_tokens=prompt_tokens,
                                             pinned=self.table[program_id].pinned_engine)
            except NoEngine:
                break
            self.table.pin(program_id, route.pin)
            self.table.call_routed(program_id, call_id, route.engine)
            if attempt == 0 and not tried:
                self.metrics.added_latency.observe(time.monotonic() - received)
            # Counted in flight from now, not from the engine's first byte: concurrent
            # calls must see each other's load when they are routed.
            self.pool.begin(route.engine)
            try:
                timeout = self.config.stream_header_timeout if body.get("stream") else None
                upstream = await open_upstream(self.http, route.engine + path, body, headers, header_timeout=timeout)
                self.pool.mark_answered(route.engine)
                return route.engine, upstream
            except EngineUnreachable as exc:
                self.pool.end(route.engine)
                log.warning("call %s: engine %s unreachable (%s); trying another", call_id, route.engine, exc)
                if isinstance(exc, EngineHung):
                    self.pool.mark_hung(route.engine)
                else:
                    self.pool.mark_failed(route.engine)
                self.metrics.retries.inc()
                tried.add(route.engine)
        raise unavailable("No engine could take the call; try again shortly.")

    async def _settle(self, program_id: str, call_id: str, start: float, outcome: Outcome | None,
                      engine: str | None) -> None:
        """Charge the call to its program, once: model time as service, the rest as
        waiting. A stream settles before its closing event; the call's ``finally``
        then finds it settled."""
        if program_id not in self.table or call_id not in self.table[program_id].active:
            return  # the session was ended while the call ran
        wall = time.monotonic() - start
        if outcome is None or outcome.status != 200 or outcome.broken:
            self.table.call_aborted(program_id, call_id, time.monotonic(), wait=wall)
            return
        # Model time, never queueing (docs/gateway.md): the Autellix scheduler's
        # own count (the steps the call ran in) when the engine runs it; else
        # vLLM's per-request timing (first schedule to last token, preemptions
        # included); else the generated tokens priced at the engine's seconds per token.
        record = await self.pool.call_record(engine, call_id) if (self.pool and engine) else None
        now = time.monotonic()
        if program_id not in self.table or call_id not in self.table[program_id].active:
            return
        if record is not None and isinstance(record.get("service_s"), int | float):
            model_time = min(wall, float(record["service_s"]))
            self.metrics.model_time_source.labels("scheduler").inc()
        elif outcome.engine_seconds is not None:
            model_time = min(wall, outcome.engine_seconds)
            self.metrics.model_time_source.labels("vllm_metrics").inc()
        else:
            price = self.pool.seconds_per_token(engine) if (self.pool and engine) else 0.0
            model_time = min(wall, outcome.completion_tokens * price)
            self.metrics.model_time_source.labels("token_price").inc()
        wait = wall - model_time
        self.metrics.call_wait.observe(wait)
        self.table.call_finished(program_id, call_id, now, model_time=model_time, wait=wait,
                                 prompt_tokens=outcome.prompt_tokens, completion_tokens=outcome.completion_tokens)


# ---- validation -----------------------------------------------------------------
def _check_body(body: Any, route: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string.", param="model")
    if route == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' is required and must be a non-empty array.", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise bad_request(f"messages[{i}] must be an object with a string 'role'.", param="messages")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list) or (isinstance(prompt, list) and not prompt):
            raise bad_request("'prompt' is required: a string or an array.", param="prompt")
    for name in ("stream",):
        if name in body and not isinstance(body[name], bool):
            raise bad_request(f"'{name}' must be a boolean.", param=name)
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise bad_request(f"'{name}' must be a positive integer.", param=name)
    if "stream_options" in body and body["stream_options"] is not None and not isinstance(body["stream_options"],
                                                                                            dict):
        raise bad_request("'stream_options' must be an object.", param="stream_options")
    return body


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
        response = exc.response()
        gateway.metrics.errors.labels(route, exc.code or exc.type).inc()
    except web.HTTPException as exc:  # aiohttp's own 404/405/413: same error shape
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status, "http_error")
        response = APIError(exc.status, exc.reason, code=code).response()
        gateway.metrics.errors.labels(route, code).inc()
    except Exception:
        log.exception("unhandled error on %s", request.path)
        response = APIError(500, "Internal gateway error.", type="server_error", code="internal_error").response()
        gateway.metrics.errors.labels(route, "internal_error").inc()
    gateway.metrics.requests.labels(route, str(response.status)).inc()
    return response


async def _proxy(request: web.Request, route: str, path: str) -> web.StreamResponse:
    received = time.monotonic()
    gateway = request.app[GATEWAY_KEY]
    identity = gateway.auth.identify(request.headers.get("Authorization"))
    body = _check_body(await _read_json(request), route)
    assert gateway.pool is not None
    if not gateway.pool.loads():
        raise unavailable("No healthy engine is available.")
    if not gateway.pool.serves(body["model"]):
        names = ", ".join(sorted(m.get("id", "") for m in gateway.pool.models()))
        raise not_found(f"The model {body['model']!r} does not exist. Served models: {names}.",
                        code="model_not_found")
    owner = gateway.sessions.resolve(request.headers, identity, received)  # last check, first state change
    return await gateway.call(request, path, body, owner, received)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _proxy(request, "chat", "/v1/chat/completions")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _proxy(request, "completion", "/v1/completions")


async def models(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    gateway.auth.identify(request.headers.get("Authorization"))
    assert gateway.pool is not None
    return web.json_response({"object": "list", "data": gateway.pool.models()}, dumps=_dumps)


async def open_session(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    identity = gateway.auth.identify(request.headers.get("Authorization"))
    entry = gateway.sessions.open(time.monotonic(), identity)
    return web.json_response({"id": entry.program_id, "object": "autellix.session"}, status=201, dumps=_dumps)


async def get_session(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    identity = gateway.auth.identify(request.headers.get("Authorization"))
    entry = gateway.sessions.get(request.match_info["session_id"], identity)
    return web.json_response(entry.to_dict(), dumps=_dumps)


async def end_session(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    identity = gateway.auth.identify(request.headers.get("Authorization"))
    entry = gateway.sessions.end(request.match_info["session_id"], identity)
    if entry.completion_tokens:
        elapsed = time.monotonic() - entry.created_at
        gateway.metrics.token_latency.observe(elapsed / entry.completion_tokens)
    return web.json_response({**entry.to_dict(), "deleted": True}, dumps=_dumps)


# ---- admin: the engine pool (the operator's autoscaler drains before it removes) --
async def list_engines(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    gateway.auth.identify(request.headers.get("Authorization"))
    assert gateway.pool is not None
    return web.json_response({"object": "list", "data": gateway.pool.describe()}, dumps=_dumps)


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


def create_app(config: GatewayConfig) -> web.Application:
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[error_middleware])
    gateway = Gateway(config)
    app[GATEWAY_KEY] = gateway
    app[CONFIG_KEY] = config
    app.on_startup.append(gateway.start)
    app.on_cleanup.append(gateway.stop)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/sessions", open_session)
    app.router.add_get("/v1/sessions/{session_id}", get_session)
    app.router.add_delete("/v1/sessions/{session_id}", end_session)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/engines", list_engines)
    app.router.add_post("/admin/engines/drain", _drain_handler(True))
    app.router.add_post("/admin/engines/undrain", _drain_handler(False))
    return app
