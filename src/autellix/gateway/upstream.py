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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from autellix.backends import CallOutcome, EngineBackend
from autellix.control.controller import EngineFailure
from autellix.gateway.dialects import Dialect, StreamReader
from autellix.gateway.engine_calls import ConnectFailed, Dropped, EngineAnswer, EngineCalls, HeadTimeout, Timeouts
from autellix.protocol import RECORD_HEADER, CallRecord

#: Response headers that describe the upstream connection, not the content.
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding", "date", "server",
               RECORD_HEADER.lower()}  # the engine's record is for the gateway, not the client


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


#: Longest SSE line relayed (a logprobs chunk can run to megabytes); a longer one cuts the stream
#: with the error event, rather than aiohttp's line limit breaking the chunked body.
MAX_SSE_LINE = 16 * 1024 * 1024
#: Bytes waiting for a slow client above which a write is bounded by ``write_timeout``.
WRITE_BUFFER_WATCH = 64 * 1024


class ClientTooSlow(Exception):
    """The client read nothing for ``write_timeout`` seconds: its call is given up."""


async def open_upstream(calls: EngineCalls, url: str, body: dict[str, Any], headers: dict[str, str],
                        timeouts: Timeouts, *, stream: bool) -> EngineAnswer:
    """POST the call; returns once the engine's response headers are in.

    ``timeouts.head`` bounds that wait. vLLM answers a streamed call's headers
    as soon as the call is queued, before its first token, so an engine that
    sends none in that time accepted the call and hung: the call has not
    started for the client and may move to another engine (``EngineHung``). A
    whole call's headers come with its last token, so its head timeout is the
    whole answer's: past it the call may have run, and is never sent twice.

    A call dropped before any answer on a kept-alive connection is sent once
    more, on a new connection: an engine closes idle keep-alive connections
    (uvicorn after 5 s), and a call sent on one as it closes is dropped unread.
    That is not the engine failing; counted as one, it took a healthy engine
    out of the pool (with one engine, calls failed with 503 until its next
    health check). A call dropped on a new connection is the engine's doing:
    ``disconnected``, and the call moves on."""
    data = orjson.dumps(body)
    for redial in (True, False):
        try:
            return await calls.post(url, data, headers, timeouts)
        except ConnectFailed as exc:  # nothing was sent: another engine may take it
            raise EngineUnreachable(str(exc), "connect") from exc
        except Dropped as exc:
            if redial and exc.reused:
                continue
            raise EngineUnreachable(str(exc), "disconnected") from exc
        except HeadTimeout as exc:
            if stream:
                raise EngineHung(f"no response headers within {timeouts.head:g} s") from exc
            # a whole call the engine took and did not answer in time: it may have run, never twice
            raise EngineFailure("timeout", repr(exc), retryable=False) from exc
        except TimeoutError as exc:  # the attempt's whole time ran out before the answer's headers
            raise EngineFailure("timeout", repr(exc), retryable=False) from exc
        except (aiohttp.ClientError, OSError) as exc:  # reset, or a malformed answer before its body
            raise EngineUnreachable(repr(exc), "disconnected") from exc
    raise AssertionError("unreachable: the second try returns or raises")


def _copy_headers(upstream: EngineAnswer) -> dict[str, str]:
    return {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}


def _outcome(upstream: EngineAnswer) -> CallOutcome:
    """The answer's outcome so far: its status, and the engine's record of the call if its
    headers carry one (``autellix.protocol.RECORD_HEADER``; a malformed one is ignored)."""
    outcome = CallOutcome(upstream.status)
    value = upstream.headers.get(RECORD_HEADER)
    if value:
        with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            data = orjson.loads(value)
            outcome.record = CallRecord.from_dict(data) if isinstance(data, dict) else None
    return outcome


async def relay_whole(upstream: EngineAnswer, dialect: Dialect,
                      backend: EngineBackend) -> tuple[web.Response, CallOutcome]:
    """The whole answer, read and passed on; its usage read by ``dialect``; an engine's error put in the
    dialect's shape (``Dialect.engine_error``)."""
    try:
        raw = await upstream.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ResponseCut(repr(exc)) from exc
    finally:
        upstream.release()
    outcome = _outcome(upstream)
    if upstream.status == 200:
        with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            answer = orjson.loads(raw)
            if isinstance(answer, dict):
                dialect.read_usage(answer, outcome, backend)
    elif upstream.status >= 400:
        raw = dialect.engine_error(raw, upstream.status)
    return web.Response(status=upstream.status, body=raw, headers=_copy_headers(upstream)), outcome


