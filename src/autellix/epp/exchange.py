"""One HTTP request on one ext_proc stream: Envoy's messages in their order, the picker's answers in theirs.

Envoy opens a stream per request and sends, as its processing mode says, the
request's headers, its body, the upstream's response headers, its body and any
trailers. The exchange reads them in order and answers each as the protocol
asks: the request is held until the picker decides (its whole body first, when
Envoy sends it ``FULL_DUPLEX_STREAMED`` or ``BUFFERED``: the picker reads the
model and the program from it), then released with the routing answer (the
destination header and metadata, the route cache cleared, the body the picker
wrote); the response then passes through the picker chunk by chunk
(``GatewayLeg``), so that it can read the usage and settle the call before the
stream's last event goes out. A refusal before routing is an immediate
response in the API's error shape. Whatever the picker does not read of the
response is passed on unchanged.

Request body modes ``STREAMED``, ``BUFFERED_PARTIAL`` and ``NONE`` release the
headers before the body is seen: such a request is routed by its headers alone
(as a request that is no program's call). The exchange knows nothing of
programs or engines: that is the picker's (``autellix.epp.picker``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from autellix.epp.contract import DESTINATION_HEADER, DESTINATION_NAMESPACE, endpoint_list, served_of
from autellix.epp.messages import (
    BUFFERED,
    FULL_DUPLEX_STREAMED,
    NONE,
    ProcessingRequest,
    ProcessingResponse,
    attributes_of,
    body_answer,
    body_modes,
    header_dict,
    headers_answer,
    immediate,
    metadata_of,
    streamed_answers,
    trailers_answer,
)
from autellix.protocol import APIError

log = logging.getLogger("autellix.epp")

#: Request body modes in which the request waits for the picker until its whole body is in.
HOLDING_MODES = frozenset({BUFFERED, FULL_DUPLEX_STREAMED})
#: What Envoy sends when it does not announce its modes (a data plane before ``protocol_config``): GIE's.
DEFAULT_MODES = (FULL_DUPLEX_STREAMED, FULL_DUPLEX_STREAMED)


@dataclass(frozen=True)
class RequestHead:
    """A request as the picker sees it before deciding."""

    headers: Mapping[str, str]
    #: The gateway's filter metadata (a subset hint, say), by namespace.
    metadata: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return self.headers.get(":path", "").partition("?")[0]

    @property
    def method(self) -> str:
        return self.headers.get(":method", "")


@dataclass(frozen=True)
class Routing:
    """The picker's answer: where the request goes and what it carries there."""

    #: Endpoints (``ip:port``), the chosen one first, then the fallbacks in order.
    endpoints: Sequence[str]
    #: Request headers to set on the way to the engine.
    headers: Mapping[str, str] = field(default_factory=dict)
    #: The body the engine gets; None: the one the client sent.
    body: bytes | None = None


@dataclass(frozen=True)
class ResponseHead:
    """The upstream's answer as the gateway relays it to the picker."""

    status: int
    headers: Mapping[str, str]
    #: The endpoint that served the call, as the gateway says (None: it does not say).
    served: str | None
    #: No body follows.
    ends: bool


class GatewayLeg(Protocol):
    """What the picker does with the gateway for one request: route it, then see its answer through."""

    @property
    def routed(self) -> bool: ...

    async def route(self, routing: Routing) -> None:
        """Release the request to ``routing.endpoints``."""
        ...

    async def reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        """Answer the request in the gateway's place: it goes to no engine."""
        ...

    async def response_head(self, strip: Sequence[str] = ()) -> ResponseHead | None:
        """The answer's status and headers (``strip``: headers the client does not get); None: the
        gateway closed the stream first (the client left)."""
        ...

    def response_chunks(self) -> AsyncIterator[tuple[bytes, bool]]:
        """The answer's body as it comes, ``(bytes, last)``; each chunk must be ``forward``-ed before the
        next is read. Ends early (no ``last``) when the gateway closes the stream; when the gateway sends
        the picker no body, one empty last chunk once the answer is over."""
        ...

    async def forward(self, data: bytes, last: bool) -> None:
        """What the client gets in place of the chunk just read: the same bytes, others, or none
        (held back until a later chunk)."""
        ...


class Decider(Protocol):
    """The picker as the exchange sees it: routes the request through ``leg`` and sees its answer through;
    raises ``APIError`` before routing to refuse it."""

    async def decide(self, head: RequestHead, body: bytes | None, leg: GatewayLeg) -> None: ...


#: An error's answer: (status, body, headers) in the shape of the API the request spoke.
ErrorAnswer = Callable[[APIError, RequestHead], tuple[int, bytes, dict[str, str]]]


class StreamGone(ConnectionError):
    """An answer could not be written: Envoy ended the stream (its client left)."""


