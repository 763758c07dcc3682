"""llm-d's program-aware flow control as the rival baseline: the fairness score, the decay, the detector."""

from __future__ import annotations

import pytest

from autellix.core.engine_load import EngineLoad
from autellix.core.flow_control import FairnessParams, ProgramFairQueues, UtilizationDetector


def _queues() -> ProgramFairQueues[str]:
    return ProgramFairQueues()


def test_the_program_with_less_attained_service_goes_first() -> None:
    q = _queues()
    q.completed("big", 0.0, prompt_tokens=1000, completion_tokens=100)
    q.push("big", "big-1", 1.0)  # waited longest
    q.push("small", "small-1", 2.0)
    assert q.pick(3.0) == ("small", "small-1")
    assert q.pick(3.0) == ("big", "big-1")
    assert q.pick(3.0) is None and len(q) == 0


def test_service_is_input_plus_twice_output_tokens_halving_every_sixty_seconds() -> None:
    q = _queues()
    q.completed("p", 10.0, prompt_tokens=300, completion_tokens=50)
    assert q.service("p", 10.0) == pytest.approx(400)
    assert q.service("p", 70.0) == pytest.approx(200)
    # a completion adds to what decayed so far
    q.completed("p", 130.0, prompt_tokens=0, completion_tokens=50)
    assert q.service("p", 130.0) == pytest.approx(100 + 100)
    assert q.service("never-seen", 130.0) == 0.0


def test_with_equal_service_the_longest_waiting_head_goes_first() -> None:
    q = _queues()
    q.push("a", "a-1", 5.0)
    q.push("b", "b-1", 1.0)
    q.push("c", "c-1", 3.0)
    assert [q.pick(6.0)[0] for _ in range(3)] == ["b", "c", "a"]  # type: ignore[index]


def test_head_wait_can_outweigh_a_small_lead_in_service() -> None:
    # min-max normalised: a 10% lead in service is worth 0.08, the longest wait 0.2
    q = _queues()
    for pid, tokens in (("fresh", 0), ("served", 10), ("heavy", 100)):
        q.completed(pid, 0.0, prompt_tokens=tokens, completion_tokens=0)
    q.push("served", "s", 0.0)
    q.push("fresh", "f", 9.0)
    q.push("heavy", "h", 9.0)
    # served: 0.8 x 0.9 + 0.2 x 1 = 0.92 against fresh: 0.8 x 1 + 0 = 0.8
    assert q.pick(10.0) == ("served", "s")
    assert q.pick(10.0) == ("fresh", "f")


def test_a_program_queue_is_first_come_first_served() -> None:
    q = _queues()
    for i in range(3):
        q.push("p", f"p-{i}", float(i))
    assert [q.pick(5.0) for _ in range(3)] == [("p", "p-0"), ("p", "p-1"), ("p", "p-2")]


def test_a_withdrawn_request_is_never_dispatched() -> None:
    q = _queues()
    q.push("p", "p-0", 0.0)
    q.push("p", "p-1", 0.0)
    assert q.withdraw("p", "p-0") and not q.withdraw("p", "p-0") and not q.withdraw("nobody", "x")
    assert len(q) == 1 and q.pick(1.0) == ("p", "p-1")


def test_idle_programs_are_forgotten_after_the_ttl() -> None:
    q: ProgramFairQueues[str] = ProgramFairQueues(FairnessParams(eviction_ttl=100.0))
    q.completed("idle", 0.0, prompt_tokens=10, completion_tokens=0)
    q.push("busy", "b", 0.0)
    assert q.evict_idle(50.0) == []
    assert q.evict_idle(100.0) == ["idle"]  # "busy" still has a request waiting
    assert q.service("idle", 100.0) == 0.0


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="half_life"):
        FairnessParams(half_life=0)
    with pytest.raises(ValueError, match="weights"):
        FairnessParams(weight_service=-1)
    with pytest.raises(ValueError, match="queue_depth_threshold"):
        UtilizationDetector(queue_depth_threshold=0)
    with pytest.raises(ValueError, match="kv_util_threshold"):
        UtilizationDetector(kv_util_threshold=1.5)


def _load(waiting: int, kv_used: int) -> EngineLoad:
    return EngineLoad(running=8, waiting=waiting, slots=8, kv_blocks_used=kv_used, kv_blocks_total=100)


def test_the_detector_takes_each_engines_tighter_resource_and_averages_the_pool() -> None:
    detector = UtilizationDetector()
    assert detector.engine_score(_load(waiting=4, kv_used=40)) == pytest.approx(0.8)  # the queue binds
    assert detector.engine_score(_load(waiting=1, kv_used=72)) == pytest.approx(0.9)  # the KV cache binds
    assert not detector.saturated([_load(4, 40)])
    assert detector.saturated([_load(5, 0)])  # five waiting: saturated
    assert detector.saturated([_load(0, 80)])  # 80% of the KV cache: saturated
    # the pool's mean: one saturated engine beside an idle one leaves room
    assert not detector.saturated([_load(8, 0), _load(0, 0)])
    assert detector.saturated([])  # no engine: nothing can be dispatched
