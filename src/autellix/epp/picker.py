"""The endpoint picker's decision for one request, and the call's accounting when its answer passes back.

A request to a call route (OpenAI's Chat Completions and Completions, Anthropic's
Messages) is a program's call, run as the aiohttp gateway runs one, on the same
parts (``autellix.gateway.compose.build_gateway``): in order, each step raising
``APIError`` before it changes anything, the tenant's key (401), the body's
checks (400), an engine serving the model (503, 404), the gateway's subset hint
(503), the tenant's slot (429: shed), the program by the call's headers (session
and agent headers, GIE's fairness id: ``autellix.control.sessions``); then the
request controller routes it (Algorithm 2, pins) and annotates the body (the
program's priority and ``vllm_xargs``, as the engine plugin reads them). Its
attempt is the routing answer: the chosen engine and ``fallbacks`` more by load,
the annotated body, the call id that asks the engine for its record. The answer
then passes through here: the engine's record from its headers, the usage from
its body (a stream's usage chunk is dropped again when the client did not ask
for it), and the call is settled before the stream's last event goes out. When
the gateway served the call on a fallback, the call moves there in the process
table (as a retry moves it in the gateway) and the chosen engine counts as failed.

The gateway's own routes (the session routes, ``GET /ready``) are answered
here, in the gateway's place (``autellix.epp.own_routes``). Any other request
(``GET /v1/models``, say) goes to the least-loaded engine, unchanged and unaccounted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping
from typing import Any

import orjson

from autellix.backends import CallOutcome
from autellix.control import Attempt, CallSpec
from autellix.control.size_hints import declared_tokens
from autellix.core import NoEngine
from autellix.core.balancers.base import least_used_engine
from autellix.epp import own_routes
from autellix.epp.config import PickerConfig
from autellix.epp.contract import NotAnEndpoint, endpoint_of, subset_of
from autellix.epp.exchange import GatewayLeg, RequestHead, ResponseHead, Routing
from autellix.epp.metrics import PickerMetrics
from autellix.epp.own_routes import is_own_route
from autellix.gateway.dialects import CHAT, COMPLETION, MESSAGES, Dialect
from autellix.gateway.errors import UNAVAILABLE_RETRY_AFTER, bad_request, unavailable
from autellix.gateway.parts import Gateway
from autellix.gateway.routes import shape_of
from autellix.protocol import (
    CALL_HEADER,
    CHAT_COMPLETIONS_PATH,
    COMPLETIONS_PATH,
    ENGINE_TOKEN_ENV,
    ENGINE_TOKEN_HEADER,
    MESSAGES_PATH,
    RECORD_HEADER,
    APIError,
    CallRecord,
)

#: The routes whose requests are programs' calls, and how each reads.
CALL_DIALECTS: dict[str, Dialect] = {CHAT_COMPLETIONS_PATH: CHAT, COMPLETIONS_PATH: COMPLETION, MESSAGES_PATH: MESSAGES}


def tenant_key(headers: Mapping[str, str]) -> str | None:
    """The key a caller presents: ``Authorization: Bearer KEY`` or ``x-api-key: KEY``."""
    scheme, _, key = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        return key.strip()
    return headers.get("x-api-key", "").strip() or None


def record_of(headers: Mapping[str, str]) -> CallRecord | None:
    """The engine's record of the call in its answer's headers (``RECORD_HEADER``); None if absent or malformed."""
    value = headers.get(RECORD_HEADER.lower())
    if not value:
        return None
    with contextlib.suppress(orjson.JSONDecodeError, TypeError, ValueError):
        data = orjson.loads(value)
        return CallRecord.from_dict(data) if isinstance(data, dict) else None
    return None


def error_answer(exc: APIError, head: RequestHead) -> tuple[int, bytes, dict[str, str]]:
    """A refusal as the gateway answers it: the API's error shape, ``Retry-After`` on 429 and 503."""
    headers = {"content-type": "application/json"}
    if exc.retry_after is not None:
        headers["retry-after"] = str(exc.retry_after)
    elif exc.status in (429, 503):
        headers["retry-after"] = UNAVAILABLE_RETRY_AFTER
    return exc.status, orjson.dumps(shape_of(head.path)(exc)), headers


