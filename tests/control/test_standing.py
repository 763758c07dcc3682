"""The tenant-standing floor: session cycling hands its service on; honest new programs start at zero."""

from __future__ import annotations

import pytest

from autellix.control.standing import TenantStanding
from autellix.core import SchedulerConfig
from autellix.core.mlq import QueueSpec

QUEUES = QueueSpec.from_config(SchedulerConfig())  # the default boundaries
CALL_S, GAP_S, CALLS = 0.4, 0.2, 60


def services_one_session() -> list[float]:
    return [i * CALL_S for i in range(CALLS)]


def services_cycling(standing: TenantStanding) -> list[float]:
    """A new session for every call: each starts at the floor and leaves with what it attained."""
    now, services = 0.0, []
    for _ in range(CALLS):
        service = standing.take_floor("cycler", now)
        services.append(service)
        now += CALL_S
        standing.program_left("cycler", service + CALL_S, now)
        now += GAP_S
    return services


def test_cycling_sessions_gains_no_queue_level() -> None:
    one = services_one_session()
    assert QUEUES.level_for(one[-1]) >= 2  # 24 s of service: well below Q1
    cycling = services_cycling(TenantStanding(half_life_s=60))
    # the decay over the gaps between calls costs the cycler's floor a few per cent, never more
    assert all(0.9 * o <= c <= o for o, c in zip(one, cycling, strict=True))
    levels = [(QUEUES.level_for(o), QUEUES.level_for(c)) for o, c in zip(one, cycling, strict=True)]
    assert all(o - 1 <= c <= o for o, c in levels)  # a call now and then a queue early, never more
    # without the rule (a carry that is gone at once) every call of the cycler would be in Q1
    assert {QUEUES.level_for(c) for c in services_cycling(TenantStanding(half_life_s=1e-9))} == {0}


def test_honest_new_programs_start_at_zero() -> None:
    standing = TenantStanding(half_life_s=60)
    standing.program_left("heavy", 30.0, 0.0)
    assert standing.take_floor("fresh", 1.0) == 0.0  # another tenant's history never counts
    # the same tenant long after its last program: the carry has decayed away
    assert standing.carry("heavy", 600.0) == pytest.approx(30.0 / 1024)
    assert QUEUES.level_for(standing.take_floor("heavy", 600.0)) == 0


def test_a_floor_is_taken_once() -> None:
    standing = TenantStanding(half_life_s=60)
    standing.program_left("t", 3.0, 0.0)
    assert standing.take_floor("t", 0.0) == 3.0
    assert standing.take_floor("t", 0.0) == 0.0  # a second new program does not count it again
    standing.program_left("t", 0.0, 1.0)
    assert standing.carry("t", 1.0) == 0.0


def test_memory_is_bounded() -> None:
    standing = TenantStanding(max_tenants=3)
    for i in range(10):
        standing.program_left(f"t{i}", 1.0, float(i))
    assert [t for t in (f"t{i}" for i in range(10)) if standing.carry(t, 10.0) > 0] == ["t7", "t8", "t9"]
