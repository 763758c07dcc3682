"""The llmd-fairness system's proxy (llm-d's flow control) in front of a real stock vLLM engine."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web

from autellix.child_processes import free_port
from autellix.engine.launch import EngineProcess
from autellix.loadgen.flow_control_proxy import FAIRNESS_HEADER, FlowControlProxy, usage_of
from tests.live import MODEL


def _body(max_tokens: int, *, stream: bool = False) -> dict[str, object]:
    body: dict[str, object] = {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True,
                               "messages": [{"role": "user", "content": "tell me about queues " * 4}]}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def test_usage_is_read_from_a_json_body_or_the_last_event_that_carries_it() -> None:
    assert usage_of(json.dumps({"usage": {"prompt_tokens": 7, "completion_tokens": 3}}).encode(), False) == (7, 3)
    events = (b'data: {"choices": [{"delta": {"content": "a"}}], "usage": null}\n\n'
              b'data: {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}\n\ndata: [DONE]\n\n')
    assert usage_of(events, True) == (9, 4)
    assert usage_of(b"not json", False) == (0, 0) and usage_of(b"data: [DONE]\n\n", True) == (0, 0)


def test_requests_wait_while_the_engine_is_saturated_and_the_least_served_program_goes_first(
        engine_cache: Callable[..., EngineProcess]) -> None:
    # one running slot: llm-d's detector (5 waiting) holds the rest of a burst at the proxy
    engine = engine_cache(scheduler="vllm-priority", max_num_seqs=1)
    proxy = FlowControlProxy(engine.url, slots=1)
    finished: list[str] = []

    async def call(http: aiohttp.ClientSession, base: str, program: str, max_tokens: int, *,
                   stream: bool = False) -> bytes:
        async with http.post(base + "/v1/chat/completions", json=_body(max_tokens, stream=stream),
                             headers={FAIRNESS_HEADER: program}) as response:
            assert response.status == 200, await response.text()
            body = await response.read()
        finished.append(program)
        return body

    async def main() -> tuple[bytes, bytes]:
        runner = web.AppRunner(proxy.app())
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as http:
                # the engine's other routes pass through
                async with http.get(base + "/v1/models") as response:
                    assert MODEL in {m["id"] for m in (await response.json())["data"]}
                whole = await call(http, base, "heavy", 16)  # "heavy" has attained service from now on
                streamed = await call(http, base, "heavy", 8, stream=True)
                finished.clear()
                burst = [asyncio.create_task(call(http, base, "heavy", 96)) for _ in range(10)]
                deadline = time.monotonic() + 30
                while len(proxy.queues) < 3:  # the engine took what the detector allows; the rest wait here
                    assert time.monotonic() < deadline, "the proxy never held a request"
                    await asyncio.sleep(0.01)
                light = asyncio.create_task(call(http, base, "light", 96))
                await asyncio.gather(*burst, light)
            return whole, streamed
        finally:
            await runner.cleanup()

    whole, streamed = asyncio.run(main())
    # the replies are the engine's own, whole or streamed
    assert json.loads(whole)["usage"]["completion_tokens"] == 16
    assert b"data: [DONE]" in streamed and usage_of(streamed, True)[1] == 8
    # "light" (no service yet) was sent before every "heavy" request still held when it came
    assert finished.count("heavy") == 10 and "light" in finished
    assert len(finished) - 1 - finished.index("light") >= 3, finished
    # each program was charged its tokens: input + 2 x output, from the replies' usage
    now = time.monotonic()
    assert proxy.queues.service("heavy", now) > proxy.queues.service("light", now) >= 2 * 96
