"""The upstream leg against a server that drops a kept-alive connection unread.

An engine (uvicorn) closes idle keep-alive connections after 5 s; a call the
gateway sends on one just as it closes is dropped before the engine reads it.
The server here (``tests.gateway.scripted_server``) does that on purpose: it
drops a request unread after answering a set number on the same connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson
import pytest
import pytest_asyncio

from autellix.gateway.engine_calls import EngineCalls, Timeouts
from autellix.gateway.upstream import EngineUnreachable, open_upstream
from tests.gateway.scripted_server import ScriptedServer

ANSWER = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'


class Dropping:
    """Answers ``per_connection`` requests on each connection and drops the next one unread;
    ``answers`` bounds the answers in all (then every request is dropped, on new connections too)."""

    def __init__(self, per_connection: int, answers: int = 1_000) -> None:
        self.per_connection, self.answers = per_connection, answers
        self.answered = 0
        self._served: dict[asyncio.StreamWriter, int] = {}

    async def answer(self, writer: asyncio.StreamWriter, _request: bytes) -> bool:
        served = self._served.get(writer, 0)
        if served == self.per_connection or self.answered == self.answers:
            return False  # read, never answered: as if the engine's idle close had raced it
        writer.write(ANSWER)
        await writer.drain()
        self._served[writer] = served + 1
        self.answered += 1
        return True


@pytest_asyncio.fixture
async def server_factory(serve) -> Callable[..., Awaitable[tuple[ScriptedServer, Dropping]]]:
    async def start(per_connection: int, answers: int = 1_000) -> tuple[ScriptedServer, Dropping]:
        dropping = Dropping(per_connection, answers)
        return await serve(dropping.answer), dropping

    return start


async def call(calls: EngineCalls, url: str) -> int:
    response = await open_upstream(calls, url, {"prompt": "x"}, {}, Timeouts(head=5), stream=False)
    assert orjson.loads(await response.read()) == {"ok": True}
    response.release()
    return response.status


@pytest.mark.asyncio
async def test_a_call_dropped_on_a_kept_alive_connection_is_sent_again(server_factory) -> None:
    server, dropping = await server_factory(per_connection=1)
    calls = EngineCalls()
    assert [await call(calls, server.url) for _ in range(3)] == [200] * 3
    await calls.close()
    # calls 2 and 3 went out on the kept-alive connection, were dropped, and went again on a new one
    assert (dropping.answered, server.connections) == (3, 3)


@pytest.mark.asyncio
async def test_a_call_dropped_on_a_new_connection_moves_on_at_once(server_factory) -> None:
    server, dropping = await server_factory(per_connection=0)
    calls = EngineCalls()
    with pytest.raises(EngineUnreachable) as failure:
        await call(calls, server.url)
    await calls.close()
    # retryable: the request controller moves the call to another engine; no second try here,
    # as a new connection cannot have been closed for idling
    assert (failure.value.reason, failure.value.retryable) == ("disconnected", True)
    assert (server.connections, dropping.answered) == (1, 0)


@pytest.mark.asyncio
async def test_a_call_is_sent_again_once_at_most(server_factory) -> None:
    server, _ = await server_factory(per_connection=1, answers=1)  # answers once, then drops everything
    calls = EngineCalls()
    assert await call(calls, server.url) == 200
    with pytest.raises(EngineUnreachable) as failure:
        await call(calls, server.url)
    await calls.close()
    assert failure.value.reason == "disconnected"
    assert server.connections == 2  # the kept-alive one, then one new one
