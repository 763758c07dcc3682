"""The call leg's HTTP/1.1 client: kept-alive connections to each engine, answers read by aiohttp's C parser.

Every call a gateway relays is one ``POST`` to an engine and its answer, whole or
streamed. aiohttp's ``ClientSession`` does that with a request object, header
multidicts, cookie and trace hooks, a connector with its own waiters, and timer
contexts: about 230 µs of CPU a call on the benchmark's machine, where this
client's own share is about a quarter of it (``docs/bench-gateway.md``). What
remains is what a call needs: a connection per call from a pool of kept-alive
ones per engine address, the request written in one piece, and the answer read
by aiohttp's own HTTP parser (its C build), whose body is aiohttp's
``StreamReader``. Probes, the record requests and everything else go through
aiohttp's client (``autellix.gateway.engine_http``).

Failures, each a type the caller maps to what the call does next:

* ``ConnectFailed``: no connection in ``connect`` seconds, or refused.
* ``Dropped``: the connection closed before any byte of the answer;
  ``reused`` says whether it was a kept-alive one (an engine closing an idle
  connection as the call went out on it) or a new one (the engine's own doing).
* ``HeadTimeout``: no answer headers within ``head`` seconds.
* While a body is read: aiohttp's ``ClientPayloadError`` (cut) or
  ``SocketTimeoutError`` (silent for ``read`` seconds), raised by the reader.
* ``total`` bounds the whole exchange: past it the connection is aborted and
  whatever waits raises ``TimeoutError``.

``EngineAnswer.release`` returns a connection whose answer was read to its end
to the pool; one released earlier (a client that left mid-stream) is closed, so
the engine sees the disconnect and aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

from aiohttp import ClientPayloadError, SocketTimeoutError
from aiohttp.http_parser import HttpResponseParser
from aiohttp.streams import StreamReader
from multidict import CIMultiDictProxy
from yarl import URL

#: Bytes the answer's reader buffers before it stops reading the socket (aiohttp's default read buffer).
READ_LIMIT = 2**16


class ConnectFailed(OSError):
    """No connection to the engine: refused, unreachable, or not within the connect timeout."""


class Dropped(ConnectionError):
    """The connection closed before any byte of the answer came back."""

    def __init__(self, reused: bool) -> None:
        super().__init__("the engine closed the connection before answering"
                         + (" (a kept-alive connection)" if reused else ""))
        self.reused = reused


class HeadTimeout(TimeoutError):
    """The engine sent no answer headers within the head timeout."""


@dataclass(frozen=True)
class Timeouts:
    """One exchange's bounds in seconds (None: none): connecting; the answer's headers; silence between
    two reads of its body; the whole exchange."""

    connect: float | None = None
    head: float | None = None
    read: float | None = None
    total: float | None = None


@dataclass(frozen=True)
class _Origin:
    host: str
    port: int
    tls: bool
    #: The ``Host`` header and the request line's target are written as bytes once per URL.
    host_header: bytes


@lru_cache(maxsize=4096)
def _split(url: str) -> tuple[_Origin, bytes]:
    parsed = URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    host_header = f"{parsed.host_subcomponent}:{port}".encode("idna")
    return _Origin(parsed.host, port, parsed.scheme == "https", host_header), parsed.raw_path_qs.encode()


def _header_lines(headers: Mapping[str, str]) -> bytes:
    out = []
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"a header that would split the request: {name!r}")
        out.append(f"{name}: {value}\r\n")
    return "".join(out).encode("latin-1")


class EngineAnswer:
    """An engine's answer: its status and headers, its body as an aiohttp ``StreamReader``."""

    __slots__ = ("_connection", "content", "headers", "status")

    def __init__(self, status: int, headers: CIMultiDictProxy[str], content: StreamReader,
                 connection: _Connection) -> None:
        self.status, self.headers, self.content = status, headers, content
        self._connection: _Connection | None = connection

    async def read(self) -> bytes:
        """The whole body."""
        return await self.content.read()

    def release(self) -> None:
        """Done with the answer: its connection back to the pool if the answer was read to its end, else
        closed. Idempotent."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.finish()


class _Connection(asyncio.Protocol):
    """One TCP connection to an engine: one exchange at a time."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.exchanges = 0
        self.idle_since = 0.0
        self._parser: HttpResponseParser | None = None
        self._head: asyncio.Future[EngineAnswer] | None = None
        self._payload: StreamReader | None = None
        self._keep = False
        self._answered = False
        self._last_read = 0.0
        self._read_timeout: float | None = None
        self._body_timeout: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._reading_paused = False

    # ---- asyncio's side, and the protocol aiohttp's StreamReader expects of it ---------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    @property
    def connected(self) -> bool:
        return self.transport is not None

    def pause_reading(self) -> None:  # the body's reader is full: stop reading the socket
        self._reading_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self, resume_parser: bool = True) -> None:
        self._reading_paused = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self._answered = True
        self._last_read = self.loop.time()
        parser = self._parser
        if parser is None:  # bytes nobody asked for: the connection is not worth keeping
            self._abort()
            return
        try:
            messages, _, _ = parser.feed_data(data)
        except Exception as exc:  # a malformed answer
            malformed = ClientPayloadError(f"a malformed answer from the engine: {exc!r}")
            self._give_up(malformed, malformed)
            return
        for message, payload in messages:
            head = self._head
            if head is None or head.done():
                continue
            self._payload = payload
            self._keep = not message.should_close
            self._read_timeout = self._body_timeout
            if self._timer is not None:  # armed for the head's bound
                self._timer.cancel()
                self._timer = None
            if self._read_timeout is not None and not payload.is_eof():
                self._timer = self.loop.call_at(self._last_read + self._read_timeout, self._check_read)
            head.set_result(EngineAnswer(message.code, message.headers, payload, self))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.pool.forget(self)
        self._stop_timers()
        head, payload, parser = self._head, self._payload, self._parser
        if head is not None and not head.done():
            head.set_exception(Dropped(self.exchanges > 1) if not self._answered
                               else ClientPayloadError("the engine closed the connection within the answer's headers"))
        elif payload is not None and not payload.is_eof():
            if parser is not None:
                with contextlib.suppress(Exception):  # a malformed rest: the reader raises below
                    parser.feed_eof()  # an answer whose body ends with the connection ends here
            if not payload.is_eof():
                payload.set_exception(ClientPayloadError("the engine closed the connection within the answer"))
        self._parser = None

    # ---- the exchange ----------------------------------------------------------------------
    def send(self, request: bytes, timeouts: Timeouts) -> asyncio.Future[EngineAnswer]:
        assert self.transport is not None
        self.exchanges += 1
        self._answered = self._keep = False
        self._payload = None
        self._parser = HttpResponseParser(self, self.loop, READ_LIMIT, payload_exception=ClientPayloadError,
                                          read_until_eof=True, auto_decompress=False)
        self._head = head = self.loop.create_future()
        self._body_timeout = timeouts.read
        self._read_timeout = timeouts.head
        self._last_read = self.loop.time()
        if timeouts.head is not None:
            self._timer = self.loop.call_at(self._last_read + timeouts.head, self._check_read)
        if timeouts.total is not None:
            self._deadline = self.loop.call_at(self._last_read + timeouts.total, self._expire)
        self.transport.write(request)
        return head

    def finish(self) -> None:
        """The exchange is over: back to the pool if its answer was read to its end, else closed."""
        self._stop_timers()
        payload, self._head, self._payload = self._payload, None, None
        transport = self.transport
        if transport is None:
            return
        if (self._keep and payload is not None and payload.is_eof() and payload.exception() is None
                and not transport.is_closing()):
            self._parser = None
            self.pool.put(self)
        else:
            transport.close()

    # ---- timers ----------------------------------------------------------------------------
    def _check_read(self) -> None:
        """The read timer: fires at the last read plus the timeout, or looks again later."""
        self._timer = None
        timeout = self._read_timeout
        if timeout is None or self.transport is None:
            return
        due = self._last_read + timeout
        if self.loop.time() < due:
            self._timer = self.loop.call_at(due, self._check_read)
            return
        self._give_up(HeadTimeout(f"no answer headers within {timeout:g} s"),
                      SocketTimeoutError(f"the engine sent nothing for {timeout:g} s"))

    def _expire(self) -> None:
        self._deadline = None
        ran_out = TimeoutError("the attempt's time ran out")
        self._give_up(ran_out, ran_out)

    def _give_up(self, before_head: BaseException, in_body: BaseException) -> None:
        """End the exchange with an error: the wait for the headers gets ``before_head``, or the body's
        reader ``in_body``; the connection is aborted."""
        head, payload = self._head, self._payload
        if head is not None and not head.done():
            head.set_exception(before_head)
        elif payload is not None and not payload.is_eof():
            payload.set_exception(in_body)
        self._abort()

    def _stop_timers(self) -> None:
        for handle in (self._timer, self._deadline):
            if handle is not None:
                handle.cancel()
        self._timer = self._deadline = None

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class _Pool:
    """Idle kept-alive connections to one engine address, the most recently used first."""

    def __init__(self, origin: _Origin, keepalive: float) -> None:
        self.origin, self.keepalive = origin, keepalive
        self.idle: list[_Connection] = []
        self.open: set[_Connection] = set()

    def take(self, now: float) -> _Connection | None:
        idle = self.idle
        while idle:
            connection = idle.pop()
            transport = connection.transport
            if transport is not None and not transport.is_closing() and now - connection.idle_since < self.keepalive:
                return connection
            if transport is not None:
                transport.close()  # idle too long: the engine may be closing it right now
        return None

    def put(self, connection: _Connection) -> None:
        connection.idle_since = connection.loop.time()
        self.idle.append(connection)

    def forget(self, connection: _Connection) -> None:
        self.open.discard(connection)
        if connection in self.idle:
            self.idle.remove(connection)


