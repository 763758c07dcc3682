"""The admin plane: its own aiohttp app, served on its own listener with its own keys.

Nothing here is reachable on the tenants' port. Routes (``autellix.protocol``):

* ``GET /admin/engines``: the engine pool (URLs, health, load, draining, breaker);
* ``POST /admin/engines/drain`` and ``/undrain`` ``{"url": ...}``;
* ``GET /admin/calls?limit=N``: the last calls and their attempts;
* ``GET /admin/admission``: program admission (admitted and waiting programs, the limits now);
* ``GET /admin/tenants``: the tenants' shares of model time (``autellix.core.TenantShares``): weight,
  service, calls in flight, lead over the least-served active tenant, share of the last minute;
* ``POST /admin/sessions {"tenant": NAME|null, "parent": ID|null}``: a session
  owned by that tenant (the operator opens an AgentProgram's session for the
  key its Job calls with, holding no tenant key itself), a subagent of the
  tenant's session ``parent`` if one is named; ``GET``/``DELETE
  /admin/sessions/{id}``: any tenant's session;

Every route needs an admin key (``Authorization: Bearer``), unless no admin
key is configured and the listener is bound to loopback only (``autellix
up``); the gateway refuses to start an admin listener beyond loopback without
keys.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from autellix.control.keys import TENANT_NAME, KeyRing
from autellix.control.sessions import session_not_found
from autellix.core import ProgramEntry
from autellix.gateway.bodies import json_answer, read_json
from autellix.gateway.errors import APIError, GatewayRunner, bad_request, error_response, from_http_exception
from autellix.gateway.openapi import OPENAPI_PATH, admin_document
from autellix.gateway.parts import Gateway
from autellix.gateway.validation import SessionFields, session_fields
from autellix.gateway.views import engine_label, session_view
from autellix.protocol import (
    ADMIN_ADMISSION_PATH,
    ADMIN_CALLS_PATH,
    ADMIN_DRAIN_PATH,
    ADMIN_ENGINES_PATH,
    ADMIN_SESSION_ROUTE,
    ADMIN_SESSIONS_PATH,
    ADMIN_TENANTS_PATH,
    ADMIN_UNDRAIN_PATH,
    EXPECTED_TOKENS_FIELD,
    SESSION_OBJECT,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ADMIN_GATEWAY: web.AppKey[Gateway] = web.AppKey("admin_gateway", Gateway)
ADMIN_KEYS: web.AppKey[KeyRing | None] = web.AppKey("admin_keys", object)  # type: ignore[arg-type]
#: Largest admin request body.
ADMIN_MAX_BODY = 64 * 1024


@web.middleware
async def admin_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Admin key first, then the route; every error in OpenAI's shape."""
    keys = request.app[ADMIN_KEYS]
    try:
        if keys is not None and keys.identify(request.headers.get("Authorization")) is None:
            raise APIError(401, "Invalid or missing admin key (Authorization: Bearer ...).",
                           type="authentication_error", code="invalid_admin_key")
        return await handler(request)
    except APIError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        return error_response(from_http_exception(exc))


async def list_engines(request: web.Request) -> web.Response:
    gateway = request.app[ADMIN_GATEWAY]
    engines = [{**e, "label": engine_label(str(e["url"]))} for e in gateway.pool.describe()]
    return json_answer({"object": "list", "data": engines})


async def list_calls(request: web.Request) -> web.Response:
    gateway = request.app[ADMIN_GATEWAY]
    raw = request.query.get("limit", "100")
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise bad_request("'limit' must be an integer from 1 to 1000.", param="limit")
    calls = list(gateway.controller.recent)[::-1][:int(raw)]
    return json_answer({"object": "list", "data": [c.to_dict() for c in calls]})


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
        gateway = request.app[ADMIN_GATEWAY]
        url = _engine_url(await read_json(request), set(gateway.pool.engines))  # every check before the change
        await gateway.store.drains.set(url, draining)  # shared first (store out of reach: written later)
        gateway.pool.set_draining(url, draining)
        return json_answer(next(e for e in gateway.pool.describe() if e["url"] == url))
    return handler


