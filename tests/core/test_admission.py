"""Program admission: new programs wait while the admitted ones' KV working sets fill the engines."""

from __future__ import annotations

import pytest

from autellix.core.admission import AdmissionParams, AlreadyKnown, ProgramAdmission, Verdict
from autellix.core.engine_load import EngineLoad

#: One engine of 100 blocks of 16 tokens and 4 running slots.
ENGINE = [EngineLoad(running=4, waiting=9, slots=4, kv_blocks_used=100, kv_blocks_total=100, kv_block_size=16)]


def _with_working_set(tokens: int, params: AdmissionParams | None = None) -> ProgramAdmission:
    """An admission whose programs have been seen to finish with ``tokens`` of context."""
    admission = ProgramAdmission(params or AdmissionParams(kv_limit=1.0))
    admission.arrive("warm-up", 0.0, ENGINE)
    admission.context("warm-up", tokens)
    admission.leave("warm-up")
    return admission


def test_every_program_is_admitted_until_one_has_shown_its_working_set() -> None:
    admission = ProgramAdmission()
    busy = [EngineLoad(running=4, waiting=50, slots=4, kv_blocks_used=100, kv_blocks_total=100)]
    assert all(admission.arrive(f"p{i}", 0.0, busy).verdict is Verdict.ADMIT for i in range(20))
    assert admission.program_limit(busy) is None and admission.admitted == 20


def test_the_limit_is_how_many_working_sets_fit_the_kv_cache() -> None:
    # 400 tokens = 25 blocks: four programs fill 100 blocks; 90% of them fit three
    assert _with_working_set(400).program_limit(ENGINE) == 4
    assert _with_working_set(400, AdmissionParams(kv_limit=0.9)).program_limit(ENGINE) == 3
    assert _with_working_set(401).program_limit(ENGINE) == 3  # 26 blocks
    assert _with_working_set(8000).program_limit(ENGINE) == 1  # never below one
    two = ENGINE * 2  # the engines' blocks add up
    assert _with_working_set(400).program_limit(two) == 8


def test_past_the_limit_programs_wait_first_come_first_served_and_go_in_as_others_leave() -> None:
    admission = _with_working_set(400)
    for i in range(4):
        assert admission.arrive(f"run{i}", 1.0, ENGINE).verdict is Verdict.ADMIT
    first = admission.arrive("wait0", 2.0, ENGINE)
    second = admission.arrive("wait1", 3.0, ENGINE)
    assert (first.verdict, first.position, second.verdict, second.position) == (Verdict.WAIT, 0, Verdict.WAIT, 1)
    assert admission.admit_waiting(4.0, ENGINE) == []  # nobody left
    admission.leave("run0")
    assert admission.admit_waiting(5.0, ENGINE) == ["wait0"]
    assert admission.is_admitted("wait0") and admission.waiting_ids() == ["wait1"]
    # a newcomer does not overtake the queue even when a program has just left
    admission.leave("run1")
    assert admission.arrive("late", 6.0, ENGINE).verdict is Verdict.WAIT
    assert admission.admit_waiting(6.0, ENGINE) == ["wait1"]


def test_the_working_set_follows_the_programs_that_finish() -> None:
    admission = _with_working_set(1600, AdmissionParams(kv_limit=1.0, footprint_window=3))  # 100 blocks each
    assert admission.program_limit(ENGINE) == 1
    for i in range(3):  # three short programs replace the long one's figure
        admission.arrive(f"short{i}", 1.0, ENGINE)
        admission.context(f"short{i}", 100)
        admission.context(f"short{i}", 160)  # its context grew: the last call's counts
        admission.leave(f"short{i}")
    assert admission.working_set() == 160 and admission.program_limit(ENGINE) == 10


def test_no_program_waits_longer_than_half_a_typical_life() -> None:
    admission = _with_working_set(1600)  # one program at a time
    admission.arrive("a", 0.0, ENGINE)
    admission.leave("a", 20.0)  # lives: 20 s, so a program waits at most 10 s
    assert admission.longest_hold() == pytest.approx(10.0)
    admission.arrive("b", 20.0, ENGINE)
    assert admission.arrive("c", 21.0, ENGINE).verdict is Verdict.WAIT
    assert admission.admit_waiting(30.0, ENGINE) == []  # 9 s: still no room
    assert admission.admit_waiting(31.0, ENGINE) == ["c"]  # 10 s: in, room or not
    assert admission.admitted == 2
    unbounded = _with_working_set(1600, AdmissionParams(kv_limit=1.0, max_hold_lives=None))
    unbounded.arrive("a", 0.0, ENGINE)
    unbounded.leave("a", 20.0)
    unbounded.arrive("b", 20.0, ENGINE)
    unbounded.arrive("c", 21.0, ENGINE)
    assert unbounded.longest_hold() is None and unbounded.admit_waiting(1000.0, ENGINE) == []


