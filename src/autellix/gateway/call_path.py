"""One call through the gateway: its tenant's slot, its program, the attempts at engines, the tokens it used.

Every front door (Chat, Completions, Responses, Messages) hands its checked
body here with its ``Dialect``. In order, each step raising before it changes
anything: an engine serves the model (503, 404), the tenant has a slot (429,
or a wait in its queue), the program is found or opened (the last check, the
first change), then the request controller runs the call (routing, retries,
settlement) and this module sends each attempt to its engine and relays the
answer, streamed or whole.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

from aiohttp import web

from autellix.backends import CallOutcome, EngineBackend
from autellix.control import Attempt, CallSpec, RequestController
from autellix.control.limits import TenantLimiter, Ticket
from autellix.control.sessions import CallOwner
from autellix.control.size_hints import declared_tokens
from autellix.gateway.config import GatewayConfig
from autellix.gateway.dialects import Dialect
from autellix.gateway.engine_calls import Timeouts
from autellix.gateway.engine_http import EngineHttp
from autellix.gateway.engines import EnginePool
from autellix.gateway.errors import not_found, unavailable
from autellix.gateway.prompt_blocks import PromptBlocks
from autellix.gateway.tokens import Counter, estimate_tokens
from autellix.gateway.upstream import open_upstream, relay_stream, relay_whole
from autellix.protocol import CALL_HEADER

log = logging.getLogger("autellix.gateway")

JSON_HEADERS = {"Content-Type": "application/json"}
#: Prompts up to this many characters are tokenised inline (well under a millisecond); longer ones on a thread.
INLINE_TOKENIZE_CHARS = 16_384

#: Finds the call's program; runs after every other check (the first change of state).
ProgramOf = Callable[[], Awaitable[CallOwner]]
#: Runs once an engine has answered an attempt with 200, before the answer reaches the client.
OnAnswer = Callable[[Attempt[Any]], Awaitable[None]]


class TenantSlots:
    """Per-tenant admission of calls: a slot at once, after a wait in the tenant's queue, or a 429."""

    def __init__(self, limiter: TenantLimiter) -> None:
        self.limiter = limiter
        self._waiting: dict[int, asyncio.Future[None]] = {}

    async def admit(self, tenant: str | None) -> Ticket:
        """A slot for one call of ``tenant``: at once, after waiting in its queue, or a ``Refusal`` (429)."""
        ticket = self.limiter.enter_call(tenant, time.monotonic())
        if ticket.admitted:
            return ticket
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[ticket.number] = waiter
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.limiter.limits_of(tenant).queue_timeout_s)
        except TimeoutError:
            if not ticket.admitted:
                self.release(tenant, ticket)
                raise self.limiter.queue_timeout(tenant, time.monotonic()) from None
        except BaseException:  # the client left while queued (or was admitted as it left)
            self.release(tenant, ticket)
            raise
        finally:
            self._waiting.pop(ticket.number, None)
        return ticket

    def release(self, tenant: str | None, ticket: Ticket, *, tokens_used: int = 0,
                held_since: float | None = None) -> None:
        for admitted in self.limiter.leave_call(tenant, ticket, time.monotonic(), tokens_used=tokens_used,
                                                held_since=held_since):
            waiter = self._waiting.get(admitted.number)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)


class _Usage:
    """The tokens one call used, for its tenant's tokens-per-minute: the engine's count when
    it answered, else the prompt the gateway counted (a call that failed or was left still
    had its prompt prefilled)."""

    def __init__(self) -> None:
        self.prompt = 0
        self.outcome: CallOutcome | None = None

    def tokens(self) -> int:
        if self.outcome is not None and (self.outcome.prompt_tokens or self.outcome.completion_tokens):
            return int(self.outcome.prompt_tokens + self.outcome.completion_tokens)
        return self.prompt


