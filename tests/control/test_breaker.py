"""The engine circuit breaker on a clock the test moves."""

from __future__ import annotations

from autellix.control.breaker import BreakerConfig, BreakerState, CircuitBreaker, is_failure_status


def test_opens_on_failures_in_the_window_then_probes_and_closes() -> None:
    breaker = CircuitBreaker(BreakerConfig(window_s=10, min_failures=3, failure_ratio=0.5, cooldown_s=5))
    for t in (0.0, 1.0):
        breaker.record(False, t)
    breaker.record(True, 2.0)
    assert breaker.state(2.0) is BreakerState.CLOSED  # 2 failures: under min_failures
    breaker.record(False, 3.0)
    assert breaker.state(3.0) is BreakerState.OPEN and not breaker.allows(3.0)
    assert breaker.retry_after_s(4.0) == 4.0
    # after the cooldown, exactly one probe goes through
    assert breaker.allows(8.0) and breaker.state(8.0) is BreakerState.HALF_OPEN
    breaker.begin(8.0)
    assert not breaker.allows(8.1)
    breaker.record(True, 8.5)
    assert breaker.state(8.5) is BreakerState.CLOSED and breaker.allows(8.5)
    assert breaker.describe(8.5)["opened_total"] == 1


def test_old_failures_leave_the_window_and_ratio_matters() -> None:
    breaker = CircuitBreaker(BreakerConfig(window_s=10, min_failures=3, failure_ratio=0.5))
    for t in (0.0, 1.0):
        breaker.record(False, t)
    breaker.record(False, 12.0)  # the first two are out of the window
    assert breaker.state(12.0) is BreakerState.CLOSED
    for _ in range(10):
        breaker.record(True, 13.0)
    breaker.record(False, 14.0)
    breaker.record(False, 14.0)
    assert breaker.state(14.0) is BreakerState.CLOSED  # 3 failures of 13 outcomes: under half


def test_a_failed_probe_reopens_with_a_longer_cooldown() -> None:
    breaker = CircuitBreaker(BreakerConfig(min_failures=1, failure_ratio=1.0, cooldown_s=5, max_cooldown_s=12))
    breaker.record(False, 0.0)
    breaker.begin(5.0)
    breaker.record(False, 5.0)
    assert breaker.state(14.9) is BreakerState.OPEN and breaker.allows(15.0)  # 10 s now
    breaker.begin(15.0)
    breaker.record(False, 15.0)
    assert not breaker.allows(26.9) and breaker.allows(27.0)  # capped at 12 s


def test_a_lost_probe_frees_its_slot_after_a_cooldown() -> None:
    breaker = CircuitBreaker(BreakerConfig(min_failures=1, failure_ratio=1.0, cooldown_s=5))
    breaker.record(False, 0.0)
    breaker.begin(5.0)  # the probe's caller vanishes and never records
    assert not breaker.allows(9.0) and breaker.allows(10.0)


def test_only_server_errors_count() -> None:
    assert is_failure_status(500) and is_failure_status(503)
    assert not is_failure_status(400) and not is_failure_status(429) and not is_failure_status(200)
