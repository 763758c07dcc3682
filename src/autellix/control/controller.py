"""The request controller: the life of one call, free of any transport.

arrival -> candidate engines (healthy, not draining, serving the call's model)
-> Algorithm 2 (the configured balancer) -> annotation (the engine backend adds
the program's priority and fields) -> the engine call -> settle (the call's
model time becomes the program's service, the rest its waiting).

The controller owns none of the I/O: the caller passes an ``EngineCall``, an
async function that sends one ``Attempt`` to its engine and returns whatever
the caller needs (the aiohttp gateway: the client's response; the simulator: the
modelled outcome). Time comes from ``clock``, waits from ``sleep``, so the same
code runs on the gateway's monotonic clock and on the simulator's virtual one.

One retry budget per call: at most ``max_attempts`` engines in total, each
attempt's reason recorded (``recent`` and the ``observer``). An attempt is
retried only if the engine failure says nothing reached the client and the
engine cannot have run the call to its end (``EngineFailure.retryable``);
between attempts the controller backs off with full jitter.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from autellix.backends.base import CallOutcome, EngineBackend
from autellix.control.ids import UniqueIds
from autellix.control.sessions import CallOwner
from autellix.control.store.programs import ProgramStore
from autellix.core import NOTHING_CACHED, UNKNOWN_SLOTS, Balancer, NoEngine, Policy, PrefixIndex, QueueSpec
from autellix.protocol import APIError, CallRecord, SchedulingFields

log = logging.getLogger("autellix.control")

T = TypeVar("T")

#: Calls kept for the admin API (``GET /admin/calls``), most recent last.
RECENT_CALLS = 1000


class EngineFailure(Exception):
    """An attempt failed at its engine.

    ``retryable``: nothing reached the client and the engine cannot have run the
    call to its end, so another engine may take it. ``hung``: the engine took
    the call and sent nothing in time (it may still pass its health checks)."""

    def __init__(self, reason: str, detail: str = "", *, retryable: bool = True, hung: bool = False) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.retryable, self.hung = reason, retryable, hung


class EngineDirectory(Protocol):
    """What the controller needs of the engine pool (no I/O on the hot path)."""

    def candidates(self, model: str, exclude: Collection[str] = ()) -> dict[str, float]:
        """Load of every engine that may take a new call of ``model``."""
        ...

    def begin(self, url: str) -> None: ...

    def end(self, url: str) -> None: ...

    def answered(self, url: str) -> None:
        """The engine answered a call (a run of hangs is over)."""
        ...

    def failed(self, url: str, *, hung: bool) -> None:
        """An attempt failed there: out of the candidates for a while."""
        ...

    async def call_record(self, url: str, call_id: str) -> CallRecord | None:
        """The engine's record of a finished call (its model time), if it keeps one."""
        ...

    def seconds_per_token(self, url: str) -> float: ...

    def slots(self, url: str) -> int | None:
        """The calls the engine runs at once (vLLM's ``max_num_seqs``), if it said."""
        ...


class ControllerObserver(Protocol):
    """Hooks for metrics; every method may do nothing."""

    def routed(self, added_latency: float) -> None: ...

    def attempt(self, reason: str, retried: bool) -> None: ...

    def settled(self, source: str, wait: float) -> None: ...


class NullObserver:
    def routed(self, added_latency: float) -> None:
        pass

    def attempt(self, reason: str, retried: bool) -> None:
        pass

    def settled(self, source: str, wait: float) -> None:
        pass


