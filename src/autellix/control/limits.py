"""Per-tenant limits: concurrent calls with a bounded queue, requests and
tokens per minute, live sessions. Pure state: every method takes ``now``
(seconds on the caller's clock), nothing here sleeps, reads a clock or does I/O,
so the gateway, the simulator and the tests drive the same code.

A refusal is a ``Refusal``: the OpenAI-style error to answer (429) with the
``Retry-After`` seconds to send, decided before any state changes.

* Concurrency: at most ``max_concurrent`` calls of a tenant run; up to
  ``max_queued`` more wait in FIFO order; one more is refused at once (429,
  ``concurrency_limit``). A queued call that waited ``queue_timeout_s`` is
  refused (429, ``queue_timeout``): 429 rather than 408, since the client did
  nothing wrong and should come back later, which is what Retry-After says.
* Requests per minute: a token bucket of ``requests_per_minute`` per minute,
  burst ``request_burst`` (default: one minute's worth).
* Tokens per minute: a bucket charged after the call with what it used (prompt
  plus completion, aborted calls included); a call is admitted while the bucket
  is not in debt, so one large call can overdraw it once and the tenant then
  waits for the refill. Charging after, not before, is the only way to count
  what was generated rather than what was asked for (``max_tokens``).
* Sessions: at most ``max_sessions`` live sessions (explicit and implicit).

The async side (waiting in the queue) lives with the caller: ``ConcurrencyGate``
hands out tickets and says which queued ticket may run next.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from autellix.protocol import APIError


@dataclass(frozen=True)
class TenantLimits:
    """One tenant's limits; None means unlimited."""

    max_concurrent: int | None = None
    #: Calls that may wait for a free slot beyond ``max_concurrent``.
    max_queued: int = 0
    queue_timeout_s: float = 30.0
    requests_per_minute: float | None = None
    #: Largest burst of requests; default one minute's worth.
    request_burst: float | None = None
    tokens_per_minute: float | None = None
    max_sessions: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_concurrent", "max_sessions"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}: must be at least 1, got {value}")
        for name in ("requests_per_minute", "tokens_per_minute", "request_burst"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name}: must be a positive number, got {value}")
        if self.max_queued < 0:
            raise ValueError(f"max_queued: must be at least 0, got {self.max_queued}")
        if not self.queue_timeout_s > 0:
            raise ValueError(f"queue_timeout_s: must be positive, got {self.queue_timeout_s}")


class Refusal(APIError):
    """A 429 with the seconds the client should wait (``Retry-After``)."""

    def __init__(self, message: str, code: str, retry_after_s: float) -> None:
        super().__init__(429, message, type="rate_limit_error", code=code)
        self.retry_after_s = retry_after_s

    @property
    def retry_after(self) -> str:
        """The header's value: whole seconds, at least 1."""
        return str(max(1, math.ceil(self.retry_after_s)))


