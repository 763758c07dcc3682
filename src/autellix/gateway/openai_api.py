"""OpenAI's Chat Completions and Completions front doors: the body checked, the call run on its program."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from autellix.control.sessions import CallOwner
from autellix.gateway.bodies import read_json
from autellix.gateway.dialects import CHAT, COMPLETION, Dialect
from autellix.gateway.parts import caller
from autellix.protocol import CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def call_handler(dialect: Dialect) -> Handler:
    """A call route whose program its headers name (``autellix.control.sessions``, rules 1-3 and 5)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        received = time.monotonic()
        gateway, tenant = caller(request)
        body = dialect.check(await read_json(request), max_n=gateway.config.max_n,
                             max_tokens=gateway.config.max_tokens)

        async def program_of() -> CallOwner:
            return await gateway.sessions.resolve(request.headers, tenant, received)

        return await gateway.calls.run(request, dialect, body, tenant=tenant, received=received,
                                       program_of=program_of)

    return handler


def add_routes(app: web.Application) -> None:
    app.router.add_post(CHAT_COMPLETIONS_PATH, call_handler(CHAT))
    app.router.add_post(COMPLETIONS_PATH, call_handler(COMPLETION))


__all__ = ["add_routes", "call_handler"]