@dataclass(slots=True)
class CallSpec:
    """One validated call, as the transport read it."""

    #: The engine route (``/v1/chat/completions``, ``/v1/completions``).
    path: str
    #: The client's request body (JSON); the backend adds the scheduling fields.
    body: Mapping[str, Any]
    model: str
    owner: CallOwner
    prompt_tokens: int
    stream: bool = False
    #: When the call reached the gateway (controller clock): the added latency counts from here.
    received: float | None = None
    #: Ask the engine for a usage chunk on a stream (Chat and Completions; other APIs' streams end with it).
    stream_usage: bool = False
    #: The only engines that may run the call (one holds state the call needs: a stored response; a gateway's
    #: subset hint); None: any that serves the model.
    allowed_engines: Collection[str] | None = None
    #: The tokens the call's program says it will generate in all (``autellix.control.hints``; 0: none said).
    declared_tokens: int = 0
    #: The prompt's KV block hashes as its engines name them (``core.VllmBlockHasher``), for the controller's
    #: KV event index: computed only when the balancer weighs them (empty: not known for this prompt); None:
    #: the call is not looked up.
    prompt_blocks: Callable[[], Sequence[int]] | None = None
    #: The call offers tools: its program may come back after one runs (the engine holds its prefix).
    expect_return: bool = False


@dataclass(slots=True)
class AttemptLog:
    engine: str
    #: ``ok``, ``http_<status>`` or the failure's reason (``connect``, ``reset``, ``hung``, ...).
    reason: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "reason": self.reason, "seconds": round(self.seconds, 6)}


@dataclass(slots=True)
class CallLog:
    call_id: str
    program_id: str
    model: str
    attempts: list[AttemptLog] = field(default_factory=list)
    #: ``running``, ``ok``, ``failed`` (attempts failed), ``no_engine``, ``aborted`` (the caller left).
    result: str = "running"

    def to_dict(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "program": self.program_id, "model": self.model, "result": self.result,
                "attempts": [a.to_dict() for a in self.attempts]}


@dataclass(slots=True)
class Attempt(Generic[T]):
    """One try of a call at one engine, handed to the ``EngineCall``."""

    call_id: str
    program_id: str
    engine: str
    #: 1-based; at most the controller's ``max_attempts``.
    number: int
    path: str
    #: The body for this engine: the client's plus the scheduling fields.
    body: dict[str, Any]
    stream: bool
    _settle: Callable[[CallOutcome | None], Awaitable[None]]

    async def settle(self, outcome: CallOutcome | None) -> None:
        """Charge the call to its program now (once; later calls do nothing).
        A stream settles before its closing event so that a client reading its
        session right after sees the call counted; otherwise the controller
        settles when the engine call returns (None: the call was aborted)."""
        await self._settle(outcome)


EngineCall = Callable[[Attempt[Any]], Awaitable[T]]


@dataclass
class RetryPolicy:
    max_attempts: int = 3
    #: Full jitter: before attempt n+1, sleep uniform(0, min(cap, base * 2**(n-1))) seconds.
    backoff_base: float = 0.05
    backoff_cap: float = 1.0

    def backoff(self, failed_attempts: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.backoff_cap, self.backoff_base * 2 ** (failed_attempts - 1)))


def no_engine(model: str) -> APIError:
    return APIError(503, f"No engine serving {model!r} could take the call; try again shortly.",
                    type="service_unavailable", code="no_engine_available")


class NoAllowedEngine(APIError):
    """None of the engines the call may run on (``CallSpec.allowed_engines``) takes a call now: each left the
    pool, is unhealthy or is draining. A 503 here; a front door whose allowed engine holds state the call
    needs says more (the Responses API: 404, the stored response is out of reach)."""

    def __init__(self, engines: Collection[str]) -> None:
        super().__init__(503, "No engine this call may run on can take it now.", type="service_unavailable",
                         code="no_engine_available")
        self.engines = tuple(engines)


def every_attempt_failed(attempts: int) -> APIError:
    return APIError(502, f"Every engine tried ({attempts}) failed before answering the call.",
                    type="upstream_error", code="engine_failed")