def _session_body(body: Any) -> tuple[str | None, SessionFields]:
    """``{"tenant": NAME|null, "parent": ID|null, "priority": N, "expected_tokens": N}``: the session's tenant
    and what ``POST /v1/sessions`` takes (each optional)."""
    if not isinstance(body, dict) or set(body) - {"tenant", "parent", "priority", EXPECTED_TOKENS_FIELD}:
        raise bad_request('The body must be {"tenant": "<tenant name>", "parent": "<session id>", "priority": '
                          '<integer>, "expected_tokens": <integer>} (each optional).', param="tenant")
    fields = session_fields(body, also=frozenset({"tenant"}))
    tenant = body.get("tenant")
    if tenant is not None and (not isinstance(tenant, str) or not TENANT_NAME.match(tenant)):
        raise bad_request(f"'tenant' must match {TENANT_NAME.pattern} or be null.", param="tenant")
    return tenant, fields


async def open_session(request: web.Request) -> web.Response:
    """A session owned by the tenant named in the body (the key its Job calls with), maybe a subagent."""
    gateway = request.app[ADMIN_GATEWAY]
    tenant, fields = _session_body(await read_json(request) if request.can_read_body else {})
    # the tenant's session bound holds for the operator too
    entry = await gateway.open_session(tenant, fields)
    return json_answer({"id": entry.program_id, "object": SESSION_OBJECT, "tenant": tenant, "parent": entry.parent},
                       status=201)


async def _any_session(gateway: Gateway, session_id: str) -> ProgramEntry:
    entry = await gateway.store.programs.load(session_id)
    if entry is None:
        raise session_not_found(session_id, await gateway.store.programs.ended(session_id))
    return entry


def _admin_view(gateway: Gateway, entry: ProgramEntry) -> dict[str, Any]:
    view = session_view(entry, gateway.store.programs.pins(entry.program_id), engine_addresses=True)
    return {**view, "tenant": entry.owner}


async def get_session(request: web.Request) -> web.Response:
    gateway = request.app[ADMIN_GATEWAY]
    entry = await _any_session(gateway, request.match_info["session_id"])
    return json_answer(_admin_view(gateway, entry))


async def end_session(request: web.Request) -> web.Response:
    gateway = request.app[ADMIN_GATEWAY]
    session_id = request.match_info["session_id"]
    entry = await _any_session(gateway, session_id)
    view = _admin_view(gateway, entry)
    await gateway.end_session(session_id, entry.owner)
    return json_answer({**view, "deleted": True})


async def admission(request: web.Request) -> web.Response:
    """Program admission: admitted and waiting programs, the limits now, the engines' loads it reads."""
    gate = request.app[ADMIN_GATEWAY].admission
    return json_answer({"enabled": gate is not None, **(gate.describe() if gate is not None else {})})


async def tenants(request: web.Request) -> web.Response:
    """The tenants' shares of model time, as this replica has served them."""
    shares = request.app[ADMIN_GATEWAY].store.programs.tenants
    return json_answer({"object": "list", "data": shares.describe(time.monotonic())})


async def openapi(request: web.Request) -> web.Response:
    return json_answer(admin_document())


def create_admin_app(gateway: Gateway, keys: KeyRing | None) -> web.Application:
    """The admin plane of ``gateway``; ``keys`` None: no key asked (loopback only)."""
    app = web.Application(client_max_size=ADMIN_MAX_BODY, middlewares=[admin_middleware])
    app[ADMIN_GATEWAY] = gateway
    app[ADMIN_KEYS] = keys
    app.add_routes([web.get(ADMIN_ENGINES_PATH, list_engines), web.post(ADMIN_DRAIN_PATH, _drain_handler(True)),
                    web.post(ADMIN_UNDRAIN_PATH, _drain_handler(False)), web.get(ADMIN_CALLS_PATH, list_calls),
                    web.post(ADMIN_SESSIONS_PATH, open_session), web.get(ADMIN_SESSION_ROUTE, get_session),
                    web.delete(ADMIN_SESSION_ROUTE, end_session), web.get(ADMIN_ADMISSION_PATH, admission),
                    web.get(ADMIN_TENANTS_PATH, tenants), web.get(OPENAPI_PATH, openapi)])
    return app


class AdminListener:
    """The admin plane on its own host and port (0: any free port; ``url`` says which once it serves)."""

    def __init__(self, gateway_of: Callable[[], Gateway], keys: KeyRing | None, host: str, port: int,
                 server_limits: dict[str, int]) -> None:
        self.gateway_of, self.keys, self.host, self.port = gateway_of, keys, host, port
        self.server_limits = server_limits
        self._url: str | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str | None:
        return self._url

    async def start(self) -> None:
        self._runner = GatewayRunner(create_admin_app(self.gateway_of(), self.keys), access_log=None,
                                     **self.server_limits)  # type: ignore[arg-type]
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._url = f"http://{self.host}:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


__all__ = ["AdminListener", "create_admin_app"]
