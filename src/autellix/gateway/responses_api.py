"""OpenAI's Responses API front door: create (whole and streamed), retrieve, cancel and delete; a chain is a program.

* ``POST /v1/responses``: the body checked; the gateway names the response
  (vLLM's ``request_id``, ``resp_`` and 32 hex digits), so it knows the id
  before the engine answers. A call that continues a response
  (``previous_response_id``) must run on the engine that stored it (vLLM keeps
  responses per engine) and belongs to its chain's program, unless a session
  header names another; the first response of a chain opens an implicit
  program named after it (``autellix.control.sessions``, rule 4). When the
  engine answers, before the answer reaches the client, the response's engine,
  program and tenant are recorded (``autellix.control.store.responses``;
  shared through Redis by replicas), so the next call of the chain finds them
  on any replica.
* A response the caller cannot see (another tenant's, never recorded, deleted,
  older than ``GatewayConfig.response_ttl``) is a 404 ``previous_response_not_found``
  (OpenAI's own answer); one whose engine left the pool, is unhealthy or
  draining is a 404 that says so: its stored state is on that engine alone.
* ``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel`` go to the
  response's engine; ``DELETE /v1/responses/{id}`` forgets it at the gateway
  (vLLM 0.32 has no delete: the engine's copy ages out of its bounded store),
  so later retrievals and chains get 404.
"""

from __future__ import annotations

import time
import uuid

import aiohttp
from aiohttp import web

from autellix.control import Attempt
from autellix.control.controller import NoAllowedEngine
from autellix.control.sessions import CallOwner
from autellix.control.store.responses import StoredResponse
from autellix.gateway.bodies import json_answer, read_json
from autellix.gateway.dialects import RESPONSES
from autellix.gateway.errors import openai_error_shape
from autellix.gateway.parts import Gateway, caller
from autellix.protocol import RESPONSE_CANCEL_ROUTE, RESPONSE_ROUTE, RESPONSES_PATH, APIError

#: Seconds the engine has to answer a retrieval or a cancel.
ENGINE_READ_TIMEOUT_S = 30.0


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def response_not_found(response_id: str, *, param: str | None = None) -> APIError:
    return APIError(404, f"Response with id {response_id!r} not found.", code="previous_response_not_found"
                    if param else "response_not_found", param=param)


async def stored(gateway: Gateway, response_id: str, tenant: str | None, *, param: str | None = None
                 ) -> StoredResponse:
    """The caller's stored response ``response_id`` (404 when it is not the caller's or not known)."""
    record = await gateway.store.responses.get(response_id, time.time())
    if record is None or record.owner != tenant:
        raise response_not_found(response_id, param=param)
    return record


async def create(request: web.Request) -> web.StreamResponse:
    received = time.monotonic()
    gateway, tenant = caller(request)
    body = RESPONSES.check(await read_json(request), max_n=gateway.config.max_n, max_tokens=gateway.config.max_tokens)
    previous_id = body.get("previous_response_id")
    previous = await stored(gateway, previous_id, tenant, param="previous_response_id") if previous_id else None
    response_id = new_response_id()
    body = {**body, "request_id": response_id}

    async def program_of() -> CallOwner:
        return await gateway.sessions.resolve_chain(request.headers, tenant, received, previous=previous,
                                                    response_id=response_id)

    async def record(attempt: Attempt[object]) -> None:
        if body.get("store") is not False:
            await gateway.store.responses.put(StoredResponse(response_id, attempt.engine, attempt.program_id, tenant,
                                                       body["model"], time.time()))

    try:
        return await gateway.calls.run(request, RESPONSES, body, tenant=tenant, received=received,
                                       program_of=program_of,
                                       allowed_engines=(previous.engine,) if previous else None, on_answer=record)
    except NoAllowedEngine:
        assert previous is not None
        raise APIError(404, f"Response {previous.response_id!r} was stored by an engine that is not available now "
                       "(it left the pool, is unhealthy or is draining), and only that engine holds it: the chain "
                       "cannot continue from it. Send the conversation again as 'input' to start a new chain.",
                       code="previous_response_not_found", param="previous_response_id") from None


async def _at_engine(gateway: Gateway, method: str, record: StoredResponse, suffix: str,
                     params: dict[str, str]) -> web.Response:
    """The engine's answer to ``method`` on the stored response (an error in OpenAI's shape)."""
    url = record.engine + f"{RESPONSES_PATH}/{record.response_id}{suffix}"
    if record.engine not in gateway.pool.engines:
        raise APIError(404, f"Response {record.response_id!r} was stored by an engine that has left the pool.",
                       code="response_not_found")
    try:
        async with gateway.calls.http.session.request(
                method, url, params=params, timeout=aiohttp.ClientTimeout(total=ENGINE_READ_TIMEOUT_S)) as answer:
            raw = await answer.read()
            status, content_type = answer.status, answer.content_type
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise APIError(404, f"Response {record.response_id!r} is on an engine that did not answer ({exc!r}).",
                       code="response_not_found") from None
    if status >= 400:
        raw = openai_error_shape(raw)
    return web.Response(status=status, body=raw, content_type=content_type)


async def retrieve(request: web.Request) -> web.Response:
    gateway, tenant = caller(request)
    record = await stored(gateway, request.match_info["response_id"], tenant)
    params = {k: v for k, v in request.query.items() if k in ("stream", "starting_after")}
    return await _at_engine(gateway, "GET", record, "", params)


async def cancel(request: web.Request) -> web.Response:
    gateway, tenant = caller(request)
    record = await stored(gateway, request.match_info["response_id"], tenant)
    return await _at_engine(gateway, "POST", record, "/cancel", {})


async def delete(request: web.Request) -> web.Response:
    gateway, tenant = caller(request)
    record = await stored(gateway, request.match_info["response_id"], tenant)
    await gateway.store.responses.forget(record.response_id)
    return json_answer({"id": record.response_id, "object": "response", "deleted": True})


def add_routes(app: web.Application) -> None:
    app.router.add_post(RESPONSES_PATH, create)
    app.router.add_get(RESPONSE_ROUTE, retrieve)
    app.router.add_delete(RESPONSE_ROUTE, delete)
    app.router.add_post(RESPONSE_CANCEL_ROUTE, cancel)


__all__ = ["add_routes", "new_response_id", "stored"]