class RequestController:
    """Arrival, routing, annotation, retries and settlement of calls; no transport."""

    def __init__(self, *, store: ProgramStore, engines: EngineDirectory, backend: EngineBackend,
                 balancer: Balancer, queues: QueueSpec, policy: Policy | None = None,
                 send_priority: bool = True, retry: RetryPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 observer: ControllerObserver | None = None, rng: random.Random | None = None,
                 call_ids: Callable[[], str] | None = None,
                 on_program_left: Callable[[Any, float], None] | None = None,
                 on_call_done: Callable[[str, int], None] | None = None,
                 kv_index: PrefixIndex | None = None) -> None:
        self.store, self.engines, self.backend = store, engines, backend
        #: Which engine holds which KV blocks (their KV events); None: routing does not look.
        self.kv_index = kv_index
        self.balancer, self.queues = balancer, queues
        self.policy = policy or store.policy
        self.send_priority = send_priority
        self.retry = retry or RetryPolicy()
        self.clock, self.sleep = clock, sleep
        self.observer: ControllerObserver = observer or NullObserver()
        self.rng = rng or random.Random()
        self.call_ids = call_ids or UniqueIds()
        self.recent: deque[CallLog] = deque(maxlen=RECENT_CALLS)
        #: A one-call program left the table (its tenant's standing counts its service).
        self.on_program_left = on_program_left
        #: A call finished with this many tokens of context, prompt and reply (program admission's working set).
        self.on_call_done = on_call_done

    # ---- what the engine is told ----------------------------------------------------
    def scheduling_fields(self, program_id: str, thread_id: str | None, call_id: str, *,
                          expect_return: bool = False) -> SchedulingFields:
        """The program's standing for the engine: its tree's totals (a subagent ranks with its tree)."""
        view = self.store.view(program_id)
        level = None
        if self.send_priority:
            level = self.queues.level_for(view.priority if self.policy.places_by_priority else 0.0)
        tenant = self.store.entry(program_id).owner
        return SchedulingFields(program=program_id, call=call_id, service=view.service, wait=view.wait,
                                thread=thread_id, level=level, tree=view.tree or None, declared=view.declared,
                                tenant=tenant, tenant_weight=self.store.tenants.weight(tenant),
                                expect_return=expect_return)

    def _slots(self, loads: Mapping[str, float]) -> dict[str, int]:
        return {engine: size for engine in loads if (size := self.engines.slots(engine)) is not None}

    # ---- one call -------------------------------------------------------------------
    async def call(self, spec: CallSpec, send: EngineCall[T]) -> T:
        """Run the call through at most ``max_attempts`` engines; ``send`` talks to one.

        ``send`` raises ``EngineFailure`` while the call may still move, and
        calls ``attempt.settle(outcome)`` with what the engine answered before it
        returns (a stream: before its closing event); a call it leaves unsettled
        counts as aborted. Raises ``APIError`` (503: no engine serves the model
        or could take it; 502: the attempts failed) after the call is charged
        as aborted."""
        owner = spec.owner
        program_id = owner.program_id
        call_id = self.call_ids()
        start = self.clock()
        if spec.declared_tokens:
            self.store.declare(program_id, spec.declared_tokens)
        self.store.call_arrived(program_id, call_id, start, thread_id=owner.thread_id)
        journal = CallLog(call_id, program_id, spec.model)
        self.recent.append(journal)
        state = _Settlement(self, program_id, call_id, start)
        cached = _CachedPrefix(self, spec)
        try:
            tried: set[str] = set()
            for number in range(1, self.retry.max_attempts + 1):
                loads = self.engines.candidates(spec.model, exclude=tried)
                if spec.allowed_engines is not None:
                    loads = {e: load for e, load in loads.items() if e in spec.allowed_engines}
                    if not loads and not tried:
                        journal.result = "no_engine"
                        raise NoAllowedEngine(spec.allowed_engines)
                try:
                    pinned = self.store.pinned(program_id, spec.model)
                    held = cached.of(loads, pinned)
                    route = self.balancer.choose(loads, prompt_tokens=spec.prompt_tokens, pinned=pinned,
                                                 cached=held, slots=self._slots(loads) if held else UNKNOWN_SLOTS)
                except NoEngine:
                    journal.result = "no_engine" if not tried else "failed"
                    raise no_engine(spec.model) from None
                engine = route.engine
                self.store.pin(program_id, spec.model, route.pin)
                self.store.call_routed(program_id, call_id, engine)
                state.engine = engine
                if number == 1 and spec.received is not None:
                    self.observer.routed(self.clock() - spec.received)
                fields = self.scheduling_fields(program_id, owner.thread_id, call_id, expect_return=spec.expect_return)
                body = self.backend.annotate(spec.body, fields, stream=spec.stream_usage)
                attempt: Attempt[Any] = Attempt(call_id, program_id, engine, number, spec.path, body, spec.stream,
                                                state.settle)
                # Counted in flight from the routing decision, not from the engine's
                # first byte: concurrent calls must see each other's load.
                self.engines.begin(engine)
                began = self.clock()
                try:
                    result = await send(attempt)
                except EngineFailure as exc:
                    state.failed_at = engine
                    journal.attempts.append(AttemptLog(engine, exc.reason, self.clock() - began))
                    self.engines.failed(engine, hung=exc.hung)
                    tried.add(engine)
                    again = exc.retryable and number < self.retry.max_attempts
                    self.observer.attempt(exc.reason, again)
                    log.warning("call %s: attempt %d at %s failed (%s)%s", call_id, number, engine, exc,
                                "; retrying" if again else "")
                    if not again:
                        journal.result = "failed"
                        raise every_attempt_failed(number) from exc
                    await self.sleep(self.retry.backoff(number, self.rng))
                    continue
                finally:
                    self.engines.end(engine)
                self.engines.answered(engine)
                status = state.status
                reason = "ok" if status in (None, 200) else f"http_{status}"
                journal.attempts.append(AttemptLog(engine, reason, self.clock() - began))
                journal.result = "ok"
                self.observer.attempt(reason, False)
                return result
            raise AssertionError("unreachable: the last attempt returns or raises")
        finally:
            if journal.result == "running":  # the client went away, or the transport failed
                journal.result = "aborted"
            try:
                if not state.done:  # (settled already, as nearly every call is: nothing to await)
                    await state.settle(None)
            finally:  # a one-call program leaves with its call, even if the settlement was cancelled
                if owner.ephemeral:
                    ended = await self.store.end(program_id, remember=False)
                    if ended is not None and self.on_program_left is not None:
                        self.on_program_left(ended, self.clock())


