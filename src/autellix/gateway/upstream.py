"""The upstream leg (transport): one attempt of a call at one engine, streamed through or whole.

A failure before any response byte (refused, reset, dropped) raises
``EngineUnreachable`` (retryable) so the request controller can move the call
to another engine. A whole answer whose body was being read when the engine
failed raises ``ResponseCut``: the call may have run, so it is not retried.
Once bytes have reached the client nothing is retried, and a stream cut midway
ends with an explicit SSE error event instead of a silent truncation. What an
answer says (usage, timing) is read by the engine backend.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from autellix.backends import CallOutcome, EngineBackend
from autellix.control.controller import EngineFailure

#: Response headers that describe the upstream connection, not the content.
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding", "date", "server"}


class EngineUnreachable(EngineFailure):
    """Nothing came back: the call did not start and may go elsewhere."""

    def __init__(self, detail: str, reason: str = "connect") -> None:
        super().__init__(reason, detail, retryable=True)


class EngineHung(EngineUnreachable):
    """The engine took the call and sent no headers in time: it may still answer
    its health checks, so the pool keeps it out for a while (``mark_hung``)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail, "hung")
        self.hung = True


class ResponseCut(EngineFailure):
    """A whole answer broke while its body was read: the call may have run, so
    it is not retried (the client gets a 502)."""

    def __init__(self, detail: str) -> None:
        super().__init__("body_cut", detail, retryable=False)


#: The outcome of one call, under its old name.
Outcome = CallOutcome


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
        raise EngineUnreachable(repr(exc), "timeout") from exc
    except aiohttp.ServerDisconnectedError as exc:
        raise EngineUnreachable(repr(exc), "disconnected") from exc
    except aiohttp.ClientConnectionError as exc:
        raise EngineUnreachable(repr(exc), "connect") from exc


def _copy_headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}


async def relay_whole(upstream: aiohttp.ClientResponse, backend: EngineBackend) -> tuple[web.Response, CallOutcome]:
    try:
        raw = await upstream.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ResponseCut(repr(exc)) from exc
    finally:
        upstream.release()
    outcome = CallOutcome(upstream.status)
    if upstream.status == 200:
        with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            answer = orjson.loads(raw)
            if isinstance(answer, dict):
                backend.read_usage(answer, outcome)
    return web.Response(status=upstream.status, body=raw, headers=_copy_headers(upstream)), outcome


STREAM_CUT = orjson.dumps({"error": {
    "message": "The engine's stream was cut before the call finished; the output above is incomplete.",
    "type": "upstream_error", "code": "stream_interrupted", "param": None}})


class _UsageChunk:
    """Reads the usage chunk of a stream; drops it (and the blank line after it)
    when the client did not ask for usage."""

    def __init__(self, backend: EngineBackend, outcome: CallOutcome, client_wants_usage: bool) -> None:
        self.backend, self.outcome, self.client_wants_usage = backend, outcome, client_wants_usage
        self.skip_blank = False

    def passes(self, line: bytes) -> bool:
        if line.startswith(b"data: {") and b'"usage":{' in line:
            chunk = orjson.loads(line[6:])
            self.backend.read_usage(chunk, self.outcome)
            if not self.client_wants_usage and not chunk.get("choices"):
                self.skip_blank = True
                return False
        if self.skip_blank and line.strip() == b"":
            self.skip_blank = False
            return False
        return True


async def relay_stream(request: web.Request, upstream: aiohttp.ClientResponse, backend: EngineBackend,
                       *, client_wants_usage: bool,
                       on_done: Callable[[CallOutcome], Awaitable[None]] | None = None,
                       ) -> tuple[web.StreamResponse, CallOutcome]:
    """Pass SSE events through as they come; read usage from the final chunk.

    The gateway asks the engine for a usage chunk; if the client did not, that
    chunk (empty ``choices``) is dropped so the client sees what it asked for.
    ``on_done`` runs before the closing ``[DONE]`` goes out, so a client that
    reads its session right after a stream sees the call already settled.
    """
    response = web.StreamResponse(status=upstream.status, headers=_copy_headers(upstream))
    outcome = CallOutcome(upstream.status)
    usage = _UsageChunk(backend, outcome, client_wants_usage)
    done = False
    try:
        async for line in upstream.content:
            if not response.prepared:  # headers go out with the first event, so an
                await response.prepare(request)  # engine dying before it can still be retried
            if not done and line.startswith(b"data: [DONE]"):
                done = True
                if on_done is not None:
                    await on_done(outcome)
            if usage.passes(line):
                await response.write(line)
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
        if not response.prepared:
            raise EngineUnreachable(repr(exc), "stream_closed") from exc
        done = False
    finally:
        upstream.release()
    if not response.prepared:
        raise EngineUnreachable("the engine closed the stream before its first event", "stream_closed")
    if not done:  # cut, or closed without the closing event
        outcome.broken = True
        await response.write(b"data: " + STREAM_CUT + b"\n\n")
    await response.write_eof()
    return response, outcome