class _Lines:
    """Complete lines of a byte stream, the last partial one kept for the next chunk."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, data: bytes, last: bool) -> list[bytes]:
        data = self._rest + data
        cut = data.rfind(b"\n") + 1
        lines, self._rest = data[:cut].splitlines(keepends=True), data[cut:]
        if last and self._rest:
            lines.append(self._rest)
            self._rest = b""
        return lines


class Picker:
    """Decides where each request goes (``decide``: the exchange's ``Decider``) on one gateway's parts."""

    def __init__(self, gateway: Gateway, config: PickerConfig, metrics: PickerMetrics, ready: asyncio.Event) -> None:
        self.gateway, self.config, self.metrics = gateway, config, metrics
        #: Set while the picker takes calls (the server's life: from its start until SIGTERM).
        self.ready = ready
        token = gateway.config.engine_token or os.environ.get(ENGINE_TOKEN_ENV)  # as the gateway's engine client
        self.engine_headers = {ENGINE_TOKEN_HEADER: token} if token else {}

    # ---- endpoints ------------------------------------------------------------------------
    def _endpoints(self) -> dict[str, str]:
        """The pool's engines by endpoint (``ip:port``); an engine named by a host name has none."""
        out = {}
        for url in self.gateway.pool.engines:
            with contextlib.suppress(NotAnEndpoint):
                out[endpoint_of(url)] = url
        return out

    def _allowed(self, head: RequestHead) -> set[str] | None:
        """The engines the gateway lets this request go to (its subset hint); None: any. 503 when the hint
        names none of the pool's engines."""
        subset = subset_of(head.metadata)
        if subset is None:
            return None
        known = self._endpoints()
        allowed = {known[e] for e in subset if e in known}
        if not allowed:
            raise unavailable("None of the endpoints the gateway allows this request is in the pool.")
        return allowed

    # ---- one request ----------------------------------------------------------------------
    async def decide(self, head: RequestHead, body: bytes | None, leg: GatewayLeg) -> None:
        received = time.monotonic()
        try:
            tenant = self.gateway.identify(tenant_key(head.headers))
            if is_own_route(head.path):
                status, answer = await own_routes.answer(self.gateway, head, body, tenant, ready=self.ready.is_set())
                await leg.reply(status, orjson.dumps(answer), {"content-type": "application/json"})
                self.metrics.decided("answered", time.monotonic() - received)
                return
            dialect = CALL_DIALECTS.get(head.path) if head.method == "POST" and body is not None else None
            if dialect is None:
                await self._route_any(head, leg, received)
                return
            assert body is not None
            await self._call(head, body, dialect, tenant, leg, received)
        except APIError as exc:
            if not leg.routed:
                self.metrics.refused(exc)
            raise

    async def _route_any(self, head: RequestHead, leg: GatewayLeg, received: float) -> None:
        """A request that is no program's call: the least-loaded engine (of the subset), unaccounted."""
        loads = self.gateway.pool.loads()
        allowed = self._allowed(head)
        if allowed is not None:
            loads = {url: load for url, load in loads.items() if url in allowed}
        try:
            engine = least_used_engine({url: load for url, load in loads.items() if _routable(url)})
        except NoEngine:
            raise unavailable("No healthy engine is available.") from None
        await leg.route(Routing([endpoint_of(engine)], self.engine_headers))
        self.metrics.decided("passthrough", time.monotonic() - received)

    async def _call(self, head: RequestHead, body: bytes, dialect: Dialect, tenant: str | None, leg: GatewayLeg,
                    received: float) -> None:
        gateway, calls = self.gateway, self.gateway.calls
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"Invalid JSON body: {exc}.", code="invalid_json") from None
        checked = dialect.check(parsed, max_n=gateway.config.max_n, max_tokens=gateway.config.max_tokens)
        model = checked["model"]
        calls.check_model(model)
        allowed = self._allowed(head)
        declared = declared_tokens(head.headers, checked)
        ticket = await calls.slots.admit(tenant)  # a 429 here changes nothing
        held_since = time.monotonic()
        relay = _CallRelay(self, leg, dialect, checked, allowed, received)
        try:
            async with asyncio.timeout(self.config.decision_timeout) as budget:
                relay.budget = budget
                owner = await gateway.sessions.resolve(head.headers, tenant, received)  # last check, first change
                stream = bool(checked.get("stream"))
                spec = CallSpec(path=dialect.engine_path, body=checked, model=model, owner=owner, stream=stream,
                                prompt_tokens=await calls.prompt_tokens(dialect, checked), received=received,
                                stream_usage=stream and dialect.asks_stream_usage, allowed_engines=allowed,
                                declared_tokens=declared, prompt_blocks=calls.blocks(dialect, checked))
                relay.prompt_tokens = spec.prompt_tokens
                await gateway.controller.call(spec, relay.send)
        except TimeoutError:
            if leg.routed:
                raise
            raise APIError(503, f"The endpoint picker could not decide within {self.config.decision_timeout:g} s.",
                           type="service_unavailable", code="picker_timeout") from None
        finally:
            calls.slots.release(tenant, ticket, tokens_used=relay.tokens(), held_since=held_since)

    def fallbacks(self, model: str, chosen: str, allowed: set[str] | None) -> list[str]:
        """Up to ``config.fallbacks`` more engines that serve ``model``, least loaded first."""
        if self.config.fallbacks <= 0:
            return []
        loads = self.gateway.pool.candidates(model, exclude={chosen})
        ranked = sorted((load, url) for url, load in loads.items()
                        if (allowed is None or url in allowed) and _routable(url))
        return [url for _, url in ranked[:self.config.fallbacks]]

    def served_url(self, served: str | None, chosen: str) -> str:
        """The pool's engine at the endpoint the gateway says served the call (the chosen one when it does
        not say, or names none of the pool's)."""
        if not served or served == endpoint_of(chosen):
            return chosen
        return self._endpoints().get(served, chosen)