class _CachedPrefix:
    """What each engine holds of one call's prompt, from the controller's KV event index: its block hashes
    computed once, and only when the balancer weighs them."""

    def __init__(self, controller: RequestController, spec: CallSpec) -> None:
        self.index, self.balancer, self.spec = controller.kv_index, controller.balancer, spec
        self._blocks: Sequence[int] | None = None

    def of(self, loads: Mapping[str, float], pinned: str | None) -> Mapping[str, int]:
        spec = self.spec
        if self.index is None or spec.prompt_blocks is None or not self.balancer.weighs_cache(
                prompt_tokens=spec.prompt_tokens, pinned=pinned if pinned in loads else None):
            return NOTHING_CACHED
        if self._blocks is None:
            self._blocks = spec.prompt_blocks()
        return self.index.cached_tokens(self._blocks, loads) if self._blocks else NOTHING_CACHED


class _Settlement:
    """Charges one call to its program exactly once."""

    def __init__(self, controller: RequestController, program_id: str, call_id: str, start: float) -> None:
        self.c, self.program_id, self.call_id, self.start = controller, program_id, call_id, start
        self.engine: str | None = None
        #: The engine whose attempt failed last (its record is not worth waiting for).
        self.failed_at: str | None = None
        self.done = False
        self.status: int | None = None

    async def settle(self, outcome: CallOutcome | None) -> None:
        if self.done:
            return
        self.done = True
        c = self.c
        if outcome is not None:
            self.status = outcome.status
        if not c.store.is_active(self.program_id, self.call_id):
            return  # the session was ended while the call ran
        record = outcome.record if outcome is not None else None
        try:
            if record is None and self._asks_record(outcome):
                assert self.engine is not None
                record = await c.engines.call_record(self.engine, self.call_id)
        finally:
            # also when cancelled (the client left) while the record was awaited: charged without
            # it, or the call would stay active and its program never expire
            self._charge(outcome, record)

    def _finished(self, outcome: CallOutcome | None) -> bool:
        return outcome is not None and outcome.status == 200 and not outcome.broken and self.engine is not None

    def _asks_record(self, outcome: CallOutcome | None) -> bool:
        """Whether the engine's record of the call is worth waiting for: a finished call that did not
        say its model time, or a call that did not finish at an engine that did not fail."""
        if self._finished(outcome):
            assert outcome is not None
            return outcome.model_time is None
        return self.engine is not None and self.engine != self.failed_at and (outcome is None or outcome.broken)

    def _charge(self, outcome: CallOutcome | None, record: CallRecord | None) -> None:
        c, store = self.c, self.c.store
        if not store.is_active(self.program_id, self.call_id):
            return
        wall = c.clock() - self.start
        if not self._finished(outcome):
            used = self._used_by_abort(outcome, record)
            if used > 0:  # a client that left (or a stream cut) still cost the engine this much
                model_time = min(wall, used)
                c.observer.settled("aborted", wall - model_time)
                store.call_finished(self.program_id, self.call_id, c.clock(), model_time=model_time,
                                    wait=wall - model_time, prompt_tokens=outcome.prompt_tokens if outcome else 0,
                                    completion_tokens=outcome.completion_tokens if outcome else 0)
                return
            store.call_aborted(self.program_id, self.call_id, c.clock(), wait=wall)
            return
        assert outcome is not None and self.engine is not None
        if outcome.model_time is not None:
            model_time, source = outcome.model_time, "scheduler"
        else:
            # Model time, never queueing (docs/gateway.md): the engine's own record
            # when it keeps one, else what its answer said, else priced tokens.
            model_time, source = c.backend.model_time(record, outcome, c.engines.seconds_per_token(self.engine))
        model_time = min(wall, max(0.0, model_time))
        wait = wall - model_time
        c.observer.settled(source, wait)
        store.call_finished(self.program_id, self.call_id, c.clock(), model_time=model_time, wait=wait,
                            prompt_tokens=outcome.prompt_tokens, completion_tokens=outcome.completion_tokens)
        if c.on_call_done is not None:
            c.on_call_done(self.program_id, outcome.prompt_tokens + outcome.completion_tokens)

    def _used_by_abort(self, outcome: CallOutcome | None, record: CallRecord | None) -> float:
        """Model time a call that did not finish consumed: a client that disconnected after its
        last token but before ``[DONE]``, or mid-stream, must not get that time for free. The
        engine's record when its scheduler keeps one (prefill included), else the tokens it
        was seen to generate, priced; 0 when the engine answered with an error or failed."""
        if self.engine is None or self.engine == self.failed_at or (outcome is not None and not outcome.broken):
            return 0.0
        if record is not None:
            return record.service_s
        if outcome is not None and outcome.completion_tokens:
            return outcome.completion_tokens * self.c.engines.seconds_per_token(self.engine)
        return 0.0


__all__ = [
    "RECENT_CALLS",
    "Attempt",
    "AttemptLog",
    "CallLog",
    "CallSpec",
    "ControllerObserver",
    "EngineCall",
    "EngineDirectory",
    "EngineFailure",
    "NoAllowedEngine",
    "NullObserver",
    "RequestController",
    "RetryPolicy",
    "every_attempt_failed",
    "no_engine",
]