def _give_up(request: web.Request, outcome: CallOutcome) -> None:
    """A client too slow to read: nothing more can reach it, so the call ends here. Leaving the
    relay releases the engine's connection, so the engine aborts the request and frees its slot."""
    if request.transport is not None:
        request.transport.abort()
    outcome.broken = True


async def sse_lines(content: aiohttp.StreamReader, max_line: int = MAX_SSE_LINE) -> AsyncIterator[bytes]:
    """The stream's lines (with their newline), any length up to ``max_line``: aiohttp's own
    ``readline`` refuses lines over its buffer limit (128 KiB), which logprobs chunks exceed."""
    buffer = bytearray()
    async for chunk in content.iter_any():
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            yield bytes(buffer[start:end + 1])
            start = end + 1
        del buffer[:start]
        if len(buffer) > max_line:
            raise ValueError(f"an SSE line over {max_line} bytes")
    if buffer:
        yield bytes(buffer)


async def _write(request: web.Request, response: web.StreamResponse, data: bytes | None,
                 write_timeout: float | None) -> None:
    """Write ``data`` to the client (None: end the stream). A write that could wait for the client
    (its connection's writing is paused, or this write fills the buffer past ``WRITE_BUFFER_WATCH``:
    aiohttp then waits for the client to read) gets ``write_timeout`` seconds; the others, nearly
    all of them, go out without a timer."""
    write = response.write_eof() if data is None else response.write(data)
    transport, protocol = request.transport, request.protocol
    if (write_timeout is None or transport is None or (
            not protocol.writing_paused
            and transport.get_write_buffer_size() + len(data or b"") < WRITE_BUFFER_WATCH)):
        await write
        return
    try:
        async with asyncio.timeout(write_timeout):
            await write
    except TimeoutError:
        raise ClientTooSlow(f"the client read nothing for {write_timeout:g} s") from None


async def relay_stream(request: web.Request, upstream: EngineAnswer,
                       reader_for: Callable[[CallOutcome], StreamReader], *,
                       on_done: Callable[[CallOutcome], Awaitable[None]] | None = None,
                       write_timeout: float | None = None,
                       ) -> tuple[web.StreamResponse, CallOutcome]:
    """Pass SSE events through as they come; the API's ``StreamReader`` (``reader_for(outcome)``) reads
    usage from them and may hold a line back (a usage chunk the client did not ask for).

    ``on_done`` runs before the stream's last line goes out (``StreamReader.is_last``: ``[DONE]``,
    a Responses stream's final event, Messages' ``message_stop``), so a client that reads its
    session right after a stream sees the call already settled. A stream cut before that line ends
    with the API's error event (``StreamReader.cut_event``).
    """
    response = web.StreamResponse(status=upstream.status, headers=_copy_headers(upstream))
    outcome = _outcome(upstream)
    reader = reader_for(outcome)
    done = False
    try:
        async for line in sse_lines(upstream.content):
            if not response.prepared:  # headers go out with the first event, so an
                await response.prepare(request)  # engine dying before it can still be retried
            passes = reader.passes(line)
            if not done and reader.is_last(line):
                done = True
                if on_done is not None:
                    await on_done(outcome)
            if passes:
                await _write(request, response, line, write_timeout)
    except ClientTooSlow:
        _give_up(request, outcome)
        return response, outcome
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, ValueError) as exc:
        if not response.prepared:
            raise EngineUnreachable(repr(exc), "stream_closed") from exc
        done = False
    finally:
        upstream.release()
    if not response.prepared:
        raise EngineUnreachable("the engine closed the stream before its first event", "stream_closed")
    try:
        if not done:  # cut, or closed without the closing event
            outcome.broken = True
            await _write(request, response, reader.cut_event(), write_timeout)
        await _write(request, response, None, write_timeout)
    except ClientTooSlow:
        _give_up(request, outcome)
    except ConnectionError:  # the client is gone (a failed write to it lands above as a cut): nobody to tell
        outcome.broken = True
    return response, outcome
