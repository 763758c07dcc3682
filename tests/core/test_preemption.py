"""The engine's preemption plan: the batch the queues want, with the fewest switches."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autellix.core import MultiLevelQueue, ProgramView, QueueSpec
from autellix.core.preemption import PreemptionRule, SlotTurnover, lost_kv_tokens, outranks, preemption_victims

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


# ---- cost-aware preemption: a preemption must pay for itself ---------------------------------
RULE = PreemptionRule(max_victims=8, max_lost_tokens=10_000)


def test_the_rule_preempts_for_a_better_queue_as_the_eager_form_does() -> None:
    q = queue_with({"heavy": 10.0, "medium": 2.0, "fresh": 0.0})
    victims = preemption_victims(q, running={"c-heavy", "c-medium"}, capacity=2, rule=RULE)
    assert [v.call_id for v in victims] == ["c-heavy"]


def test_no_preemption_for_a_better_place_in_the_same_queue() -> None:
    # both in Q3: the waiting call is only earlier in FCFS order; swapping them is round robin
    q = queue_with({"early": 5.0, "late": 6.0})
    assert [v.call_id for v in preemption_victims(q, running={"c-late"}, capacity=1)] == ["c-late"]  # eager
    assert preemption_victims(q, running={"c-late"}, capacity=1, rule=RULE) == []


def test_the_victim_that_loses_least_goes_first_within_the_worst_queue() -> None:
    # two fresh calls want the slots of two Q3 calls; the budget allows one switch this step
    q = queue_with({"small-kv": 8.0, "big-kv": 9.0, "fresh1": 0.0, "fresh2": 0.0})
    running = {"c-big-kv", "c-small-kv"}
    assert [v.call_id for v in preemption_victims(q, running, capacity=2)] == ["c-big-kv", "c-small-kv"]
    lost = {"c-big-kv": 4000, "c-small-kv": 10}
    one = PreemptionRule(max_victims=1, max_lost_tokens=10_000)
    chosen = preemption_victims(q, running, capacity=2, rule=one, lost_tokens=lambda c: lost[c.call_id])
    assert [v.call_id for v in chosen] == ["c-small-kv"]  # the worst-ranked would lose 4000 tokens, this one 10


def test_budgets_per_step_bound_victims_and_lost_tokens() -> None:
    services = {f"r{i}": 9.0 for i in range(4)} | {f"w{i}": 0.0 for i in range(4)}
    q = queue_with(services)
    running = {f"c-r{i}" for i in range(4)}
    assert len(preemption_victims(q, running, capacity=4)) == 4
    assert len(preemption_victims(q, running, capacity=4, rule=PreemptionRule(max_victims=2))) == 2
    assert preemption_victims(q, running, capacity=4, rule=PreemptionRule(max_victims=0)) == []
    by_tokens = PreemptionRule(max_victims=8, max_lost_tokens=250)
    assert len(preemption_victims(q, running, capacity=4, rule=by_tokens, lost_tokens=lambda c: 100)) == 2


def test_no_preemption_when_a_slot_frees_soon_on_its_own() -> None:
    q = queue_with({"heavy": 10.0, "fresh": 0.0})
    rule = PreemptionRule(min_wait_steps=32)
    busy = SlotTurnover(half_life=64)
    for _ in range(64):  # a call leaves every 4 steps
        busy.stepped(4)
        busy.departed()
    assert busy.expected_wait_steps(1) == pytest.approx(4, rel=0.05)
    assert preemption_victims(q, running={"c-heavy"}, capacity=1, rule=rule, turnover=busy) == []
    stuck = SlotTurnover(half_life=64)
    stuck.stepped(500)  # nothing left in 500 steps
    assert stuck.expected_wait_steps(1) == math.inf
    assert [v.call_id for v in preemption_victims(q, running={"c-heavy"}, capacity=1, rule=rule,
                                                   turnover=stuck)] == ["c-heavy"]


def test_lost_tokens_count_what_recompute_redoes() -> None:
    assert lost_kv_tokens(1000, block_size=16, swappable=True, kv_usage=0.99) == 0
    assert lost_kv_tokens(1000, block_size=16, swappable=False, kv_usage=0.5) == 1000 % 16
    assert lost_kv_tokens(1000, block_size=16, swappable=False, kv_usage=0.95) == 1000  # the cache will evict them
    assert lost_kv_tokens(1000, block_size=16, swappable=False, kv_usage=0.5, prefix_caching=False) == 1000


@given(
    services=st.lists(st.floats(0, 10), min_size=1, max_size=20),
    running_mask=st.lists(st.booleans(), min_size=20, max_size=20),
    capacity=st.integers(1, 8),
    max_victims=st.integers(0, 4),
    max_lost=st.integers(0, 3000),
)
def test_the_rule_only_ever_narrows_the_eager_plan(services: list[float], running_mask: list[bool], capacity: int,
                                                   max_victims: int, max_lost: int) -> None:
    q = queue_with({f"p{i}": s for i, s in enumerate(services)})
    order = list(q)
    running = set(list({c.call_id for c, r in zip(order, running_mask, strict=False) if r})[:capacity])
    lost = {c.call_id: 100 * (i % 7) for i, c in enumerate(order)}
    rule = PreemptionRule(max_victims=max_victims, max_lost_tokens=max_lost)
    chosen = preemption_victims(q, running, capacity, rule=rule, lost_tokens=lambda c: lost[c.call_id])
    batch = order[:capacity]
    eager_count = len(preemption_victims(q, running, capacity))
    assert len(chosen) <= min(eager_count, max_victims)
    assert sum(lost[v.call_id] for v in chosen) <= max_lost
    assert all(v.call_id in running and v not in batch for v in chosen)
    newcomers = [c for c in batch if c.call_id not in running]
    if chosen:  # every victim sits in a worse queue than the best newcomer
        assert all(v.level > min(c.level for c in newcomers) for v in chosen)


def test_a_newcomer_takes_a_worse_queues_call_past_one_of_its_own_queue() -> None:
    q = queue_with({"a": 0.5, "n": 1.5, "x": 2.0, "r1": 2.5, "r2": 5.0})  # queues 0, 1, 1, 1, 2
    victims = preemption_victims(q, {"c-r1", "c-r2"}, 3, rule=RULE)
    assert [v.call_id for v in victims] == ["c-r2"]  # for n; x outranks neither


def victims_by_full_scan(ordered: list, running: set, capacity: int, rule: PreemptionRule,
                         lost: dict[str, int]) -> list:
    """The rule's plan found by trying every candidate for every newcomer: the oracle the plan must match."""
    batch = ordered[:capacity]
    newcomers = [c for c in batch if c.call_id not in running]
    needed = len(newcomers) - max(capacity - len(running), 0)
    if needed <= 0:
        return []
    candidates = sorted([c for c in ordered[capacity:] if c.call_id in running][::-1],
                        key=lambda c: (-c.band, -c.level, lost[c.call_id]))
    victims, spent = [], 0
    for newcomer in newcomers[len(newcomers) - needed:]:
        if len(victims) >= rule.max_victims:
            break
        for call in candidates:
            if call not in victims and outranks(newcomer, call, rule.min_level_gap) \
                    and spent + lost[call.call_id] <= rule.max_lost_tokens:
                victims.append(call)
                spent += lost[call.call_id]
                break
    return victims


