"""A circuit breaker per engine: pure state, time passed in.

Why not just health checks: an engine whose ``/health`` passes can still fail
its calls (5xx, resets, hangs), and an engine marked failed came back after the
next passing probe, to fail the next call again. The breaker counts what real
calls saw:

* closed: calls flow; each outcome is recorded in a sliding window of
  ``window_s`` seconds. Once the window holds at least ``min_failures``
  failures that are at least ``failure_ratio`` of its outcomes, the breaker
  opens.
* open: no call is sent for the cooldown (``cooldown_s``, doubling each time
  it opens again without a success in between, up to ``max_cooldown_s``).
* half-open: after the cooldown one call (the probe) is let through; its
  success closes the breaker (and resets the cooldown), its failure opens it
  again. A probe whose outcome never comes back (the caller vanished) frees the
  probe slot after ``cooldown_s``.

What counts as a failure is the caller's choice: connection errors, resets,
hangs, and engine 5xx answers (an engine's 4xx is the client's fault).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    window_s: float = 30.0
    min_failures: int = 5
    failure_ratio: float = 0.5
    cooldown_s: float = 5.0
    max_cooldown_s: float = 300.0

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and self.cooldown_s > 0 and self.max_cooldown_s >= self.cooldown_s):
            raise ValueError("window_s and cooldown_s must be positive and max_cooldown_s >= cooldown_s")
        if self.min_failures < 1 or not 0 < self.failure_ratio <= 1:
            raise ValueError("min_failures must be at least 1 and failure_ratio in (0, 1]")


def is_failure_status(status: int) -> bool:
    """Engine answers that count against it: server errors, not the client's 4xx."""
    return status >= 500


class CircuitBreaker:
    def __init__(self, config: BreakerConfig | None = None) -> None:
        self.config = config or BreakerConfig()
        self._outcomes: deque[tuple[float, bool]] = deque()
        self._failures = 0
        self._state = BreakerState.CLOSED
        self._opened_at = 0.0
        self._cooldown = self.config.cooldown_s
        self._probe_since: float | None = None
        #: Times it opened (for metrics).
        self.opened_total = 0

    def _prune(self, now: float) -> None:
        horizon = now - self.config.window_s
        while self._outcomes and self._outcomes[0][0] < horizon:
            _, ok = self._outcomes.popleft()
            self._failures -= not ok

    def state(self, now: float) -> BreakerState:
        if self._state is BreakerState.OPEN and now >= self._opened_at + self._cooldown:
            self._state = BreakerState.HALF_OPEN
            self._probe_since = None
        return self._state

    def allows(self, now: float) -> bool:
        """May a call go to this engine now? Pure question: it takes no probe slot."""
        if self._state is BreakerState.CLOSED:  # the common case: ``state`` would return it as it is
            return True
        state = self.state(now)
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN:
            return False
        return self._probe_since is None or now - self._probe_since >= self.config.cooldown_s

    def begin(self, now: float) -> None:
        """A call is sent (in half-open: it is the probe)."""
        if self._state is not BreakerState.CLOSED and self.state(now) is BreakerState.HALF_OPEN:
            self._probe_since = now

    def record(self, ok: bool, now: float) -> None:
        state = self.state(now)
        if state is BreakerState.HALF_OPEN:
            if ok:
                self._close()
            else:
                self._open(now, again=True)
            return
        if state is BreakerState.OPEN:
            return  # a call sent before it opened: its outcome is already known to be bad news
        self._prune(now)
        self._outcomes.append((now, ok))
        self._failures += not ok
        if (self._failures >= self.config.min_failures
                and self._failures >= self.config.failure_ratio * len(self._outcomes)):
            self._open(now, again=False)

    def _open(self, now: float, *, again: bool) -> None:
        if again:
            self._cooldown = min(self.config.max_cooldown_s, self._cooldown * 2)
        self._state, self._opened_at, self._probe_since = BreakerState.OPEN, now, None
        self._outcomes.clear()
        self._failures = 0
        self.opened_total += 1

    def _close(self) -> None:
        self._state, self._cooldown, self._probe_since = BreakerState.CLOSED, self.config.cooldown_s, None
        self._outcomes.clear()
        self._failures = 0

    def retry_after_s(self, now: float) -> float:
        """Seconds until this engine may take a call again (0: now)."""
        if self.state(now) is BreakerState.OPEN:
            return self._opened_at + self._cooldown - now
        return 0.0

    def describe(self, now: float) -> dict[str, object]:
        """For the admin API: state, recent failures and outcomes, seconds until a probe."""
        self._prune(now)
        return {"state": self.state(now).value, "failures": self._failures, "outcomes": len(self._outcomes),
                "opened_total": self.opened_total, "retry_after_s": round(self.retry_after_s(now), 3)}


__all__ = ["BreakerConfig", "BreakerState", "CircuitBreaker", "is_failure_status"]
