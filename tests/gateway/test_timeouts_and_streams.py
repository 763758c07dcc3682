"""Streams the relay used to break, and the attempt timeouts, against stand-in engines."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.gateway.standins import MODEL, add_probes, gateway_app
from tests.live import serve_on_loopback

BIG = "x" * (1024 * 1024)  # a 1 MiB SSE line (logprobs can do this)


class StreamEngine:
    """Streams one huge event then [DONE] (``big``), or one event then silence (``stall``)."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour, self.url = behaviour, ""

    async def call(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if not body.get("stream"):
            await asyncio.sleep(5 if self.behaviour == "stall" else 0)
            return web.json_response({"choices": []})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        event = {"id": "x", "choices": [{"index": 0, "delta": {"content": BIG if self.behaviour == "big" else "a"}}]}
        await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
        if self.behaviour == "stall":
            await asyncio.sleep(5)
        await response.write(b"data: [DONE]\n\n")
        return response

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[StreamEngine]:
        app = web.Application()
        add_probes(app)
        app.router.add_post("/v1/chat/completions", self.call)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)  # stalled handlers: do not wait
        self.url = await serve_on_loopback(runner)
        try:
            yield self
        finally:
            await runner.cleanup()


async def ready(gateway: Any) -> None:
    for _ in range(200):
        if gateway.pool is not None and gateway.pool.loads():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("no engine joined")


async def stream(base: str) -> list[bytes]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with aiohttp.ClientSession() as http, http.post(base + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        raw = await r.read()  # the whole chunked body: a broken one raises here
    return [line for line in raw.split(b"\n\n") if line]


@pytest.mark.asyncio
async def test_a_megabyte_sse_line_is_relayed_whole() -> None:
    async with StreamEngine("big").serving() as engine, gateway_app([engine.url], poll_interval=0.05) as (base, gw):
        await ready(gw)
        events = await stream(base)
        assert len(events) == 2 and events[-1] == b"data: [DONE]"
        assert orjson.loads(events[0][6:])["choices"][0]["delta"]["content"] == BIG


@pytest.mark.asyncio
async def test_a_stream_silent_past_the_idle_timeout_ends_with_an_error_event() -> None:
    async with StreamEngine("stall").serving() as engine, \
            gateway_app([engine.url], poll_interval=0.05, idle_read_timeout=0.3) as (base, gw):
        await ready(gw)
        started = time.monotonic()
        events = await stream(base)
        assert time.monotonic() - started < 5
        assert b'"stream_interrupted"' in events[-1]  # never a silent truncation


@pytest.mark.asyncio
async def test_a_whole_call_past_its_timeout_is_an_error_not_a_hang() -> None:
    async with StreamEngine("stall").serving() as engine, \
            gateway_app([engine.url], poll_interval=0.05, whole_timeout=0.3) as (base, gw):
        await ready(gw)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        started = time.monotonic()
        async with aiohttp.ClientSession() as http, http.post(base + "/v1/chat/completions", json=body) as r:
            answer = await r.json()
        assert time.monotonic() - started < 5
        assert r.status == 502 and answer["error"]["code"] == "engine_failed"


class FloodEngine(StreamEngine):
    """Streams 64 KiB events as fast as its client reads them, until it disconnects."""

    def __init__(self) -> None:
        super().__init__("flood")
        self.events_sent, self.disconnected = 0, asyncio.Event()

    async def call(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        event = b"data: " + orjson.dumps({"id": "x", "choices": [{"index": 0, "delta": {"content": "y" * 65_536}}]})
        try:
            for _ in range(100_000):  # 6 GiB: a stream no test would see end
                await response.write(event + b"\n\n")
                self.events_sent += 1
        except (ConnectionError, asyncio.CancelledError):
            self.disconnected.set()
            raise
        return response


@pytest.mark.asyncio
async def test_a_client_that_stops_reading_is_given_up_within_the_write_timeout_and_settled() -> None:
    """A real client reads the response headers of its stream and then nothing: once its buffers
    are full, the gateway gives the call up within ``write_timeout``, closes the engine's
    connection (so the engine stops generating), and settles the call: it leaves the program's
    active calls, the engine's in-flight count and its tenant's slot."""
    async with FloodEngine().serving() as engine, \
            gateway_app([engine.url], poll_interval=0.05, write_timeout=0.5) as (base, gw):
        await ready(gw)
        host, port = base.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills after a few KiB
        sock.connect((host, int(port)))
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True})
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"x-session-id: slow-reader\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")  # the stream began...
            assert b" 200 " in head.split(b"\r\n")[0]
            began = time.monotonic()  # ...and from here the client reads nothing
            await asyncio.wait_for(engine.disconnected.wait(), 10)
            for _ in range(100):
                entry = await gw.store.programs.load("slow-reader")
                if entry is not None and not entry.active and gw.pool is not None and not any(
                        e.inflight for e in gw.pool.engines.values()):
                    break
                await asyncio.sleep(0.05)
            given_up_after = time.monotonic() - began
        finally:
            writer.close()  # a failed check must not leave the gateway's handler blocked on this client
        assert entry is not None and not entry.active and entry.calls_done + entry.calls_aborted == 1
        assert gw.pool is not None and [e.inflight for e in gw.pool.engines.values()] == [0]
        assert gw.limiter.state(None, time.monotonic()).gate.running == 0
        # given up in about write_timeout once the buffers filled, not after the engine's 6 GiB
        assert given_up_after < 5 and engine.events_sent < 10_000