class CallPath:
    """Runs calls: admission, the program, the controller's attempts, each sent and relayed here."""

    def __init__(self, *, config: GatewayConfig, controller: RequestController, pool: EnginePool,
                 slots: TenantSlots, backend: EngineBackend, http: EngineHttp, count_tokens: Counter,
                 prompt_blocks: PromptBlocks | None = None) -> None:
        self.config, self.controller, self.pool, self.slots = config, controller, pool, slots
        self.backend, self.http, self.count_tokens = backend, http, count_tokens
        #: A call's KV block hashes for the KV event index (None: routing does not look them up).
        self.prompt_blocks = prompt_blocks
        #: An attempt's bounds, streamed (True) and whole (False): a whole call's headers come with its
        #: last token, so its head and read bounds are the whole answer's.
        self._timeouts = {stream: Timeouts(
            connect=config.connect_timeout, total=config.attempt_timeout,
            head=config.stream_header_timeout if stream else config.whole_timeout,
            read=config.idle_read_timeout if stream else config.whole_timeout) for stream in (True, False)}

    async def prompt_tokens(self, dialect: Dialect, body: Mapping[str, Any]) -> int:
        """The prompt's length; a long text is tokenised on a thread, so it never stalls the
        event loop (and every stream on it)."""
        text = dialect.prompt_text(body)
        if len(text) <= INLINE_TOKENIZE_CHARS or self.count_tokens is estimate_tokens:
            return self.count_tokens(text)
        return await asyncio.to_thread(self.count_tokens, text)

    def blocks(self, dialect: Dialect, body: Mapping[str, Any]) -> Callable[[], Sequence[int]] | None:
        """The prompt's KV block hashes for the KV event index, computed when the balancer asks (None: no index)."""
        blocks = self.prompt_blocks
        if blocks is None:
            return None
        return lambda: blocks.of(dialect.engine_path, body)

    def check_model(self, model: str) -> None:
        """503 while no engine takes calls; 404 for a model no healthy engine serves."""
        if not self.pool.available():
            raise unavailable("No healthy engine is available.")
        if not self.pool.serves(model):
            names = ", ".join(sorted(m["id"] for m in self.pool.models()))
            raise not_found(f"The model {model!r} does not exist. Served models: {names}.", code="model_not_found")

    async def run(self, request: web.Request, dialect: Dialect, body: dict[str, Any], *, tenant: str | None,
                  received: float, program_of: ProgramOf, allowed_engines: Collection[str] | None = None,
                  on_answer: OnAnswer | None = None) -> web.StreamResponse:
        """The call, start to end: its answer to the client (``APIError`` before anything changed)."""
        model = body["model"]
        self.check_model(model)
        declared = declared_tokens(request.headers, body)
        ticket = await self.slots.admit(tenant)  # a 429 here changes nothing
        held_since, used = time.monotonic(), _Usage()
        try:
            owner = await program_of()  # last check, first change
            stream = bool(body.get("stream"))
            spec = CallSpec(path=dialect.engine_path, body=body, model=model, owner=owner, stream=stream,
                            prompt_tokens=await self.prompt_tokens(dialect, body), received=received,
                            stream_usage=stream and dialect.asks_stream_usage, allowed_engines=allowed_engines,
                            declared_tokens=declared, prompt_blocks=self.blocks(dialect, body),
                            expect_return=dialect.offers_tools(body))
            used.prompt = spec.prompt_tokens

            async def send(attempt: Attempt[Any]) -> web.StreamResponse:
                return await self._send(request, dialect, body, used, on_answer, attempt)

            return await self.controller.call(spec, send)
        finally:
            self.slots.release(tenant, ticket, tokens_used=used.tokens(), held_since=held_since)

    async def _send(self, request: web.Request, dialect: Dialect, body: Mapping[str, Any], used: _Usage,
                    on_answer: OnAnswer | None, attempt: Attempt[Any]) -> web.StreamResponse:
        """One attempt at one engine: raises ``EngineFailure`` while the call may still move."""
        config = self.config
        # the call id asks the engine to put the call's record in its answer (one request fewer)
        headers = {**JSON_HEADERS, CALL_HEADER: attempt.call_id}
        upstream = await open_upstream(self.http.calls, attempt.engine + attempt.path, attempt.body, headers,
                                       self._timeouts[attempt.stream], stream=attempt.stream)
        if upstream.status == 200 and on_answer is not None:
            try:
                await on_answer(attempt)
            except BaseException:
                upstream.release()
                raise
        if attempt.stream and upstream.status == 200:
            response, outcome = await relay_stream(
                request, upstream, lambda outcome: dialect.stream(outcome, self.backend, body),
                on_done=attempt.settle, write_timeout=config.write_timeout)
        else:
            response, outcome = await relay_whole(upstream, dialect, self.backend)
        used.outcome = outcome
        if self.pool.record_answer(attempt.engine, upstream.status):  # 5xx count against the engine's breaker
            log.warning("engine %s: circuit breaker opened", attempt.engine)
        await attempt.settle(outcome)
        return response


__all__ = ["INLINE_TOKENIZE_CHARS", "JSON_HEADERS", "CallPath", "OnAnswer", "ProgramOf", "TenantSlots"]
