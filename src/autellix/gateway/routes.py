"""The tenants' listener: its middleware, who a caller is, and the routes besides the call APIs.

HTTP only: each handler reads the request, asks the gateway's parts (sessions,
the engine pool, the call path) and writes the answer. The call APIs are their
own front doors (``openai_api``, ``responses_api``, ``messages_api``), added
here by ``create_tenant_app``. Every error is answered in the shape of the API
its route speaks: Anthropic's under ``/v1/messages``, OpenAI's elsewhere.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from autellix.gateway import messages_api, openai_api, responses_api
from autellix.gateway.bodies import json_answer, read_json
from autellix.gateway.errors import (
    ErrorShape,
    anthropic_shape,
    error_response,
    from_http_exception,
    openai_shape,
)
from autellix.gateway.lifecycle import LIFECYCLE_KEY
from autellix.gateway.openapi import OPENAPI_PATH, tenant_document
from autellix.gateway.parts import GATEWAY_KEY, Gateway, caller
from autellix.gateway.validation import session_fields
from autellix.gateway.views import session_view
from autellix.protocol import (
    HEALTH_PATH,
    MESSAGES_PATH,
    METRICS_PATH,
    MODELS_PATH,
    READY_PATH,
    SESSION_OBJECT,
    SESSION_ROUTE,
    SESSIONS_PATH,
    APIError,
)

log = logging.getLogger("autellix.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def shape_of(path: str) -> ErrorShape:
    """The error shape of the API a path belongs to."""
    return anthropic_shape if path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/") else openai_shape


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    resource = request.match_info.route.resource
    route = resource.canonical if resource else "unmatched"
    try:
        response = await handler(request)
    except APIError as exc:
        response = error_response(exc, shape_of(request.path))
        gateway.metrics.errors.labels(route, exc.code or exc.type).inc()
    except web.HTTPException as exc:  # aiohttp's own 404/405/413: the same error shapes
        api = from_http_exception(exc)
        response = error_response(api, shape_of(request.path))
        gateway.metrics.errors.labels(route, api.code or api.type).inc()
    except Exception:
        log.exception("unhandled error on %s", request.path)
        response = error_response(APIError(500, "Internal gateway error.", type="server_error",
                                           code="internal_error"), shape_of(request.path))
        gateway.metrics.errors.labels(route, "internal_error").inc()
    gateway.metrics.request_counted(route, response.status)
    return response


async def models(request: web.Request) -> web.Response:
    gateway, _ = caller(request)
    return json_answer({"object": "list", "data": gateway.pool.models()})


def _tenant_view(gateway: Gateway, program_id: str) -> dict[str, object]:
    entry = gateway.store.programs.entry(program_id)
    return session_view(entry, gateway.store.programs.pins(program_id), engine_addresses=False)


async def open_session(request: web.Request) -> web.Response:
    """``POST /v1/sessions``, with an optional ``{"parent": ID}`` (a subagent of the caller's session ID),
    ``{"priority": N}`` (its class for admission under overload) and ``{"expected_tokens": N}`` (its size)."""
    gateway, tenant = caller(request)
    entry = await gateway.open_session(tenant, session_fields(await read_json(request) if request.can_read_body
                                                              else {}))
    return json_answer({"id": entry.program_id, "object": SESSION_OBJECT, "parent": entry.parent}, status=201)


async def get_session(request: web.Request) -> web.Response:
    gateway, tenant = caller(request)
    entry = await gateway.sessions.get(request.match_info["session_id"], tenant)
    return json_answer(_tenant_view(gateway, entry.program_id))


async def end_session(request: web.Request) -> web.Response:
    gateway, tenant = caller(request)
    session_id = request.match_info["session_id"]
    entry = await gateway.sessions.get(session_id, tenant)
    view = _tenant_view(gateway, entry.program_id)
    await gateway.end_session(session_id, tenant)
    if entry.completion_tokens:
        elapsed = time.monotonic() - entry.created_at
        gateway.metrics.token_latency.observe(elapsed / entry.completion_tokens)
    return json_answer({**view, "deleted": True})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    """How many engines are healthy, never which: engine addresses are for the admin listener."""
    gateway = request.app[GATEWAY_KEY]
    healthy = len(gateway.pool.loads())
    lifecycle = request.app.get(LIFECYCLE_KEY)  # stopping: not ready either
    if lifecycle is not None and (reason := lifecycle.not_ready()) is not None:
        return web.json_response({"ready": False, "engines": healthy, "reason": reason}, status=503)
    return web.json_response({"ready": bool(healthy), "engines": healthy}, status=200 if healthy else 503)


async def openapi(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    return json_answer(tenant_document([m["id"] for m in gateway.pool.models()]))


async def metrics(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    return web.Response(body=generate_latest(gateway.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_tenant_app(gateway: Gateway) -> web.Application:
    """The tenants' app over ``gateway``'s parts; its life is the gateway's (started and stopped with it)."""
    app = web.Application(client_max_size=gateway.config.max_body_bytes, middlewares=[error_middleware])
    app[GATEWAY_KEY] = gateway

    async def start(_app: web.Application) -> None:
        await gateway.start()

    async def stop(_app: web.Application) -> None:
        await gateway.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    openai_api.add_routes(app)
    responses_api.add_routes(app)
    messages_api.add_routes(app)
    # No admin route here: they are on the admin listener (``admin.py``), with their own keys.
    app.add_routes([web.get(MODELS_PATH, models), web.post(SESSIONS_PATH, open_session),
                    web.get(SESSION_ROUTE, get_session), web.delete(SESSION_ROUTE, end_session),
                    web.get(HEALTH_PATH, health), web.get(READY_PATH, ready), web.get(METRICS_PATH, metrics),
                    web.get(OPENAPI_PATH, openapi)])
    return app


__all__ = ["create_tenant_app", "error_middleware", "shape_of"]
