"""The call APIs the gateway serves, one dialect each: checks, prompt text, usage, stream end, error shape.

A dialect is everything that differs between OpenAI's Chat Completions and
Completions, OpenAI's Responses and Anthropic's Messages as far as the gateway
reads them; what a program is, how it ranks and where its call runs is the
same for all of them (``autellix.control``). Each dialect:

* ``check``: the body, checked before any state changes (``APIError`` naming
  the parameter);
* ``prompt_text``: the text the model reads, for Algorithm 2's prompt length;
* ``read_usage``: a whole answer's token counts;
* ``stream``: a reader of one streamed answer's lines: it reads the usage, says
  which line ends the stream (the call is settled before that line goes out)
  and what to send when the engine's stream is cut;
* ``shape``: its errors' JSON (OpenAI's, or Anthropic's for Messages).

Chat and Completions ask the engine for a usage chunk on streams
(``asks_stream_usage``) and drop it again when the client did not ask for it;
Responses and Messages streams carry usage in their last events anyway.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import orjson

from autellix.backends import CallOutcome, EngineBackend
from autellix.gateway.errors import (
    ErrorShape,
    anthropic_error_shape,
    anthropic_shape,
    openai_error_shape,
    openai_shape,
)
from autellix.gateway.tokens import prompt_text
from autellix.gateway.validation import check_body, check_messages_body, check_responses_body
from autellix.protocol import CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, MESSAGES_PATH, RESPONSES_PATH


class StreamReader(ABC):
    """Reads one streamed answer as its lines pass through (each line with its newline)."""

    @abstractmethod
    def passes(self, line: bytes) -> bool:
        """Read what the line says (usage); False: the line is not sent to the client."""

    @abstractmethod
    def is_last(self, line: bytes) -> bool:
        """Whether this line ends the stream: the call is settled before it goes out."""

    @abstractmethod
    def cut_event(self) -> bytes:
        """What the client gets when the engine's stream breaks before its last line."""


class Dialect(ABC):
    """One call API: its engine route, its checks, its usage, its stream and its errors."""

    #: The route's name in metrics and logs.
    name: str
    #: Where the engine serves it.
    engine_path: str
    #: Its errors' JSON.
    shape: ErrorShape = staticmethod(openai_shape)
    #: Streams need the engine asked for a usage chunk (``stream_options.include_usage``).
    asks_stream_usage: bool = False

    @abstractmethod
    def check(self, body: Any, *, max_n: int, max_tokens: int) -> dict[str, Any]:
        """The body, checked; raises ``APIError`` (400) before anything changes."""

    def prompt_text(self, body: Mapping[str, Any]) -> str:
        return prompt_text(body)

    def offers_tools(self, body: Mapping[str, Any]) -> bool:
        """Whether the call offers the model tools it may call (``tools``, and a ``tool_choice`` that is
        not none: OpenAI's string or Anthropic's ``{"type": ...}``): its program may come back with a
        tool's result."""
        choice = body.get("tool_choice")
        if isinstance(choice, Mapping):
            choice = choice.get("type")
        return bool(body.get("tools")) and choice != "none"

    @abstractmethod
    def read_usage(self, answer: Mapping[str, Any], outcome: CallOutcome, backend: EngineBackend) -> None:
        """Fill ``outcome``'s token counts (and what the engine adds) from a whole answer."""

    def engine_error(self, raw: bytes, status: int) -> bytes:
        """An engine's error answer in this API's shape (vLLM's own are close to OpenAI's)."""
        return openai_error_shape(raw)

    @abstractmethod
    def stream(self, outcome: CallOutcome, backend: EngineBackend, body: Mapping[str, Any]) -> StreamReader:
        """A reader of one streamed answer to ``body``."""


# ---- OpenAI's Chat Completions and Completions --------------------------------------------
STREAM_CUT = orjson.dumps({"error": {
    "message": "The engine's stream was cut before the call finished; the output above is incomplete.",
    "type": "upstream_error", "code": "stream_interrupted", "param": None}})


