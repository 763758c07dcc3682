"""The engine's preemption plan: the batch the queues want, with the fewest switches."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autellix.core import MultiLevelQueue, ProgramView, QueueSpec
from autellix.core.preemption import preemption_victims

SPEC = QueueSpec(boundaries=(1.0, 4.0), quanta=(2.0, 4.0, math.inf), beta=math.inf)


def queue_with(services: dict[str, float]) -> MultiLevelQueue:
    """One call per program, placed by the program's service."""
    q = MultiLevelQueue(SPEC, lambda pid: ProgramView(services[pid], 0.0, services[pid]))
    for i, pid in enumerate(services):
        q.add(f"c-{pid}", pid, now=float(i))
    return q


def test_a_fresh_call_preempts_the_lowest_running_call() -> None:
    q = queue_with({"heavy": 10.0, "medium": 2.0, "fresh": 0.0})
    victims = preemption_victims(q, running={"c-heavy", "c-medium"}, capacity=2)
    assert [v.call_id for v in victims] == ["c-heavy"]


def test_no_preemption_while_a_slot_is_free() -> None:
    q = queue_with({"heavy": 10.0, "fresh": 0.0})
    assert preemption_victims(q, running={"c-heavy"}, capacity=2) == []


def test_no_preemption_when_the_running_calls_rank_best() -> None:
    q = queue_with({"a": 0.0, "b": 0.5, "late": 5.0})
    assert preemption_victims(q, running={"c-a", "c-b"}, capacity=2) == []


def test_victims_are_the_worst_ranked_and_only_as_many_as_needed() -> None:
    services = {"r1": 9.0, "r2": 8.0, "r3": 2.0, "w1": 0.0, "w2": 0.1}
    q = queue_with(services)
    victims = preemption_victims(q, running={"c-r1", "c-r2", "c-r3"}, capacity=3)
    # batch = w1, w2, r3 (Q1, Q1, Q2); r1 and r2 sit in Q3 in arrival order, r2 last
    assert [v.call_id for v in victims] == ["c-r2", "c-r1"]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        preemption_victims([], running=set(), capacity=0)


@given(
    services=st.lists(st.floats(0, 10), min_size=1, max_size=20),
    running_mask=st.lists(st.booleans(), min_size=20, max_size=20),
    capacity=st.integers(1, 8),
)
def test_after_preemption_the_engine_can_run_the_queue_batch(services: list[float], running_mask: list[bool],
                                                             capacity: int) -> None:
    q = queue_with({f"p{i}": s for i, s in enumerate(services)})
    order = list(q)
    running = {c.call_id for c, r in zip(order, running_mask, strict=False) if r}
    running = set(list(running)[:capacity])  # an engine never runs more than its capacity
    victims = preemption_victims(q, running, capacity)
    batch = {c.call_id for c in order[:capacity]}
    assert all(v.call_id in running and v.call_id not in batch for v in victims)
    left = running - {v.call_id for v in victims}
    # every batch call now runs or has a free slot to be admitted into
    assert len(left) + len(batch - left) <= capacity
    # and no victim was needed: one fewer would leave a batch call without a slot
    if victims:
        assert len(left) + 1 + len(batch - left) > capacity
