"""The execution-time channel: from the scheduler plugin to the gateway.

The gateway charges a program the model execution time of each finished call.
vLLM's own per-request timing (the response's ``metrics``) counts from the
first schedule to the last token, so time a call spends preempted counts as
execution; under a preemptive scheduler that is exactly the error to avoid.
The plugin measures it where it happens: the sum of the engine steps each call
ran in. The scheduler lives in vLLM's EngineCore process, the HTTP server in
another, so the record crosses over a local ZeroMQ socket (vLLM's own IPC
library) to a small ASGI middleware in the API server, which serves it on the
engine's own port:

Paths and the record are part of the wire contract (``autellix.protocol``):

* ``GET /autellix/v1/calls/{call_id}?wait=S``: the record of a finished call
  (read once: it is removed), waiting up to ``S`` seconds for it to arrive; 404
  when there is none.
  A call sent with the header ``X-Autellix-Call`` (the gateway's call id) whose
  record is in when its answer's headers go out gets it in the answer instead,
  as the header ``X-Autellix-Record``, and is not kept for the GET (nearly every
  whole call; ``autellix.protocol.RECORD_HEADER``).
* ``GET /autellix/v1/info``: the plugin's scheduler and parameters, 404 while
  no Autellix scheduler runs behind this server; its ``kv_events`` says where
  the engine publishes its KV cache events (``autellix.engine.kv_events``).
* ``GET /autellix/v1/tokenizer``: the files the engine tokenizes with, for the
  gateway's KV event index (404 when the engine does not describe them).
* ``DELETE /autellix/v1/programs/{program_id}``: the program's session ended
  (the gateway says so): the scheduler drops the prefix it holds for it at its
  next step (202). It crosses over on a second socket, the other way
  (``ends_addr``).
* ``GET /autellix/v1/programs/{program_id}`` (the id percent-encoded): this
  engine's tally of a program (``ProgramService``: the ``service_s`` of its
  calls that finished here, how many, since when), 404 when none did. Kept from
  the same records, whether or not the gateway has read them, for at most
  ``MAX_PROGRAMS`` programs (the least recently served go first). A gateway
  replica that takes a program over from the shared store reads it from every
  engine to repair what the store lost with a dead replica (``docs/cluster.md``).

Engines trust only the gateway: with ``AUTELLIX_ENGINE_TOKEN`` set (``autellix
up`` generates one, the chart keeps one in a Secret), every route but the
probes' (``OPEN_PATHS``: health, metrics, version) needs the header
``X-Autellix-Engine-Token`` with that token, vLLM's OpenAI routes included:
whoever reaches an engine without it can neither skip the gateway (and send
``autellix_service`` under another program's id) nor read or consume feedback
records. Without the variable the engine answers everyone, as stock vLLM does,
and says so in its log.

The engine is started with ``--middleware autellix.engine.feedback.FeedbackMiddleware``
and both processes find the socket through ``AUTELLIX_FEEDBACK_ADDR``
(``autellix engine`` sets both). One API server process per engine: with
``--api-server-count`` above 1 only one of them could bind the socket.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any

import orjson

from autellix.engine.kv_events import read_tokenizer
from autellix.protocol import (
    CALL_HEADER,
    ENGINE_TOKEN_ENV,
    ENGINE_TOKEN_HEADER,
    FEEDBACK_CALLS_PATH,
    FEEDBACK_INFO_PATH,
    FEEDBACK_MAX_WAIT_S,
    FEEDBACK_PREFIX,
    FEEDBACK_PROGRAMS_PATH,
    FEEDBACK_TOKENIZER_PATH,
    FEEDBACK_WAIT_PARAM,
    INFO_KV_EVENTS,
    RECORD_HEADER,
    ProgramService,
    record_header_value,
)

log = logging.getLogger("autellix.engine.feedback")

ENV_ADDR = "AUTELLIX_FEEDBACK_ADDR"
#: Paths anyone may read: the kubelet's and the load balancers' probes, Prometheus,
#: the preStop drain (``autellix engine drain-wait``). They reveal load, not calls.
OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/version", "/load"})
_TOKEN_HEADER = ENGINE_TOKEN_HEADER.lower().encode()
_CALL_HEADER = CALL_HEADER.lower().encode()
_RECORD_HEADER = RECORD_HEADER.lower().encode()
#: Unread records kept; a gateway that never asks cannot make the server grow.
MAX_RECORDS = 100_000
#: Programs whose tally is kept (about 200 bytes each), the least recently served dropped first.
MAX_PROGRAMS = 100_000


def feedback_addr_for(port: int, directory: str | None = None) -> str:
    """The socket of the engine serving on ``port``: one per engine on a host."""
    base = directory or os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return f"ipc://{base}/autellix-feedback-{port}.sock"


class FeedbackPublisher:
    """EngineCore side: sends records, never blocks the scheduler."""

    def __init__(self, addr: str) -> None:
        import zmq

        self._zmq = zmq
        self._socket = zmq.Context.instance().socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, MAX_RECORDS)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(addr)  # queues until the API server binds
        self.dropped = 0

    @classmethod
    def from_env(cls) -> FeedbackPublisher | None:
        addr = os.environ.get(ENV_ADDR)
        return cls(addr) if addr else None

    def publish(self, kind: str, body: dict[str, Any]) -> None:
        try:
            self._socket.send(orjson.dumps({"kind": kind, **body}), flags=self._zmq.NOBLOCK)
        except self._zmq.Again:
            self.dropped += 1  # the server is gone or far behind: the gateway falls back


def ends_addr(addr: str) -> str:
    """Where the scheduler hears of ended sessions: the socket beside the records' (``addr``, an ``ipc://`` path)."""
    return addr + ".ends"


