"""Anthropic's Messages API front door: messages (whole and streamed) as program calls, and their token count.

Errors are in Anthropic's shape (``{"type": "error", "error": {"type", "message"}}``,
``autellix.gateway.routes.shape_of``), and a tenant's key is accepted as
``x-api-key`` (Anthropic's clients) as well as ``Authorization: Bearer``. A
call's program is found as for every call API (``autellix.control.sessions``):
Claude Code's own session and subagent headers name it. ``count_tokens`` is no
model call: it goes to the least-loaded engine serving the model and changes
no program.
"""

from __future__ import annotations

import time

import aiohttp
from aiohttp import web

from autellix.core import NoEngine, least_used_engine
from autellix.gateway.bodies import read_json
from autellix.gateway.dialects import MESSAGES
from autellix.gateway.openai_api import call_handler
from autellix.gateway.parts import caller
from autellix.gateway.validation import check_count_tokens_body
from autellix.protocol import MESSAGES_COUNT_TOKENS_PATH, MESSAGES_PATH, APIError

#: Seconds an engine has to count a prompt's tokens.
COUNT_TIMEOUT_S = 30.0


async def count_tokens(request: web.Request) -> web.Response:
    gateway, _tenant = caller(request)
    body = check_count_tokens_body(await read_json(request))
    gateway.calls.check_model(body["model"])
    try:
        engine = least_used_engine(gateway.pool.candidates(body["model"]))
    except NoEngine:
        raise APIError(503, "No engine serving the model can take a request now; try again shortly.",
                       type="service_unavailable", code="no_engine_available") from None
    started = time.monotonic()
    try:
        async with gateway.calls.http.post(engine + MESSAGES_COUNT_TOKENS_PATH, json=body,
                                           timeout=aiohttp.ClientTimeout(total=COUNT_TIMEOUT_S)) as answer:
            raw, status, content_type = await answer.read(), answer.status, answer.content_type
    except (aiohttp.ClientError, TimeoutError) as exc:
        gateway.pool.failed(engine, hung=time.monotonic() - started >= COUNT_TIMEOUT_S)
        raise APIError(503, f"The engine did not count the tokens ({type(exc).__name__}); try again.",
                       type="service_unavailable", code="engine_failed") from None
    if status >= 400:
        raw = MESSAGES.engine_error(raw, status)
    return web.Response(status=status, body=raw, content_type=content_type)


def add_routes(app: web.Application) -> None:
    app.router.add_post(MESSAGES_PATH, call_handler(MESSAGES))
    app.router.add_post(MESSAGES_COUNT_TOKENS_PATH, count_tokens)


__all__ = ["add_routes", "count_tokens"]
