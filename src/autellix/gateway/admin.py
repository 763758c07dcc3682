"""The admin plane: its own aiohttp app, served on its own listener with its own keys.

Nothing here is reachable on the tenants' port. Routes (``autellix.protocol``):

* ``GET /admin/engines``: the engine pool (URLs, health, load, draining, breaker);
* ``POST /admin/engines/drain`` and ``/undrain`` ``{"url": ...}``;
* ``GET /admin/calls?limit=N``: the last calls and their attempts;
* ``POST /admin/sessions {"tenant": NAME|null}``: a session owned by that
  tenant (the operator opens an AgentProgram's session for the key its Job
  calls with, holding no tenant key itself); ``GET``/``DELETE
  /admin/sessions/{id}``: any tenant's session;

Every route needs an admin key (``Authorization: Bearer``), unless no admin
key is configured and the listener is bound to loopback only (``autellix
up``); the gateway refuses to start an admin listener beyond loopback without
keys.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from autellix.control.keys import TENANT_NAME, KeyRing
from autellix.gateway.errors import APIError, bad_request, error_response
from autellix.gateway.openapi import OPENAPI_PATH, admin_document
from autellix.protocol import (
    ADMIN_CALLS_PATH,
    ADMIN_DRAIN_PATH,
    ADMIN_ENGINES_PATH,
    ADMIN_SESSION_ROUTE,
    ADMIN_SESSIONS_PATH,
    ADMIN_UNDRAIN_PATH,
    SESSION_OBJECT,
)

if TYPE_CHECKING:
    from autellix.gateway.app import Gateway

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ADMIN_GATEWAY = web.AppKey("admin_gateway", object)
ADMIN_KEYS = web.AppKey("admin_keys", object)


def _gateway(request: web.Request) -> Gateway:
    return request.app[ADMIN_GATEWAY]  # type: ignore[return-value]


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


@web.middleware
async def admin_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Admin key first, then the route; every error in OpenAI's shape."""
    keys: KeyRing | None = request.app[ADMIN_KEYS]  # type: ignore[assignment]
    try:
        if keys is not None and keys.identify(request.headers.get("Authorization")) is None:
            raise APIError(401, "Invalid or missing admin key (Authorization: Bearer ...).",
                           type="authentication_error", code="invalid_admin_key")
        return await handler(request)
    except APIError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status, "http_error")
        return error_response(APIError(exc.status, exc.reason, code=code))


async def _read_json(request: web.Request) -> Any:
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"Invalid JSON body: {exc}.", code="invalid_json") from None


async def list_engines(request: web.Request) -> web.Response:
    from autellix.gateway.app import engine_label

    gateway = _gateway(request)
    assert gateway.pool is not None
    engines = [{**e, "label": engine_label(e["url"])} for e in gateway.pool.describe()]
    return web.json_response({"object": "list", "data": engines}, dumps=_dumps)


async def list_calls(request: web.Request) -> web.Response:
    gateway = _gateway(request)
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
        gateway = _gateway(request)
        assert gateway.pool is not None
        url = _engine_url(await _read_json(request), set(gateway.pool.engines))  # every check before the change
        if gateway.shared_drains is not None:  # shared first: a drain no other replica sees is refused
            await gateway.shared_drains.set(url, draining)
        gateway.pool.set_draining(url, draining)
        return web.json_response(next(e for e in gateway.pool.describe() if e["url"] == url), dumps=_dumps)
    return handler


def _tenant(body: Any) -> str | None:
    if not isinstance(body, dict) or set(body) - {"tenant"}:
        raise bad_request('The body must be {"tenant": "<tenant name>"} (null: no tenant).', param="tenant")
    tenant = body.get("tenant")
    if tenant is not None and (not isinstance(tenant, str) or not TENANT_NAME.match(tenant)):
        raise bad_request(f"'tenant' must match {TENANT_NAME.pattern} or be null.", param="tenant")
    return tenant


async def open_session(request: web.Request) -> web.Response:
    """A session owned by the tenant named in the body (the key its Job calls with)."""
    gateway = _gateway(request)
    tenant = _tenant(await _read_json(request) if request.can_read_body else {})
    now = time.monotonic()
    gateway.limiter.check_session(tenant, now)  # the tenant's session bound holds for the operator too
    entry = await gateway.sessions.open(now, tenant)
    gateway.limiter.session_opened(tenant, entry.program_id, now)
    return web.json_response({"id": entry.program_id, "object": SESSION_OBJECT, "tenant": tenant}, status=201,
                             dumps=_dumps)


async def _owned(gateway: Gateway, session_id: str) -> Any:
    from autellix.control.sessions import session_not_found

    entry = await gateway.store.load(session_id)
    if entry is None:
        raise session_not_found(session_id, await gateway.store.ended(session_id))
    return entry


async def get_session(request: web.Request) -> web.Response:
    from autellix.gateway.app import session_view

    gateway = _gateway(request)
    entry = await _owned(gateway, request.match_info["session_id"])
    view = session_view(entry, gateway.store.pins(entry.program_id), engine_addresses=True)
    return web.json_response({**view, "tenant": entry.owner}, dumps=_dumps)


async def end_session(request: web.Request) -> web.Response:
    from autellix.gateway.app import session_view

    gateway = _gateway(request)
    session_id = request.match_info["session_id"]
    entry = await _owned(gateway, session_id)
    view = {**session_view(entry, gateway.store.pins(entry.program_id), engine_addresses=True),
            "tenant": entry.owner}
    await gateway.sessions.end(session_id, entry.owner)
    gateway.limiter.session_closed(entry.owner, session_id, time.monotonic())
    return web.json_response({**view, "deleted": True}, dumps=_dumps)


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(admin_document(), dumps=_dumps)


def create_admin_app(gateway: Gateway, keys: KeyRing | None) -> web.Application:
    """The admin plane of ``gateway``; ``keys`` None: no key asked (loopback only)."""
    app = web.Application(client_max_size=64 * 1024, middlewares=[admin_middleware])
    app[ADMIN_GATEWAY] = gateway
    app[ADMIN_KEYS] = keys
    app.router.add_get(ADMIN_ENGINES_PATH, list_engines)
    app.router.add_post(ADMIN_DRAIN_PATH, _drain_handler(True))
    app.router.add_post(ADMIN_UNDRAIN_PATH, _drain_handler(False))
    app.router.add_get(ADMIN_CALLS_PATH, list_calls)
    app.router.add_post(ADMIN_SESSIONS_PATH, open_session)
    app.router.add_get(ADMIN_SESSION_ROUTE, get_session)
    app.router.add_delete(ADMIN_SESSION_ROUTE, end_session)
    app.router.add_get(OPENAPI_PATH, openapi)
    return app


__all__ = ["create_admin_app"]
