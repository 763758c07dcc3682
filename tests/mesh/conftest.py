"""Real Envoy, the real xDS control plane and real gateway processes, in front of an engine stand-in.

The engine is ``experiments/instant_engine.py``'s canned answers served in a thread of
this process, plus a streamed chat whose second chunk waits for the test's
``release()`` (so a test can see a chunk arrive through Envoy while the engine is
still holding the rest of the stream), and whole calls saying "hold" that wait for
it too (calls in flight when a replica dies).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from autellix.child_processes import free_port
from autellix.mesh.local import LocalMesh
from autellix.mesh.resources import MeshSettings
from tests.live import load_instant_engine, serve_on_loopback

REPLICAS = 3


def sse(payload: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def chunk(text: str) -> dict[str, object]:
    return {"id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 0, "model": "tiny-llama",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


class StandInEngine:
    def __init__(self) -> None:
        self.instant = load_instant_engine()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="stand-in-engine", daemon=True)
        self.gate = asyncio.Event()
        #: Whole calls held now (read from the test's thread).
        self.holding = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            if body["messages"][-1]["content"] == "hold":
                self.holding += 1
                try:
                    await self.gate.wait()  # a whole call held in flight until the test's release()
                finally:
                    self.holding -= 1  # released, or its gateway went away (cancelled)
            return web.Response(body=self.instant.CHAT, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(chunk("first")))
        await self.gate.wait()  # the test reads "first" through Envoy while we hold the rest
        await response.write(sse(chunk("second")))
        await response.write(sse({"id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 0,
                                  "model": "tiny-llama", "choices": [],
                                  "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _metrics(self, _request: web.Request) -> web.Response:
        """vLLM's load gauges: the whole calls held now are running (what every gateway reads)."""
        model = self.instant.MODEL
        return web.Response(text=f'vllm:num_requests_running{{model_name="{model}"}} {float(self.holding)}\n'
                                 f'vllm:num_requests_waiting{{model_name="{model}"}} 0.0\n', content_type="text/plain")

    async def _start(self) -> None:
        fixed = self.instant.fixed
        app = web.Application()
        app.router.add_get("/health", fixed(b"", "text/plain"))
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", fixed(self.instant.MODELS))
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        self.url = await serve_on_loopback(self._runner)

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    def hold(self) -> None:
        self.loop.call_soon_threadsafe(self.gate.clear)

    def release(self) -> None:
        self.loop.call_soon_threadsafe(self.gate.set)

    def stop(self) -> None:
        self.release()
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def engine() -> Iterator[StandInEngine]:
    stand_in = StandInEngine()
    stand_in.start()
    try:
        yield stand_in
    finally:
        stand_in.stop()


@pytest.fixture(scope="module")
def mesh(engine: StandInEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMesh]:
    """Control plane + Envoy + 3 gateway replicas; Envoy's port is the endpoint."""
    settings = MeshSettings(listen_port=free_port())
    with LocalMesh([engine.url], REPLICAS, settings=settings, log_dir=tmp_path_factory.mktemp("mesh")) as started:
        yield started