def _routable(url: str) -> bool:
    try:
        endpoint_of(url)
    except NotAnEndpoint:
        return False
    return True


class _CallRelay:
    """One call's attempt (the controller's ``EngineCall``): the routing answer, then its answer passed back."""

    def __init__(self, picker: Picker, leg: GatewayLeg, dialect: Dialect, body: dict[str, Any],
                 allowed: set[str] | None, received: float) -> None:
        self.picker, self.leg, self.dialect, self.body, self.allowed = picker, leg, dialect, body, allowed
        self.received = received
        self.budget: asyncio.Timeout | None = None
        self.prompt_tokens = 0
        self.outcome: CallOutcome | None = None

    def tokens(self) -> int:
        """What the call used, for its tenant's tokens per minute: the engine's count, else the prompt."""
        outcome = self.outcome
        if outcome is not None and (outcome.prompt_tokens or outcome.completion_tokens):
            return int(outcome.prompt_tokens + outcome.completion_tokens)
        return self.prompt_tokens

    async def send(self, attempt: Attempt[Any]) -> None:
        picker, gateway = self.picker, self.picker.gateway
        if self.budget is not None:
            self.budget.reschedule(None)  # decided: the answer takes as long as the engine does
        model = self.body["model"]
        endpoints = [endpoint_of(url) for url in [attempt.engine, *picker.fallbacks(model, attempt.engine,
                                                                                      self.allowed)]]
        await self.leg.route(Routing(endpoints, {CALL_HEADER: attempt.call_id, **picker.engine_headers},
                                     orjson.dumps(attempt.body)))
        picker.metrics.decided("routed", time.monotonic() - self.received, fallbacks=len(endpoints) - 1)
        head = await self.leg.response_head(strip=(RECORD_HEADER,))
        if head is None:
            return  # the client left before the answer: the controller charges the call as aborted
        served = picker.served_url(head.served, attempt.engine)
        if served != attempt.engine:
            self._moved(attempt, model, served)
        self.outcome = outcome = CallOutcome(head.status, record=record_of(head.headers))
        if head.status == 200 and attempt.stream:
            await self._relay_stream(attempt, outcome, served)
        else:
            await self._relay_whole(attempt, outcome, served, head)
        gateway.pool.record_answer(served, head.status)  # a 5xx counts against the engine's breaker
        await self._settle(attempt, outcome, served)

    def _moved(self, attempt: Attempt[Any], model: str, served: str) -> None:
        """The gateway served the call on a fallback: the chosen engine could not take it."""
        gateway = self.picker.gateway
        store = gateway.store.programs
        store.call_routed(attempt.program_id, attempt.call_id, served)
        if store.pinned(attempt.program_id, model) == attempt.engine:
            store.pin(attempt.program_id, model, served)
        gateway.pool.failed(attempt.engine, hung=False)
        self.picker.metrics.served_by_fallback.inc()

    async def _settle(self, attempt: Attempt[Any], outcome: CallOutcome, served: str) -> None:
        """Charge the call now (once). Its record is read from the engine that served it, which the
        controller knows only as the chosen one."""
        if served != attempt.engine and outcome.record is None:
            outcome.record = await self.picker.gateway.pool.call_record(served, attempt.call_id)
        await attempt.settle(outcome)

    async def _relay_stream(self, attempt: Attempt[Any], outcome: CallOutcome, served: str) -> None:
        """Server-sent events, line by line through the API's reader (usage read, a usage chunk the client
        did not ask for dropped); settled before the last event; a stream cut before it gets the API's
        error event."""
        reader = self.dialect.stream(outcome, self.picker.gateway.pool.backend, self.body)
        lines, done, ended = _Lines(), False, False
        async for data, last in self.leg.response_chunks():
            out = bytearray()
            for line in lines.feed(data, last):
                try:
                    passes = reader.passes(line)
                except ValueError:  # a line the reader cannot parse goes on as it came
                    passes = True
                if not done and reader.is_last(line):
                    done = True
                    await self._settle(attempt, outcome, served)
                if passes:
                    out += line
            if last:
                ended = True
                if not done:
                    outcome.broken = True
                    out += reader.cut_event()
            await self.leg.forward(bytes(out), last)
        if not ended:  # the gateway closed the stream: the client is gone
            outcome.broken = True

    async def _relay_whole(self, attempt: Attempt[Any], outcome: CallOutcome, served: str,
                           head: ResponseHead) -> None:
        """A whole answer: passed on as it comes but for its last chunk, which waits for the settlement;
        an engine's error is held and put in the API's shape (``Dialect.engine_error``)."""
        rewrite = head.status >= 400
        held, ended = bytearray(), head.ends
        async for data, last in self.leg.response_chunks():
            held += data
            if not last:
                await self.leg.forward(b"" if rewrite else data, False)
                continue
            ended = True
            if head.status == 200:
                with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
                    answer = orjson.loads(held)
                    if isinstance(answer, dict):
                        self.dialect.read_usage(answer, outcome, self.picker.gateway.pool.backend)
                await self._settle(attempt, outcome, served)
            await self.leg.forward(self.dialect.engine_error(bytes(held), head.status) if rewrite else data, True)
        if not ended:
            outcome.broken = True


__all__ = ["CALL_DIALECTS", "Picker", "error_answer", "record_of", "tenant_key"]