class Exchange:
    """One ext_proc stream, from its first message to its last answer (``run``); the ``GatewayLeg`` of it."""

    def __init__(self, requests: AsyncIterator[ProcessingRequest],
                 write: Callable[[ProcessingResponse], Awaitable[None]], decider: Decider,
                 error_answer: ErrorAnswer, *, max_body_bytes: int) -> None:
        self._requests, self._send, self._decider = requests, write, decider
        self._error_answer = error_answer
        #: Largest request body the picker reads (a streamed body is otherwise unbounded): a 413 past it.
        self.max_body_bytes = max_body_bytes
        self._closed = False
        self.request_mode, self.response_mode = DEFAULT_MODES
        self._body: bytes | None = None
        self._request_trailers = False
        self._routed = False
        #: The answer has no (more) body: its headers ended it, or its last chunk came.
        self._response_ended = False
        #: A ``BUFFERED``/``STREAMED`` response body message read and not answered yet.
        self._unanswered: bytes | None = None
        self._response_trailers = False
        #: A response message read ahead (Envoy skipped the response headers).
        self._pending: ProcessingRequest | None = None
        #: The answer's last byte went back to Envoy: what is left is the picker's own bookkeeping.
        self.answered = False

    @property
    def routed(self) -> bool:
        return self._routed

    # ---- the stream ------------------------------------------------------------------------
    async def _write(self, answer: ProcessingResponse) -> None:
        """One answer to Envoy; ``StreamGone`` when the stream ended under it."""
        try:
            await self._send(answer)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the gRPC stack's own error for a write to a stream that is over
            self._closed = True
            raise StreamGone(f"the ext_proc stream ended: {exc!r}") from exc

    async def _next(self) -> ProcessingRequest | None:
        """The next message; None once Envoy closed the stream (or it broke: a reset, a cancelled call)."""
        if self._closed:
            return None
        try:
            message = await anext(self._requests, None)
        except Exception as exc:  # the stream broke: as closed
            log.debug("ext_proc stream ended: %r", exc)
            message = None
        if message is None:
            self._closed = True
        return message

    async def run(self) -> None:
        first = await self._next()
        if first is None:
            return
        self.request_mode, self.response_mode = body_modes(first) or DEFAULT_MODES
        if first.WhichOneof("request") != "request_headers":
            log.warning("ext_proc: the first message is %s, not the request headers; passed through",
                        first.WhichOneof("request"))
            await self._answer_unchanged(first)
            await self._pass_rest()
            return
        has_body = not first.request_headers.end_of_stream
        head = RequestHead(header_dict(first.request_headers), metadata_of(first))
        try:
            if has_body and self.request_mode in HOLDING_MODES:
                if self.request_mode == BUFFERED:  # Envoy buffers the body after this answer, headers held
                    await self._write(headers_answer(request=True))
                if not await self._read_request_body():
                    return  # the client left before its body was in
            await self._decider.decide(head, self._body, self)
        except APIError as exc:
            if self._routed:
                log.warning("ext_proc: %s after the call was routed", exc)
            else:
                status, body, headers = self._error_answer(exc, head)
                await self._write(immediate(status, body, headers, f"autellix_epp_{exc.code or exc.type}"))
                self.answered = True
                return
        if self.answered and not self._routed:
            return  # answered in the gateway's place: Envoy sends nothing more
        await self._pass_rest()

    async def _read_request_body(self) -> bool:
        """The whole request body (``self._body``); False when the stream closed first; 413 past
        ``max_body_bytes``."""
        parts: list[bytes] = []
        size = 0
        while True:
            message = await self._next()
            if message is None:
                return False
            kind = message.WhichOneof("request")
            if kind == "request_body":
                parts.append(message.request_body.body)
                size += len(message.request_body.body)
                if size > self.max_body_bytes:
                    raise APIError(413, f"Request body too large: more than {self.max_body_bytes} bytes.",
                                   code="request_too_large")
                if message.request_body.end_of_stream:
                    break
            elif kind == "request_trailers":  # the body ended without its end flag
                self._request_trailers = True
                break
            else:
                log.warning("ext_proc: %s before the request body ended; ignored", kind)
        self._body = b"".join(parts)
        return True

    # ---- the request -----------------------------------------------------------------------
    async def route(self, routing: Routing) -> None:
        destination = endpoint_list(routing.endpoints)
        headers = {DESTINATION_HEADER: destination, **routing.headers}
        metadata = {DESTINATION_NAMESPACE: {DESTINATION_HEADER: destination}}
        body = routing.body if routing.body is not None else self._body
        if body is not None:
            headers["content-length"] = str(len(body))
        if self._body is not None and self.request_mode == FULL_DUPLEX_STREAMED:
            await self._write(headers_answer(request=True, set_headers=headers, clear_route_cache=True,
                                             metadata=metadata))
            assert body is not None
            for answer in streamed_answers(body, request=True, end=not self._request_trailers):
                await self._write(answer)
        elif self._body is not None:  # BUFFERED: the headers were answered, the body answer carries the mutations
            await self._write(body_answer(request=True, body=routing.body, set_headers=headers,
                                          clear_route_cache=True, metadata=metadata))
        else:
            await self._write(headers_answer(request=True, set_headers=headers, clear_route_cache=True,
                                             metadata=metadata))
        if self._request_trailers:
            await self._write(trailers_answer(request=True))
        self._routed = True

    async def reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        await self._write(immediate(status, body, headers, "autellix_epp_answered"))
        self.answered = True

    # ---- the response ----------------------------------------------------------------------
    async def _next_response(self) -> ProcessingRequest | None:
        """The next message of the response; request messages still coming (a request body Envoy
        streams without holding the headers) are answered unchanged on the way."""
        while True:
            message = await self._next()
            if message is None or message.WhichOneof("request").startswith("response_"):
                return message
            await self._answer_unchanged(message)

    async def response_head(self, strip: Sequence[str] = ()) -> ResponseHead | None:
        message = await self._next_response()
        if message is None:
            return None
        served = served_of(metadata_of(message), attributes_of(message))
        if message.WhichOneof("request") != "response_headers":  # Envoy skips the headers: unknown status
            self._pending = message
            return ResponseHead(0, {}, served, ends=False)
        headers = header_dict(message.response_headers)
        ends = message.response_headers.end_of_stream
        self._response_ended = ends
        await self._write(headers_answer(request=False, remove=[h for h in strip if h.lower() in headers]))
        try:
            status = int(headers.get(":status", "0"))
        except ValueError:
            status = 0
        return ResponseHead(status, headers, served, ends=ends)

    async def response_chunks(self) -> AsyncIterator[tuple[bytes, bool]]:
        if self._response_ended:
            return
        if self.response_mode == NONE:  # no body comes to the picker: the answer is over when Envoy closes
            await self._pass_rest()
            self._response_ended = True
            yield b"", True
            return
        while True:
            message = self._pending if self._pending is not None else await self._next_response()
            self._pending = None
            if message is None:
                return  # the gateway closed the stream: the answer was cut
            kind = message.WhichOneof("request")
            if kind == "response_body":
                data, last = message.response_body.body, message.response_body.end_of_stream
                if self.response_mode != FULL_DUPLEX_STREAMED:
                    self._unanswered = data
                self._response_ended = last
                yield data, last
                if last:
                    return
            elif kind == "response_trailers":
                self._response_trailers = self._response_ended = True
                yield b"", True
                return
            else:
                log.warning("ext_proc: unexpected %s in the response body; ignored", kind)

    async def forward(self, data: bytes, last: bool) -> None:
        if self.response_mode == FULL_DUPLEX_STREAMED:
            if data or (last and not self._response_trailers):
                for answer in streamed_answers(data, request=False, end=last and not self._response_trailers):
                    await self._write(answer)
        elif self._unanswered is not None:
            await self._write(body_answer(request=False, body=None if data == self._unanswered else data))
            self._unanswered = None
        if last and self._response_trailers:
            await self._write(trailers_answer(request=False))
        if last:
            self.answered = True

    # ---- passing on what the picker left ----------------------------------------------------
    async def _answer_unchanged(self, message: ProcessingRequest) -> None:
        """Let a message through as it came (a request routed before its body, a response no one reads)."""
        kind = message.WhichOneof("request")
        request = kind.startswith("request_")
        mode = self.request_mode if request else self.response_mode
        if kind.endswith("_headers"):
            await self._write(headers_answer(request=request))
        elif kind.endswith("_body"):
            body = message.request_body if request else message.response_body
            if mode == FULL_DUPLEX_STREAMED:
                for answer in streamed_answers(body.body, request=request, end=body.end_of_stream):
                    await self._write(answer)
            else:
                await self._write(body_answer(request=request))
        elif kind.endswith("_trailers"):
            await self._write(trailers_answer(request=request))

    async def _pass_rest(self) -> None:
        """Pass on, unchanged, every message the picker did not read, until Envoy closes the stream."""
        if self._pending is not None:
            message, self._pending = self._pending, None
            await self._answer_unchanged(message)
        if self._unanswered is not None:
            await self._write(body_answer(request=False))
            self._unanswered = None
        while (message := await self._next()) is not None:
            await self._answer_unchanged(message)


__all__ = ["DEFAULT_MODES", "HOLDING_MODES", "Decider", "ErrorAnswer", "Exchange", "GatewayLeg", "RequestHead",
           "ResponseHead", "Routing", "StreamGone"]
