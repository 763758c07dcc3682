"""The upstream leg: one call to one engine, streamed through or whole.

A failure before any response byte (refused, reset, dropped) raises
``EngineUnreachable`` so the caller can move the call to another engine; once
bytes have reached the client nothing is retried, and a stream cut midway ends
with an explicit SSE error event instead of a silent truncation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

#: Response headers that describe the upstream connection, not the content.
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding", "date", "server"}


class EngineUnreachable(Exception):
    """Nothing came back: the call did not start and may go elsewhere."""


class EngineHung(EngineUnreachable):
    """The engine took the call and sent no headers in time: it may still answer
    its health checks, so the pool keeps it out for a while (``mark_hung``)."""


@dataclass
class Outcome:
    status: int
    completion_tokens: int = 0
    prompt_tokens: int = 0
    #: The stream was cut after bytes reached the client (an error event was sent).
    broken: bool = False
    #: vLLM's per-request timing (``--enable-per-request-metrics``): time from the
    #: call's first schedule to its last token, in seconds; None when absent.
    engine_seconds: float | None = None

    def read_usage(self, body: dict[str, Any]) -> None:
        usage = body.get("usage") or {}
        self.completion_tokens = int(usage.get("completion_tokens") or 0)
        self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        metrics = body.get("metrics")
        if isinstance(metrics, dict):
            ttft, generation = metrics.get("time_to_first_token_ms"), metrics.get("generation_time_ms")
            if isinstance(ttft, int | float) and isinstance(generation, int | float):
                self.engine_seconds = max(0.0, (ttft + generation) / 1000.0)


async def open_upstream(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
                        headers: dict[str, str], *, header_timeout: float | None = None) -> aiohttp.ClientResponse:
    """POST the call; returns once the engine's response headers are in.

    ``header_timeout`` bounds that wait. vLLM answers a streamed call's headers
    as soon as the call is queued, before its first token, so an engine that
    sends none in that time accepted the call and hung: the call has not
    started for the client and may move to another engine. (A whole call's
    headers come with its last token, so it gets no such bound.)"""
    try:
        return await asyncio.wait_for(http.post(url, data=orjson.dumps(body), headers=headers), header_timeout)
    except TimeoutError as exc:
        if header_timeout is not None:
            raise EngineHung(f"no response headers within {header_timeout:g} s") from exc
        raise EngineUnreachable(repr(exc)) from exc
    except aiohttp.ClientConnectionError as exc:
        raise EngineUnreachable(repr(exc)) from exc


def _copy_headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}


async def relay_whole(upstream: aiohttp.ClientResponse) -> tuple[web.Response, Outcome]:
    try:
        raw = await upstream.read()
    except aiohttp.ClientError as exc:
        raise EngineUnreachable(repr(exc)) from exc
    finally:
        upstream.release()
    outcome = Outcome(upstream.status)
    if upstream.status == 200:
        with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            outcome.read_usage(orjson.loads(raw))
    return web.Response(status=upstream.status, body=raw, headers=_copy_headers(upstream)), outcome


STREAM_CUT = orjson.dumps({"error": {
    "message": "The engine's stream was cut before the call finished; the output above is incomplete.",
    "type": "upstream_error", "code": "stream_interrupted", "param": None}})


async def relay_stream(request: web.Request, upstream: aiohttp.ClientResponse,
                       *, client_wants_usage: bool,
                       on_done: Callable[[Outcome], Awaitable[None]] | None = None,
                       ) -> tuple[web.StreamResponse, Outcome]:
    """Pass SSE events through as they come; read usage from the final chunk.

    The gateway asks the engine for a usage chunk; if the client did not, that
    chunk (empty ``choices``) is dropped so the client sees what it asked for.
    ``on_done`` runs before the closing ``[DONE]`` goes out, so a client that
    reads its session right after a stream sees the call already settled.
    """
    response = web.StreamResponse(status=upstream.status, headers=_copy_headers(upstream))
    outcome = Outcome(upstream.status)
    skip_blank = done = False
    try:
        async for line in upstream.content:
            if not response.prepared:  # headers go out with the first event, so an
                await response.prepare(request)  # engine dying before it can still be retried
            if not done and line.startswith(b"data: [DONE]"):
                done = True
                if on_done is not None:
                    await on_done(outcome)
            if line.startswith(b"data: {") and b'"usage":{' in line:
                chunk = orjson.loads(line[6:])
                outcome.read_usage(chunk)
                if not client_wants_usage and not chunk.get("choices"):
                    skip_blank = True
                    continue
            if skip_blank and line.strip() == b"":
                skip_blank = False
                continue
            await response.write(line)
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
        if not response.prepared:
            raise EngineUnreachable(repr(exc)) from exc
        done = False
    finally:
        upstream.release()
    if not response.prepared:
        raise EngineUnreachable("the engine closed the stream before its first event")
    if not done:  # cut, or closed without the closing event
        outcome.broken = True
        await response.write(b"data: " + STREAM_CUT + b"\n\n")
    await response.write_eof()
    return response, outcome