class _UsageChunkReader(StreamReader):
    """Chat and Completions streams: ``data: {...}`` chunks, the usage in a chunk of its own (empty
    ``choices``) which is dropped, with the blank line after it, when the client did not ask for usage;
    ``data: [DONE]`` ends the stream."""

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

    def is_last(self, line: bytes) -> bool:
        return line.startswith(b"data: [DONE]")

    def cut_event(self) -> bytes:
        return b"data: " + STREAM_CUT + b"\n\n"


class _OpenAIChatFamily(Dialect):
    asks_stream_usage = True
    route: str

    def check(self, body: Any, *, max_n: int, max_tokens: int) -> dict[str, Any]:
        return check_body(body, self.route, max_n=max_n, max_tokens=max_tokens)

    def read_usage(self, answer: Mapping[str, Any], outcome: CallOutcome, backend: EngineBackend) -> None:
        backend.read_usage(answer, outcome)

    def stream(self, outcome: CallOutcome, backend: EngineBackend, body: Mapping[str, Any]) -> StreamReader:
        wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return _UsageChunkReader(backend, outcome, wants_usage)


class Chat(_OpenAIChatFamily):
    name, route, engine_path = "chat", "chat", CHAT_COMPLETIONS_PATH


class Completion(_OpenAIChatFamily):
    name, route, engine_path = "completion", "completion", COMPLETIONS_PATH


# ---- events with names: Responses and Messages streams ----------------------------------
class _NamedEventReader(StreamReader):
    """``event: NAME`` / ``data: {...}`` pairs: the data of the events named in ``reads`` is parsed
    (usage); the data line of an event named in ``last`` ends the stream."""

    reads: frozenset[bytes] = frozenset()
    last: frozenset[bytes] = frozenset()

    def __init__(self, outcome: CallOutcome) -> None:
        self.outcome = outcome
        self.event = b""

    def passes(self, line: bytes) -> bool:
        if line.startswith(b"event:"):
            self.event = line[6:].strip()
        elif line.startswith(b"data:") and self.event in self.reads:
            try:
                data = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                return True
            if isinstance(data, dict):
                self.read(data)
        return True

    def read(self, data: dict[str, Any]) -> None:
        """What an event named in ``reads`` says."""

    def is_last(self, line: bytes) -> bool:
        return self.event in self.last and line.startswith(b"data:")


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


# ---- OpenAI's Responses --------------------------------------------------------------------
#: Events that end a Responses stream, each carrying the response with its usage.
RESPONSES_LAST_EVENTS = (b"response.completed", b"response.failed", b"response.incomplete")


def responses_usage(response: Mapping[str, Any], outcome: CallOutcome, backend: EngineBackend) -> None:
    """A response's token counts, and the engine's timing of it (vLLM adds its per-request metrics)."""
    usage = response.get("usage")
    if isinstance(usage, dict):
        outcome.prompt_tokens = _count(usage.get("input_tokens"))
        outcome.completion_tokens = _count(usage.get("output_tokens"))
    backend.read_timing(response, outcome)


class _ResponsesReader(_NamedEventReader):
    reads = frozenset({*RESPONSES_LAST_EVENTS, b"response.created"})
    last = frozenset(RESPONSES_LAST_EVENTS)

    def __init__(self, outcome: CallOutcome, backend: EngineBackend) -> None:
        super().__init__(outcome)
        self.backend = backend
        self.sequence = 0

    def passes(self, line: bytes) -> bool:
        if line.startswith(b"data:") and b'"sequence_number":' in line:
            with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
                self.sequence = max(self.sequence, int(orjson.loads(line[5:]).get("sequence_number", 0)))
        return super().passes(line)

    def read(self, data: dict[str, Any]) -> None:
        response = data.get("response")
        if isinstance(response, dict):
            responses_usage(response, self.outcome, self.backend)

    def cut_event(self) -> bytes:
        event = {"type": "error", "code": "stream_interrupted", "param": None, "sequence_number": self.sequence + 1,
                 "message": "The engine's stream was cut before the response finished; the output above is "
                            "incomplete."}
        return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"