class EngineCalls:
    """``post`` sends one call to an engine on a kept-alive connection; ``close`` closes them all."""

    def __init__(self, *, headers: Mapping[str, str] | None = None, keepalive: float = 4.0) -> None:
        #: Sent on every call (the engine token).
        self._common = _header_lines(headers or {})
        self.keepalive = keepalive
        self._pools: dict[_Origin, _Pool] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(self, url: str, body: bytes, headers: Mapping[str, str],
                   timeouts: Timeouts = Timeouts()) -> EngineAnswer:
        """Send ``body`` to ``url``; returns once the answer's headers are in (see the module for failures)."""
        origin, target = _split(url)
        pool = self._pools.get(origin)
        if pool is None:
            pool = self._pools[origin] = _Pool(origin, self.keepalive)
        loop = asyncio.get_running_loop()
        connection = pool.take(loop.time())
        if connection is None:
            connection = await self._connect(pool, timeouts.connect)
        request = b"".join((b"POST ", target, b" HTTP/1.1\r\nHost: ", origin.host_header,
                            b"\r\nContent-Length: ", str(len(body)).encode(), b"\r\n", self._common,
                            _header_lines(headers), b"\r\n", body))
        head = connection.send(request, timeouts)
        try:
            return await head
        except BaseException:
            connection.finish()
            raise

    async def _connect(self, pool: _Pool, timeout: float | None) -> _Connection:
        origin = pool.origin
        loop = asyncio.get_running_loop()
        tls = None
        if origin.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(pool), origin.host, origin.port, ssl=tls), timeout)
        except TimeoutError:
            raise ConnectFailed(f"no connection to {origin.host}:{origin.port} within {timeout:g} s") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {origin.host}:{origin.port}: {exc}") from exc
        pool.open.add(connection)
        return connection

    async def close(self) -> None:
        for pool in self._pools.values():
            for connection in [*pool.open]:
                if connection.transport is not None:
                    connection.transport.close()
            pool.idle.clear()
        self._pools.clear()
        await asyncio.sleep(0)  # the transports' close callbacks run


__all__ = ["READ_LIMIT", "ConnectFailed", "Dropped", "EngineAnswer", "EngineCalls", "HeadTimeout", "Timeouts"]
