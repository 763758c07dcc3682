"""The gateway's own routes, answered by the picker itself: a program that opens its session
(``autellix.client``, ``autellix bench``) works behind a GIE gateway unchanged.

``POST /v1/sessions`` (``{"parent": ID}`` optional), ``GET`` and ``DELETE
/v1/sessions/{id}``, and ``GET /ready`` (how a client tells an Autellix gateway
from a bare engine) reach no engine: the picker answers them in Envoy's place
(an immediate response), with the aiohttp gateway's rules and answers (the
tenant's session limit, its own sessions only, engines by label).
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import unquote

import orjson

from autellix.epp.exchange import RequestHead
from autellix.gateway.errors import bad_request
from autellix.gateway.parts import Gateway
from autellix.gateway.validation import SessionFields, session_fields
from autellix.gateway.views import session_view
from autellix.protocol import READY_PATH, SESSION_OBJECT, SESSIONS_PATH, APIError

#: An answer: (status, JSON body).
Answer = tuple[int, dict[str, Any]]


def is_own_route(path: str) -> bool:
    return path in (SESSIONS_PATH, READY_PATH) or path.startswith(SESSIONS_PATH + "/")


def _session_fields(body: bytes | None) -> SessionFields:
    """``POST /v1/sessions``'s body (``autellix.gateway.validation.session_fields``), empty or JSON."""
    if not body or not body.strip():
        return SessionFields()
    try:
        return session_fields(orjson.loads(body))
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"Invalid JSON body: {exc}.", code="invalid_json") from None


async def answer(gateway: Gateway, head: RequestHead, body: bytes | None, tenant: str | None, *,
                 ready: bool) -> Answer:
    """The answer to a request to one of the gateway's own routes (``is_own_route``); ``APIError`` before any
    change. ``ready``: whether the picker takes calls (``GET /ready``)."""
    now = time.monotonic()
    if head.path == READY_PATH:
        engines = len(gateway.pool.loads())
        ready = ready and engines > 0
        return (200 if ready else 503), {"ready": ready, "engines": engines}
    if head.path == SESSIONS_PATH:
        if head.method != "POST":
            raise APIError(405, f"{head.method} is not allowed on {SESSIONS_PATH}.", code="method_not_allowed")
        entry = await gateway.open_session(tenant, _session_fields(body))
        return 201, {"id": entry.program_id, "object": SESSION_OBJECT, "parent": entry.parent}
    session_id = unquote(head.path[len(SESSIONS_PATH) + 1:])
    if not session_id or "/" in session_id:
        raise APIError(404, f"No route {head.path}.", code="not_found")
    if head.method not in ("GET", "DELETE"):
        raise APIError(405, f"{head.method} is not allowed on {head.path}.", code="method_not_allowed")
    entry = await gateway.sessions.get(session_id, tenant)
    view = session_view(gateway.store.programs.entry(entry.program_id), gateway.store.programs.pins(entry.program_id),
                        engine_addresses=False)
    if head.method == "GET":
        return 200, view
    await gateway.end_session(session_id, tenant)
    if entry.completion_tokens:
        gateway.metrics.token_latency.observe((now - entry.created_at) / entry.completion_tokens)
    return 200, {**view, "deleted": True}


__all__ = ["Answer", "answer", "is_own_route"]