class Responses(Dialect):
    name, engine_path = "responses", RESPONSES_PATH

    def check(self, body: Any, *, max_n: int, max_tokens: int) -> dict[str, Any]:
        return check_responses_body(body, max_tokens=max_tokens)

    def prompt_text(self, body: Mapping[str, Any]) -> str:
        parts = [body["instructions"]] if isinstance(body.get("instructions"), str) else []
        source = body.get("input")
        if isinstance(source, str):
            parts.append(source)
        elif isinstance(source, list):
            for item in source:
                content = item.get("content") if isinstance(item, dict) else None
                parts.extend(_texts(content))
        return "\n".join(parts)

    def read_usage(self, answer: Mapping[str, Any], outcome: CallOutcome, backend: EngineBackend) -> None:
        responses_usage(answer, outcome, backend)

    def stream(self, outcome: CallOutcome, backend: EngineBackend, body: Mapping[str, Any]) -> StreamReader:
        return _ResponsesReader(outcome, backend)


# ---- Anthropic's Messages ------------------------------------------------------------------
class _MessagesReader(_NamedEventReader):
    reads = frozenset({b"message_start", b"message_delta"})
    last = frozenset({b"message_stop"})

    def read(self, data: dict[str, Any]) -> None:
        message = data.get("message")
        usage = (message if isinstance(message, dict) else data).get("usage")
        if isinstance(usage, dict):
            if "input_tokens" in usage:
                self.outcome.prompt_tokens = _count(usage.get("input_tokens"))
            if "output_tokens" in usage:
                self.outcome.completion_tokens = _count(usage.get("output_tokens"))

    def cut_event(self) -> bytes:
        event = {"type": "error", "error": {"type": "api_error", "message": "The engine's stream was cut before "
                                            "the message finished; the output above is incomplete."}}
        return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"


class Messages(Dialect):
    name, engine_path = "messages", MESSAGES_PATH
    shape = staticmethod(anthropic_shape)

    def engine_error(self, raw: bytes, status: int) -> bytes:
        return anthropic_error_shape(raw, status)

    def check(self, body: Any, *, max_n: int, max_tokens: int) -> dict[str, Any]:
        return check_messages_body(body, max_tokens=max_tokens)

    def prompt_text(self, body: Mapping[str, Any]) -> str:
        system = body.get("system")
        parts = [system] if isinstance(system, str) else _texts(system)
        for message in body.get("messages") or ():
            if isinstance(message, dict):
                parts.extend(_texts(message.get("content")))
        return "\n".join(parts)

    def read_usage(self, answer: Mapping[str, Any], outcome: CallOutcome, backend: EngineBackend) -> None:
        usage = answer.get("usage")
        if isinstance(usage, dict):
            outcome.prompt_tokens = _count(usage.get("input_tokens"))
            outcome.completion_tokens = _count(usage.get("output_tokens"))

    def stream(self, outcome: CallOutcome, backend: EngineBackend, body: Mapping[str, Any]) -> StreamReader:
        return _MessagesReader(outcome)


def _texts(content: Any) -> list[str]:
    """The texts of a content field: a string, or an array of parts each with a string ``text``."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return []


CHAT, COMPLETION, RESPONSES, MESSAGES = Chat(), Completion(), Responses(), Messages()


__all__ = ["CHAT", "COMPLETION", "MESSAGES", "RESPONSES", "RESPONSES_LAST_EVENTS", "STREAM_CUT", "Chat", "Completion",
           "Dialect", "Messages", "Responses", "StreamReader", "responses_usage"]
