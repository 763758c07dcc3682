"""Per-tenant limits on a clock the test moves: queue, buckets, sessions, Retry-After."""

from __future__ import annotations

import pytest

from autellix.control.limits import Refusal, TenantLimiter, TenantLimits, TokenBucket


def refusal(fn, *args) -> Refusal:
    with pytest.raises(Refusal) as info:
        fn(*args)
    return info.value


def test_concurrency_queues_fifo_then_refuses_with_retry_after() -> None:
    limiter = TenantLimiter(TenantLimits(max_concurrent=2, max_queued=1))
    running = [limiter.enter_call("a", 0.0) for _ in range(2)]
    assert all(t.admitted for t in running)
    queued = limiter.enter_call("a", 0.0)
    assert not queued.admitted
    error = refusal(limiter.enter_call, "a", 0.0)  # 2 running + 1 queued: full
    assert error.status == 429 and error.code == "concurrency_limit" and int(error.retry_after) >= 1
    assert error.body()["error"]["type"] == "rate_limit_error"
    # another tenant is not affected
    assert limiter.enter_call("b", 0.0).admitted
    # one call ends after 4 s: the queued one runs in its place
    assert limiter.leave_call("a", running[0], 4.0, held_since=0.0) == [queued] and queued.admitted
    assert limiter.state("a", 4.0).gate.running == 2


def test_a_refused_call_changes_nothing() -> None:
    limiter = TenantLimiter(TenantLimits(max_concurrent=1, requests_per_minute=60))
    limiter.enter_call("a", 0.0)
    before = limiter.state("a", 0.0).requests.available(0.0)
    refusal(limiter.enter_call, "a", 0.0)
    assert limiter.state("a", 0.0).requests.available(0.0) == before
    assert limiter.state("a", 0.0).gate.running == 1 and not limiter.state("a", 0.0).gate.queue


def test_queued_calls_time_out_with_queue_timeout() -> None:
    limiter = TenantLimiter(TenantLimits(max_concurrent=1, max_queued=2, queue_timeout_s=10))
    limiter.enter_call("a", 0.0)
    early, late = limiter.enter_call("a", 1.0), limiter.enter_call("a", 5.0)
    assert limiter.queue_timeouts(11.0) == [("a", early)]
    assert [t for _, t in limiter.queue_timeouts(15.0)] == [late]
    error = limiter.queue_timeout("a", 15.0)
    assert error.status == 429 and error.code == "queue_timeout"
    assert limiter.enter_call("a", 15.0) is not None  # the queue has room again


def test_requests_per_minute_is_a_token_bucket() -> None:
    limiter = TenantLimiter(TenantLimits(requests_per_minute=60, request_burst=3))
    for _ in range(3):
        ticket = limiter.enter_call("a", 0.0)
        limiter.leave_call("a", ticket, 0.0)
    error = refusal(limiter.enter_call, "a", 0.0)
    assert error.code == "requests_per_minute" and error.retry_after == "1"
    limiter.enter_call("a", 1.0)  # one per second refills


def test_tokens_per_minute_charges_what_was_used_after_the_call() -> None:
    limiter = TenantLimiter(TenantLimits(tokens_per_minute=600))  # 10 tokens a second
    ticket = limiter.enter_call("a", 0.0)
    limiter.leave_call("a", ticket, 0.0, tokens_used=900)  # overdraws once: 300 in debt
    error = refusal(limiter.enter_call, "a", 0.0)
    assert error.code == "tokens_per_minute" and error.retry_after == "30"
    refusal(limiter.enter_call, "a", 29.0)
    limiter.enter_call("a", 30.5)
    assert limiter.state("a", 31.0).tokens_charged == 900


def test_sessions_per_tenant() -> None:
    limiter = TenantLimiter(TenantLimits(max_sessions=2), per_tenant={"big": TenantLimits(max_sessions=3)})
    limiter.session_opened("a", "s1", 0.0)
    limiter.session_opened("a", "s2", 0.0)
    assert refusal(limiter.session_opened, "a", "s3", 0.0).code == "session_limit"
    limiter.session_closed("a", "s1", 1.0)
    limiter.session_opened("a", "s3", 1.0)
    for sid in ("x", "y", "z"):
        limiter.session_opened("big", sid, 0.0)
    assert {row["tenant"]: row["sessions"] for row in limiter.describe(1.0)} == {"a": 2, "big": 3}


def test_bucket_never_exceeds_capacity() -> None:
    bucket = TokenBucket(1.0, 5.0, 0.0)
    bucket.take(5.0, 0.0)
    assert bucket.available(100.0) == 5.0 and bucket.wait_for(7.0, 100.0) == 2.0


@pytest.mark.parametrize("bad", [{"max_concurrent": 0}, {"requests_per_minute": -1}, {"max_queued": -1},
                                 {"tokens_per_minute": float("inf")}, {"queue_timeout_s": 0}])
def test_bad_limits_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        TenantLimits(**bad)