@given(
    services=st.lists(st.floats(0, 10), min_size=1, max_size=40),
    running_mask=st.lists(st.booleans(), min_size=40, max_size=40),
    beyond_mask=st.lists(st.booleans(), min_size=40, max_size=40),
    capacity=st.integers(1, 16),
    max_victims=st.integers(0, 8),
    max_lost=st.integers(0, 3000),
    min_level_gap=st.integers(1, 2),
)
def test_the_plan_is_what_trying_every_candidate_finds(services: list[float], running_mask: list[bool],
                                                       beyond_mask: list[bool], capacity: int, max_victims: int,
                                                       max_lost: int, min_level_gap: int) -> None:
    q = queue_with({f"p{i}": s for i, s in enumerate(services)})
    for call, beyond in zip(q, beyond_mask, strict=False):
        call.band = int(beyond)
    ordered = [c for c in q if not c.band] + [c for c in q if c.band]  # as the engine's planner orders them
    running = {c.call_id for c, r in zip(ordered, running_mask, strict=False) if r}
    running = set(sorted(running)[:capacity])
    lost = {c.call_id: 100 * (i % 7) for i, c in enumerate(ordered)}
    rule = PreemptionRule(max_victims=max_victims, max_lost_tokens=max_lost, min_level_gap=min_level_gap)
    chosen = preemption_victims(ordered, running, capacity, rule=rule, lost_tokens=lambda c: lost[c.call_id])
    assert chosen == victims_by_full_scan(ordered, running, capacity, rule, lost)