def test_a_full_queue_refuses_with_a_retry_after_from_the_admission_rate() -> None:
    admission = _with_working_set(1600, AdmissionParams(kv_limit=1.0, queue_per_slot=0.5))  # one admitted, two wait
    assert admission.arrive("running", 0.0, ENGINE).verdict is Verdict.ADMIT
    assert [admission.arrive(f"w{i}", 1.0, ENGINE).verdict for i in range(2)] == [Verdict.WAIT] * 2
    refused = admission.arrive("too-many", 1.0, ENGINE)
    # two admissions in the last 60 s, one every 30 s: the two waiting and this one, 90 s, capped at 60 s
    assert refused.verdict is Verdict.REFUSE and refused.retry_after == pytest.approx(60.0)
    assert not admission.is_admitted("too-many") and admission.waiting == 2  # no state changed
    quiet = ProgramAdmission(AdmissionParams(max_retry_after=30.0))
    assert quiet.retry_after(100.0, 5) == 30.0  # no admission seen: the longest wait


def test_a_refused_program_is_told_to_come_back_within_the_longest_hold() -> None:
    admission = _with_working_set(1600, AdmissionParams(kv_limit=1.0, queue_per_slot=0.25))  # one runs, one waits
    admission.arrive("a", 0.0, ENGINE)
    admission.leave("a", 20.0)  # lives: 20 s, so none waits longer than 10 s
    admission.arrive("running", 20.0, ENGINE)
    assert admission.arrive("waiting", 20.0, ENGINE).verdict is Verdict.WAIT
    refused = admission.arrive("late", 21.0, ENGINE)
    # three admissions in the last minute: the one waiting and this one would take 40 s at that rate,
    # but in 10 s the one waiting is in, room or not, and the queue has a place again
    assert refused.verdict is Verdict.REFUSE and refused.retry_after == pytest.approx(10.0)
    assert admission.retry_after(21.0, 0) == pytest.approx(10.0)


def test_higher_classes_go_first_and_sheddable_programs_are_refused_rather_than_queued() -> None:
    admission = _with_working_set(1600)
    admission.arrive("running", 0.0, ENGINE)
    admission.arrive("normal", 1.0, ENGINE)
    urgent = admission.arrive("urgent", 2.0, ENGINE, priority=10)
    assert urgent.verdict is Verdict.WAIT and urgent.position == 0
    assert admission.waiting_ids() == ["urgent", "normal"]
    shed = admission.arrive("batch", 3.0, ENGINE, priority=-1)
    assert shed.verdict is Verdict.REFUSE and shed.retry_after is not None and admission.waiting == 2
    admission.leave("running")
    assert admission.admit_waiting(4.0, ENGINE) == ["urgent"]
    # with room and nobody of its class or higher waiting, a higher class goes straight in
    admission.leave("urgent")
    assert admission.arrive("vip", 5.0, ENGINE, priority=5).verdict is Verdict.ADMIT


def test_a_waiting_program_can_give_up_and_a_known_one_cannot_arrive_twice() -> None:
    admission = _with_working_set(1600)
    admission.arrive("running", 0.0, ENGINE)
    admission.arrive("impatient", 1.0, ENGINE)
    with pytest.raises(AlreadyKnown):
        admission.arrive("impatient", 2.0, ENGINE)
    with pytest.raises(AlreadyKnown):
        admission.arrive("running", 2.0, ENGINE)
    assert admission.leave("impatient") and admission.waiting == 0
    assert not admission.leave("never-seen")
    with pytest.raises(ValueError, match="tokens"):
        admission.context("running", -1)


@pytest.mark.parametrize(("field", "value"), [("kv_limit", 0.0), ("queue_per_slot", -1.0), ("min_retry_after", 0.0),
                                              ("rate_window", 0.0), ("footprint_window", 0), ("max_hold_lives", 0.0)])
def test_bad_parameters_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field.split("_")[0]):
        AdmissionParams(**{field: value})


def test_an_engine_load_must_make_sense() -> None:
    with pytest.raises(ValueError, match="slots"):
        EngineLoad(running=0, waiting=0, slots=0, kv_blocks_used=0, kv_blocks_total=10)
    with pytest.raises(ValueError, match="waiting"):
        EngineLoad(running=0, waiting=-1, slots=1, kv_blocks_used=0, kv_blocks_total=10)
    load = EngineLoad(running=3, waiting=0, slots=4, kv_blocks_used=5, kv_blocks_total=10)
    assert load.kv_usage == 0.5 and load.free_slots == 1


def test_a_long_stream_of_one_call_programs_keeps_only_the_rate_window() -> None:
    admission = ProgramAdmission(AdmissionParams(rate_window=60.0))
    for second in range(10_000):  # one program a second, each gone at once, for nearly three hours
        admission.arrive(f"call-{second}", float(second), ENGINE)
        admission.leave(f"call-{second}")
    # the admission rate is the last minute's (one a second), and memory is that minute's, not the run's
    assert admission.retry_after(10_000.0, 9) == pytest.approx(10.0, rel=0.05)
    assert len(admission._recent) <= 61 and admission.admitted == 0
