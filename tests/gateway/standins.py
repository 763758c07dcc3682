"""Engine stand-ins on real ports (aiohttp) and the real gateway app in-process.

A stand-in answers ``/health``, ``/metrics`` and ``/v1/models`` like vLLM and
fails its calls in one of the ways engines fail: it drops the connection
before answering, cuts a whole answer's body, or cuts a stream after its first
event. Every call it receives is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from aiohttp import web

from autellix.gateway.compose import SERVER_LIMITS, create_app
from autellix.gateway.config import GatewayConfig
from autellix.gateway.errors import GatewayRunner
from autellix.gateway.parts import GATEWAY_KEY, Gateway
from tests.live import serve_on_loopback

MODEL = "stand-in"


def add_probes(app: web.Application, model: Callable[[], str] = lambda: MODEL) -> None:
    """What a gateway reads of an engine besides its calls, as vLLM answers it: health, metrics (nothing
    running or waiting) and the one model it serves now (``model``: a stand-in may be redeployed with another)."""

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=f'vllm:num_requests_running{{model_name="{model()}"}} 0.0\n'
                                 f'vllm:num_requests_waiting{{model_name="{model()}"}} 0.0\n')

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model(), "object": "model"}]})

    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)


class StandIn:
    """``behaviour``: ``drop`` (close before any byte), ``empty_stream`` (a stream's
    headers, then close before its first event), ``cut_body`` (headers and half a
    body, then close), ``cut_stream`` (one SSE event, then close), ``ok``."""

    def __init__(self, behaviour: str, model: str = MODEL) -> None:
        self.behaviour, self.model = behaviour, model
        self.calls = 0
        #: The JSON bodies of the calls it answered, in order.
        self.bodies: list[Any] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _call(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(json.loads(await request.read() or b"null"))
        self.calls += 1
        if self.behaviour == "drop":
            assert request.transport is not None
            request.transport.close()
            await asyncio.sleep(0.05)
            return web.Response()
        if self.behaviour == "cut_body":
            response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "400"})
            await response.prepare(request)
            await response.write(b'{"id": "x", "choices": [')
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.close()
            return response
        if self.behaviour == "empty_stream":
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.close()
            return response
        if self.behaviour == "cut_stream":
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n')
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.close()
            return response
        return web.json_response({"id": "x", "object": "chat.completion", "model": self.model, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

    async def start(self) -> None:
        app = web.Application()
        add_probes(app, lambda: self.model)
        app.router.add_post("/v1/chat/completions", self._call)
        app.router.add_post("/v1/completions", self._call)
        self._runner = web.AppRunner(app, access_log=None)
        self.url = await serve_on_loopback(self._runner)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@contextlib.asynccontextmanager
async def stand_ins(*behaviours: str) -> AsyncIterator[list[StandIn]]:
    engines = [StandIn(b) for b in behaviours]
    for engine in engines:
        await engine.start()
    try:
        yield engines
    finally:
        for engine in engines:
            await engine.stop()


@contextlib.asynccontextmanager
async def gateway_app(urls: list[str], **config: Any) -> AsyncIterator[tuple[str, Gateway]]:
    """The gateway app ``autellix gateway`` serves, on a local port, in this event loop, with its
    admin listener on another (``Gateway.admin_url``; ``get_json`` sends admin paths there)."""
    app = create_app(GatewayConfig(engines=urls, **{"admin_port": 0, **config}))
    runner = GatewayRunner(app, access_log=None, handler_cancellation=True, **SERVER_LIMITS)
    base = await serve_on_loopback(runner)
    if app[GATEWAY_KEY].admin_url:
        ADMIN_URLS[base] = app[GATEWAY_KEY].admin_url  # type: ignore[assignment]
    try:
        yield base, app[GATEWAY_KEY]
    finally:
        await runner.cleanup()


#: Gateway base URL -> its admin listener.
ADMIN_URLS: dict[str, str] = {}


async def get_json(base: str, path: str) -> Any:
    """GET a gateway path; admin paths go to that gateway's admin listener."""
    if path.startswith("/admin/"):
        base = ADMIN_URLS[base]
    async with aiohttp.ClientSession() as http, http.get(base + path) as r:
        return await r.json()


async def metric_values(base: str, name: str) -> dict[str, float]:
    """Samples of one metric from the gateway's /metrics: label text -> value."""
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as r:
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key[len(name):]] = float(value)
    return out
