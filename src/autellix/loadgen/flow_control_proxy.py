"""The ``llmd-fairness`` benchmark system's gateway: a small proxy in front of one
stock vLLM engine that does what llm-d's flow control does (the rival's rule,
``autellix.core.flow_control``).

Each completion request names its program in llm-d's fairness header
(``FAIRNESS_HEADER``; without it the request is the default program's). While
the engine is saturated by llm-d's default detector (``UtilizationDetector``:
5 waiting requests or 80% KV use), requests wait here in per-program queues;
the dispatcher sends the next one from the program with the best
program-aware fairness score (``ProgramFairQueues``), and a finished
request's usage (prompt and completion tokens) becomes its program's
attained service. The engine's metrics are read every ``METRICS_INTERVAL_S``
(the endpoint picker's refresh); a request sent after the last reading
began counts as waiting on the engine until the next one shows it. Every
other route passes through untouched.

``autellix bench flow-control-proxy --engine URL --port N`` runs it;
``autellix bench sweep`` starts it for the ``llmd-fairness`` system.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import aiohttp
from aiohttp import web

from autellix.backends.scrape import parse_metrics
from autellix.core.engine_load import EngineLoad
from autellix.core.flow_control import ProgramFairQueues, UtilizationDetector

#: llm-d's fairness-ID header: the program a request belongs to.
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
#: The program of a request without the header (llm-d's default flow).
DEFAULT_PROGRAM = "default"
#: How often the engine's metrics are read (the endpoint picker's 50 ms refresh).
METRICS_INTERVAL_S = 0.05
#: The completion routes that go through flow control.
QUEUED_PATHS = ("/v1/chat/completions", "/v1/completions")
_RUNNING, _WAITING, _KV = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"
#: KV blocks assumed when the engine does not publish ``num_gpu_blocks`` (only the fraction is read then).
_KV_SCALE = 10_000
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def usage_of(body: bytes, streamed: bool) -> tuple[int, int]:
    """(prompt, completion) tokens of a finished response: the JSON body's
    ``usage``, or the last server-sent event that carries one; (0, 0) if none."""
    if not streamed:
        with contextlib.suppress(ValueError):
            usage = json.loads(body).get("usage") or {}
            return int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
        return 0, 0
    found = (0, 0)
    for line in body.splitlines():
        if line.startswith(b"data:") and b'"usage"' in line:
            with contextlib.suppress(ValueError, AttributeError):
                usage = json.loads(line[5:]).get("usage")
                if usage:
                    found = (int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))
    return found


class FlowControlProxy:
    def __init__(self, engine: str, *, slots: int, detector: UtilizationDetector | None = None) -> None:
        self.engine = engine.rstrip("/")
        self.slots = slots
        self.detector = detector or UtilizationDetector()
        self.queues: ProgramFairQueues[asyncio.Future[None]] = ProgramFairQueues()
        self.load = EngineLoad(0, 0, slots, 0, _KV_SCALE)
        self._kv_blocks = _KV_SCALE
        #: Send times of requests the last reading may not show yet.
        self._sent: list[float] = []
        self._http: aiohttp.ClientSession | None = None
        self._poller: asyncio.Task[None] | None = None

    # ---- the engine's state -------------------------------------------------------
    async def _read_metrics(self) -> None:
        assert self._http is not None
        started = time.monotonic()
        async with self._http.get(self.engine + "/metrics") as response:
            text = await response.text()
        values = parse_metrics(text, (_RUNNING, _WAITING, _KV))
        self._sent = [t for t in self._sent if t >= started]
        self.load = EngineLoad(running=int(values.get(_RUNNING, 0)), waiting=int(values.get(_WAITING, 0)),
                               slots=self.slots, kv_blocks_used=round(values.get(_KV, 0.0) * self._kv_blocks),
                               kv_blocks_total=self._kv_blocks)

    async def _poll(self) -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError, ValueError):
                await self._read_metrics()
            self.pump()
            await asyncio.sleep(METRICS_INTERVAL_S)

    def _seen_load(self) -> EngineLoad:
        """The last reading, with the requests sent since counted as waiting."""
        load = self.load
        return EngineLoad(load.running, load.waiting + len(self._sent), load.slots, load.kv_blocks_used,
                          load.kv_blocks_total)

    def pump(self) -> None:
        now = time.monotonic()
        while len(self.queues) and not self.detector.saturated([self._seen_load()]):
            picked = self.queues.pick(now)
            assert picked is not None
            self._sent.append(now)
            if not picked[1].done():
                picked[1].set_result(None)

    # ---- routes -------------------------------------------------------------------
    async def queued(self, request: web.Request) -> web.StreamResponse:
        program = request.headers.get(FAIRNESS_HEADER) or DEFAULT_PROGRAM
        body = await request.read()
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.queues.push(program, turn, time.monotonic())
        self.pump()
        try:
            await turn
        except asyncio.CancelledError:  # the client went away while its request waited
            self.queues.withdraw(program, turn)
            raise
        try:
            return await self._relay(request, body, program)
        finally:
            self.pump()

    async def _relay(self, request: web.Request, body: bytes, program: str | None) -> web.StreamResponse:
        """Send the request to the engine and its answer back as it comes; a
        completion's usage becomes its program's service (none if it failed)."""
        assert self._http is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        kept: list[bytes] = []
        streamed = False
        response: web.StreamResponse | None = None
        try:
            async with self._http.request(request.method, self.engine + request.path_qs, data=body or None,
                                          headers=headers) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS})
                streamed = upstream.headers.get("content-type", "").startswith("text/event-stream")
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                    if program is not None:
                        kept.append(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientError as exc:  # the engine went away: the client learns it, the proxy goes on
            if response is not None and response.prepared:
                raise  # part of the answer went out: the client sees the connection end
            return web.json_response({"error": {"message": f"engine unreachable: {exc}", "type": "bad_gateway",
                                                "code": 502}}, status=502)
        finally:
            if program is not None:
                prompt, completion = usage_of(b"".join(kept), streamed)
                self.queues.completed(program, time.monotonic(), prompt_tokens=prompt,
                                      completion_tokens=completion)

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        return await self._relay(request, await request.read(), None)

    # ---- life ---------------------------------------------------------------------
    async def start(self, app: web.Application) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        with contextlib.suppress(aiohttp.ClientError, ValueError):
            async with self._http.get(self.engine + "/metrics") as response:
                self._kv_blocks = engine_kv_blocks(await response.text()) or _KV_SCALE
        self._poller = asyncio.create_task(self._poll())

    async def stop(self, app: web.Application) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._http is not None:
            await self._http.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for path in QUEUED_PATHS:
            app.router.add_post(path, self.queued)
        app.router.add_route("*", "/{tail:.*}", self.passthrough)
        app.on_startup.append(self.start)
        app.on_cleanup.append(self.stop)
        return app


def engine_kv_blocks(metrics_text: str) -> int | None:
    """``num_gpu_blocks`` from vLLM's ``vllm:cache_config_info`` labels, if published."""
    from prometheus_client.parser import text_string_to_metric_families

    lines = "\n".join(line for line in metrics_text.splitlines() if line.startswith("vllm:cache_config_info"))
    for family in text_string_to_metric_families(lines):
        for sample in family.samples:
            value: Any = sample.labels.get("num_gpu_blocks")
            if value and str(value).isdigit():
                return int(value)
    return None


def serve(engine: str, port: int, *, slots: int, host: str = "127.0.0.1") -> None:
    """Run the proxy until stopped."""
    web.run_app(FlowControlProxy(engine, slots=slots).app(), host=host, port=port, print=None)
