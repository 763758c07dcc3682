"""The upstream leg against a server that drops a kept-alive connection unread.

An engine (uvicorn) closes idle keep-alive connections after 5 s; a call the
gateway sends on one just as it closes is dropped before the engine reads it.
The server here does that on purpose: it drops a request unread after
answering a set number on the same connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest
import pytest_asyncio

from autellix.gateway.engine_calls import EngineCalls, Timeouts
from autellix.gateway.upstream import EngineUnreachable, open_upstream

ANSWER = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'


async def _read_request(reader: asyncio.StreamReader) -> bool:
    """Read one request (headers and its Content-Length body); False at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return False
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    await reader.readexactly(length)
    return True


class DroppingServer:
    """Answers ``per_connection`` requests on each connection and drops the
    next one unread; ``answers`` bounds the answers in all (then every request
    is dropped, on new connections too)."""

    def __init__(self, per_connection: int, answers: int = 1_000) -> None:
        self.per_connection, self.answers = per_connection, answers
        self.connections = 0
        self.answered = 0
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        while await _read_request(reader):
            if served == self.per_connection or self.answered == self.answers:
                break  # read, never answered: as if the engine's idle close had raced it
            writer.write(ANSWER)
            await writer.drain()
            served += 1
            self.answered += 1
        writer.close()


@pytest_asyncio.fixture
async def server_factory() -> AsyncIterator:
    servers: list[asyncio.Server] = []

    async def start(per_connection: int, answers: int = 1_000) -> DroppingServer:
        dropping = DroppingServer(per_connection, answers)
        server = await asyncio.start_server(dropping.handle, "127.0.0.1", 0)
        servers.append(server)
        dropping.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
        return dropping

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def call(calls: EngineCalls, url: str) -> int:
    response = await open_upstream(calls, url, {"prompt": "x"}, {}, Timeouts(head=5), stream=False)
    assert orjson.loads(await response.read()) == {"ok": True}
    response.release()
    return response.status


@pytest.mark.asyncio
async def test_a_call_dropped_on_a_kept_alive_connection_is_sent_again(server_factory) -> None:
    server = await server_factory(per_connection=1)
    calls = EngineCalls()
    assert [await call(calls, server.url) for _ in range(3)] == [200] * 3
    await calls.close()
    # calls 2 and 3 went out on the kept-alive connection, were dropped, and went again on a new one
    assert (server.answered, server.connections) == (3, 3)


@pytest.mark.asyncio
async def test_a_call_dropped_on_a_new_connection_moves_on_at_once(server_factory) -> None:
    server = await server_factory(per_connection=0)
    calls = EngineCalls()
    with pytest.raises(EngineUnreachable) as failure:
        await call(calls, server.url)
    await calls.close()
    # retryable: the request controller moves the call to another engine; no second try here,
    # as a new connection cannot have been closed for idling
    assert (failure.value.reason, failure.value.retryable) == ("disconnected", True)
    assert (server.connections, server.answered) == (1, 0)


@pytest.mark.asyncio
async def test_a_call_is_sent_again_once_at_most(server_factory) -> None:
    server = await server_factory(per_connection=1, answers=1)  # answers once, then drops everything
    calls = EngineCalls()
    assert await call(calls, server.url) == 200
    with pytest.raises(EngineUnreachable) as failure:
        await call(calls, server.url)
    await calls.close()
    assert failure.value.reason == "disconnected"
    assert server.connections == 2  # the kept-alive one, then one new one