class ProgramEnds:
    """EngineCore side: the programs whose sessions ended, as the API server passes them on; read without
    blocking at the scheduler's steps."""

    def __init__(self, addr: str) -> None:
        import zmq

        self._zmq = zmq
        self._socket = zmq.Context.instance().socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(ends_addr(addr))

    @classmethod
    def from_env(cls) -> ProgramEnds | None:
        addr = os.environ.get(ENV_ADDR)
        return cls(addr) if addr else None

    def take(self) -> list[str]:
        """The program ids that came in since the last look (a flag read when none did: no exception per step)."""
        ended = []
        while self._socket.get(self._zmq.EVENTS) & self._zmq.POLLIN:
            ended.append(self._socket.recv().decode())
        return ended

    def close(self) -> None:
        self._socket.close()


class FeedbackStore:
    """API-server side: receives records on a thread, answers lookups, passes sessions' ends on."""

    def __init__(self, addr: str) -> None:
        import zmq

        self._zmq = zmq
        self._ends = zmq.Context.instance().socket(zmq.PUSH)
        self._ends.setsockopt(zmq.SNDHWM, MAX_PROGRAMS)
        self._ends.setsockopt(zmq.LINGER, 0)
        self._ends.connect(ends_addr(addr))  # queues until the scheduler binds
        self.info: dict[str, Any] | None = None
        self._records: OrderedDict[str, dict[str, Any]] = OrderedDict()
        #: Per program: [service_s, calls, since] of its calls that finished here.
        self._programs: OrderedDict[str, list[float]] = OrderedDict()
        self._lock = threading.Lock()
        self._socket = zmq.Context.instance().socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(addr)
        threading.Thread(target=self._receive, name="autellix-feedback", daemon=True).start()

    def _receive(self) -> None:
        while True:
            try:
                message = orjson.loads(self._socket.recv())
            except Exception:  # a closed context at exit, or a malformed record
                log.debug("feedback receive stopped", exc_info=True)
                if self._socket.closed:
                    return
                continue
            kind = message.pop("kind", None)
            if kind == "hello":
                self.info = message
            elif kind == "call" and isinstance(message.get("call"), str):
                with self._lock:
                    self._records[message["call"]] = message
                    while len(self._records) > MAX_RECORDS:
                        self._records.popitem(last=False)
                    self._count(message)

    def _count(self, record: dict[str, Any]) -> None:
        """Add a finished call to its program's tally (under the lock). Only finished calls: the
        gateway charges every one of them, so the tally stays at or below what it charged."""
        program, service = record.get("program"), record.get("service_s")
        if record.get("finished") is not True or not isinstance(program, str) or isinstance(service, bool) \
                or not isinstance(service, int | float) or not service >= 0:
            return
        tally = self._programs.get(program)
        if tally is None:
            self._programs[program] = [float(service), 1, time.time()]
            while len(self._programs) > MAX_PROGRAMS:
                self._programs.popitem(last=False)
        else:
            tally[0] += service
            tally[1] += 1
            self._programs.move_to_end(program)

    def program(self, program_id: str) -> ProgramService | None:
        """This engine's tally of a program; None if none of its calls finished here."""
        with self._lock:
            tally = self._programs.get(program_id)
            if tally is None:
                return None
            service, calls, since = tally
        return ProgramService(program=program_id, service_s=service, calls=int(calls), since=since)

    def end(self, program_id: str) -> bool:
        """Pass a program's end on to the scheduler; False when its queue is full (the scheduler is gone)."""
        try:
            self._ends.send(program_id.encode(), flags=self._zmq.NOBLOCK)
        except self._zmq.Again:
            return False
        return True

    def take(self, call_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self._records.pop(call_id, None)

    async def wait_for(self, call_id: str, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while (record := self.take(call_id)) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        return record


class FeedbackMiddleware:
    """ASGI middleware for vLLM's API server (``--middleware``)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        addr = os.environ.get(ENV_ADDR)
        self.store = FeedbackStore(addr) if addr else None
        if self.store is None:
            log.warning("%s is not set: the Autellix feedback endpoints answer 404", ENV_ADDR)
        token = os.environ.get(ENGINE_TOKEN_ENV, "")
        self.token = token.encode() if token else None
        if self.token is None:
            log.warning("%s is not set: this engine answers anyone who reaches it", ENGINE_TOKEN_ENV)

    def trusted(self, scope: dict[str, Any]) -> bool:
        """The request carries the engine token (or none is configured)."""
        if self.token is None:
            return True
        presented = next((value for name, value in scope.get("headers", ()) if name == _TOKEN_HEADER), b"")
        return hmac.compare_digest(presented, self.token)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if scope["path"] not in OPEN_PATHS and not self.trusted(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await _respond(send, 401, {"error": {
                "message": f"This engine takes calls only from the Autellix gateway ({ENGINE_TOKEN_HEADER}).",
                "type": "authentication_error", "code": "invalid_engine_token"}})
            return
        if scope["type"] != "http" or not scope["path"].startswith(FEEDBACK_PREFIX):
            call_id = _header(scope, _CALL_HEADER) if self.store is not None else None
            await self.app(scope, receive, send if call_id is None else self._with_record(send, call_id))
            return
        status, body = await self._answer(scope)
        await _respond(send, status, body)

    def _with_record(self, send: Any, call_id: str) -> Any:
        """``send``, adding the call's record to a 200 answer's headers if it is in by then."""
        store = self.store
        assert store is not None

        async def send_with_record(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message.get("status") == 200:
                record = store.take(call_id)
                if record is not None:
                    value = record_header_value(record).encode()
                    message = {**message, "headers": [*message.get("headers", ()), (_RECORD_HEADER, value)]}
            await send(message)

        return send_with_record

    async def _answer(self, scope: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        path = scope["path"]
        if scope["method"] == "DELETE" and path.startswith(FEEDBACK_PROGRAMS_PATH) and self.store is not None:
            program = path.removeprefix(FEEDBACK_PROGRAMS_PATH)
            if not program:
                return 404, _error(404, "No program named.", "not_found")
            if not self.store.end(program):
                return 503, _error(503, "The scheduler does not take sessions' ends now.", "unavailable")
            return 202, {"program": program, "ended": True}
        if scope["method"] != "GET":
            return 405, _error(405, "Only GET (and DELETE of a program) is allowed here.", "method_not_allowed")
        if path == FEEDBACK_INFO_PATH:
            if self.store is None or self.store.info is None:
                return 404, _error(404, "No Autellix scheduler runs behind this server.", "not_found")
            return 200, self.store.info
        if path == FEEDBACK_TOKENIZER_PATH:
            info = self.store.info if self.store is not None else None
            files = await asyncio.to_thread(read_tokenizer, (info or {}).get(INFO_KV_EVENTS))
            if files is None:
                return 404, _error(404, "This engine does not describe its tokenizer.", "not_found")
            return 200, files
        if path.startswith(FEEDBACK_CALLS_PATH) and self.store is not None:
            record = await self.store.wait_for(path.removeprefix(FEEDBACK_CALLS_PATH), _wait(scope))
            if record is not None:
                return 200, record
            return 404, _error(404, "No record for this call.", "not_found")
        if path.startswith(FEEDBACK_PROGRAMS_PATH) and self.store is not None:
            tally = self.store.program(path.removeprefix(FEEDBACK_PROGRAMS_PATH))
            if tally is not None:
                return 200, tally.to_dict()
            return 404, _error(404, "No call of this program finished on this engine.", "not_found")
        return 404, _error(404, f"Unknown path {scope['path']}.", "not_found")


async def _respond(send: Any, status: int, body: dict[str, Any]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": orjson.dumps(body)})


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    value = next((v for n, v in scope.get("headers", ()) if n == name), None)
    return value.decode("latin-1") if value else None


def _wait(scope: dict[str, Any]) -> float:
    for part in scope.get("query_string", b"").decode().split("&"):
        name, _, value = part.partition("=")
        if name == FEEDBACK_WAIT_PARAM:
            try:
                return min(max(float(value), 0.0), FEEDBACK_MAX_WAIT_S)
            except ValueError:
                return 0.0
    return 0.0


def _error(status: int, message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                      "code": code}}
