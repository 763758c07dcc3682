"""Endpoint picker tests: engine stand-ins that record what reached them, and small HTTP helpers.

A stand-in serves as much of vLLM's API as the picker and Envoy use (health, the
load gauges, models, whole and streamed chat and completions with a usage
chunk), on a thread of this process, and records each call's body and headers
so that a test sees what the engine got. It can be told to refuse calls (503,
as an engine that took nothing), to fail its health checks, to report a load,
and to hold calls until released (a whole call before its answer, a stream after
its first chunk).
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from tests.live import load_instant_engine, serve_on_loopback

MODEL = "tiny-llama"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"  # compact, as vLLM writes


def chunk(text: str) -> dict[str, Any]:
    return {"id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


USAGE_CHUNK = {"id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 0, "model": MODEL, "choices": [],
               "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


@dataclass
class StandIn:
    """One engine stand-in; its switches are read at each request."""

    url: str = ""
    healthy: bool = True
    refusing: bool = False
    running: float = 0.0
    #: (path, headers with lower-case names, body) of every call that reached it.
    calls: list[tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=list)
    gate: asyncio.Event | None = None

    @property
    def endpoint(self) -> str:
        return self.url.removeprefix("http://")


class StandIns:
    """Stand-ins on one event loop in a thread of their own."""

    def __init__(self) -> None:
        self.instant = load_instant_engine()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="stand-ins", daemon=True)
        self.thread.start()
        self.runners: list[web.AppRunner] = []

    def add(self, **switches: Any) -> StandIn:
        engine = StandIn(**switches)
        engine.url = asyncio.run_coroutine_threadsafe(self._start(engine), self.loop).result(10)
        return engine

    def hold(self, engine: StandIn) -> None:
        """Calls to ``engine`` wait for ``release``: a whole one before its answer, a stream after its first chunk."""
        async def make() -> None:
            engine.gate = asyncio.Event()
        asyncio.run_coroutine_threadsafe(make(), self.loop).result(5)

    def release(self, engine: StandIn) -> None:
        gate = engine.gate
        if gate is not None:
            self.loop.call_soon_threadsafe(gate.set)

    async def _start(self, engine: StandIn) -> str:
        instant = self.instant

        async def health(_request: web.Request) -> web.Response:
            return web.Response(status=200 if engine.healthy else 503)

        async def metrics(_request: web.Request) -> web.Response:
            return web.Response(text=f'vllm:num_requests_running{{model_name="{MODEL}"}} {engine.running}\n'
                                     f'vllm:num_requests_waiting{{model_name="{MODEL}"}} 0.0\n')

        def call(whole: bytes) -> Any:
            async def handler(request: web.Request) -> web.StreamResponse:
                body = await request.json()
                engine.calls.append((request.path, {k.lower(): v for k, v in request.headers.items()}, body))
                if engine.refusing:
                    return web.json_response({"error": {"message": "not now", "code": 503}}, status=503)
                if not body.get("stream"):
                    if engine.gate is not None:
                        await engine.gate.wait()
                    return web.Response(body=whole, content_type="application/json")
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await response.prepare(request)
                await response.write(sse(chunk("first")))
                if engine.gate is not None:
                    await engine.gate.wait()
                await response.write(sse(chunk("second")))
                await response.write(sse(USAGE_CHUNK))
                await response.write(b"data: [DONE]\n\n")
                await response.write_eof()
                return response
            return handler

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/v1/models", instant.fixed(instant.MODELS))
        app.router.add_post("/v1/chat/completions", call(instant.CHAT))
        app.router.add_post("/v1/completions", call(instant.COMPLETION))
        runner = web.AppRunner(app, handler_cancellation=True)
        self.runners.append(runner)
        return await serve_on_loopback(runner)

    def stop(self) -> None:
        async def cleanup() -> None:
            for runner in self.runners:
                await runner.cleanup()
        asyncio.run_coroutine_threadsafe(cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def stand_ins() -> Iterator[StandIns]:
    engines = StandIns()
    try:
        yield engines
    finally:
        engines.stop()


def metric(text: str, name: str, **labels: str) -> float:
    """A sample's value in a Prometheus text page (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head == name or head == f"{name}{{{wanted}}}":
            return float(value)
    return 0.0


def fetch(method: str, url: str, body: object | None = None, headers: dict[str, str] | None = None, *,
          raw: bytes | None = None, timeout: float = 60.0) -> tuple[int, dict[str, str], bytes]:
    """One request: (status, response headers with lower-case names, body)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()