class TokenBucket:
    """``rate`` units per second up to ``capacity``; the level may go negative
    (a debt) when charged after the fact."""

    def __init__(self, rate_per_s: float, capacity: float, now: float) -> None:
        self.rate, self.capacity = rate_per_s, capacity
        self.level, self.updated = capacity, now

    def _fill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
            self.updated = now

    def available(self, now: float) -> float:
        self._fill(now)
        return self.level

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` units are there (0: now)."""
        self._fill(now)
        return max(0.0, (amount - self.level) / self.rate)

    def take(self, amount: float, now: float) -> None:
        """Charge ``amount`` (may leave a debt)."""
        self._fill(now)
        self.level -= amount


@dataclass
class Ticket:
    """A call's place at the gate: running (``admitted``) or queued since ``queued_at``."""

    number: int
    queued_at: float
    admitted: bool = False


class ConcurrencyGate:
    """At most ``limit`` running tickets; up to ``max_queued`` waiting, FIFO."""

    def __init__(self, limit: int | None, max_queued: int) -> None:
        self.limit, self.max_queued = limit, max_queued
        self.running = 0
        self.queue: OrderedDict[int, Ticket] = OrderedDict()
        self._next = 0
        #: Mean seconds a call held its slot (smoothed): what Retry-After is estimated from.
        self.mean_hold_s = 1.0

    def has_room(self) -> bool:
        return self.limit is None or self.running < self.limit or len(self.queue) < self.max_queued

    def enter(self, now: float) -> Ticket:
        """A ticket, admitted at once when a slot is free and nobody queues
        ahead, else queued. Call ``has_room`` first: this does not refuse."""
        self._next += 1
        ticket = Ticket(self._next, now)
        if self.limit is None or (self.running < self.limit and not self.queue):
            ticket.admitted = True
            self.running += 1
        else:
            self.queue[ticket.number] = ticket
        return ticket

    def leave(self, ticket: Ticket, now: float, held_since: float | None = None) -> list[Ticket]:
        """The ticket's call is done (or gave up waiting); the tickets admitted in its place."""
        if ticket.admitted:
            self.running -= 1
            if held_since is not None:
                self.mean_hold_s += 0.2 * (max(0.0, now - held_since) - self.mean_hold_s)
        else:
            self.queue.pop(ticket.number, None)
        return self._admit()

    def _admit(self) -> list[Ticket]:
        admitted = []
        while self.queue and (self.limit is None or self.running < self.limit):
            _, ticket = self.queue.popitem(last=False)
            ticket.admitted = True
            self.running += 1
            admitted.append(ticket)
        return admitted

    def expired(self, now: float, timeout_s: float) -> list[Ticket]:
        """Queued tickets that waited ``timeout_s`` or more (removed)."""
        out = [t for t in self.queue.values() if now - t.queued_at >= timeout_s]
        for ticket in out:
            del self.queue[ticket.number]
        return out

    def retry_after_s(self) -> float:
        """A guess at when a slot frees for a newcomer: the queue ahead, drained at
        ``limit`` calls per mean hold time."""
        per_slot = self.mean_hold_s / max(1, self.limit or 1)
        return per_slot * (len(self.queue) + 1)


@dataclass
class TenantState:
    limits: TenantLimits
    gate: ConcurrencyGate
    requests: TokenBucket | None
    tokens: TokenBucket | None
    sessions: set[str] = field(default_factory=set)
    #: Totals for the admin API and metrics.
    admitted: int = 0
    refused: int = 0
    tokens_charged: int = 0


class TenantLimiter:
    """Every tenant's limits and usage; the tenant None (auth off) is one anonymous tenant."""

    def __init__(self, default: TenantLimits | None = None,
                 per_tenant: dict[str, TenantLimits] | None = None) -> None:
        self.default = default or TenantLimits()
        self.per_tenant = dict(per_tenant or {})
        self.tenants: dict[str | None, TenantState] = {}

    def limits_of(self, tenant: str | None) -> TenantLimits:
        return self.per_tenant.get(tenant, self.default) if tenant is not None else self.default

    def state(self, tenant: str | None, now: float) -> TenantState:
        state = self.tenants.get(tenant)
        if state is None:
            lim = self.limits_of(tenant)
            requests = tokens = None
            if lim.requests_per_minute is not None:
                requests = TokenBucket(lim.requests_per_minute / 60, lim.request_burst or lim.requests_per_minute,
                                       now)
            if lim.tokens_per_minute is not None:
                tokens = TokenBucket(lim.tokens_per_minute / 60, lim.tokens_per_minute, now)
            state = self.tenants[tenant] = TenantState(lim, ConcurrencyGate(lim.max_concurrent, lim.max_queued),
                                                       requests, tokens)
        return state

    # ---- calls ---------------------------------------------------------------------
    def check_call(self, tenant: str | None, now: float) -> None:
        """Raise ``Refusal`` when the tenant may not start (or queue) a call now; changes nothing."""
        self._check_call(self.state(tenant, now), now)

    @staticmethod
    def _check_call(state: TenantState, now: float) -> None:
        if state.requests is not None and (wait := state.requests.wait_for(1.0, now)) > 0:
            state.refused += 1
            raise Refusal(f"Rate limit: {state.limits.requests_per_minute:g} requests per minute.",
                          "requests_per_minute", wait)
        if state.tokens is not None and (level := state.tokens.available(now)) < 0:
            state.refused += 1
            raise Refusal(f"Rate limit: {state.limits.tokens_per_minute:g} tokens per minute.",
                          "tokens_per_minute", -level / state.tokens.rate)
        if not state.gate.has_room():
            state.refused += 1
            raise Refusal(f"Too many concurrent calls: {state.limits.max_concurrent} running and "
                          f"{state.limits.max_queued} queued at most.", "concurrency_limit",
                          state.gate.retry_after_s())

    def enter_call(self, tenant: str | None, now: float) -> Ticket:
        """``check_call``, then take the request and a slot (or a place in the queue)."""
        state = self.state(tenant, now)
        self._check_call(state, now)
        if state.requests is not None:
            state.requests.take(1.0, now)
        state.admitted += 1
        return state.gate.enter(now)

    def leave_call(self, tenant: str | None, ticket: Ticket, now: float, *, tokens_used: int = 0,
                   held_since: float | None = None) -> list[Ticket]:
        """The call ended (or left the queue): charge the tokens it used; the
        queued tickets that now run."""
        state = self.state(tenant, now)
        if tokens_used > 0:
            state.tokens_charged += tokens_used
            if state.tokens is not None:
                state.tokens.take(float(tokens_used), now)
        return state.gate.leave(ticket, now, held_since)

    def queue_timeouts(self, now: float) -> list[tuple[str | None, Ticket]]:
        """Queued tickets that waited too long (removed): answer each with ``queue_timeout``."""
        return [(tenant, t) for tenant, s in self.tenants.items()
                for t in s.gate.expired(now, s.limits.queue_timeout_s)]

    def queue_timeout(self, tenant: str | None, now: float) -> Refusal:
        state = self.state(tenant, now)
        return Refusal(f"The call waited {state.limits.queue_timeout_s:g} s for one of the "
                       f"{state.limits.max_concurrent} concurrent slots of its key.", "queue_timeout",
                       state.gate.retry_after_s())

    # ---- sessions ------------------------------------------------------------------
    def check_session(self, tenant: str | None, now: float) -> None:
        state = self.state(tenant, now)
        cap = state.limits.max_sessions
        if cap is not None and len(state.sessions) >= cap:
            state.refused += 1
            raise Refusal(f"Too many live sessions: {cap} at most; end one (DELETE /v1/sessions/ID) first.",
                          "session_limit", 60.0)

    def session_opened(self, tenant: str | None, session_id: str, now: float) -> None:
        self.check_session(tenant, now)
        self.state(tenant, now).sessions.add(session_id)

    def session_closed(self, tenant: str | None, session_id: str, now: float) -> None:
        self.state(tenant, now).sessions.discard(session_id)

    def describe(self, now: float) -> list[dict[str, object]]:
        """Every tenant's usage (the admin API)."""
        out = []
        for tenant, s in sorted(self.tenants.items(), key=lambda kv: kv[0] or ""):
            out.append({"tenant": tenant, "running": s.gate.running, "queued": len(s.gate.queue),
                        "sessions": len(s.sessions), "admitted": s.admitted, "refused": s.refused,
                        "tokens_charged": s.tokens_charged,
                        "tokens_available": None if s.tokens is None else round(s.tokens.available(now), 1)})
        return out


__all__ = ["ConcurrencyGate", "Refusal", "TenantLimiter", "TenantLimits", "TenantState", "Ticket", "TokenBucket"]
