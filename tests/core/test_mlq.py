import math
import random

import pytest

from autellix.core import MultiLevelQueue, ProgramView, QueueSpec
from autellix.core.mlq import backlog_ratio, backlog_ratio_floor

SPEC = QueueSpec(boundaries=(10.0, 100.0), quanta=(2.0, 4.0, math.inf), beta=math.inf)


def lookup_from(programs: dict[str, ProgramView]):
    return programs.__getitem__


def take(n):
    taken = []

    def fits(call):
        taken.append(call)
        return len(taken) <= n

    return fits


def test_arrival_placement_by_program_priority():
    programs = {"new": ProgramView(0, 0, 0), "mid": ProgramView(10, 0, 10), "old": ProgramView(500, 0, 500)}
    q = MultiLevelQueue(SPEC, lookup_from(programs))
    for pid in ("old", "mid", "new"):
        q.add(pid, pid, now=0.0)
    assert [c.call_id for c in q] == ["new", "mid", "old"]
    assert q.queue_lengths() == [1, 1, 1]
    assert [c.quantum_left for c in q] == [2.0, 4.0, math.inf]


def test_classic_mlfq_places_every_call_in_q1():
    programs = {"old": ProgramView(500, 0, 500)}
    q = MultiLevelQueue(SPEC, lookup_from(programs), places_by_priority=False)
    assert q.add("c", "old", now=0.0).level == 0


def test_fcfs_inside_a_queue_and_batch_stops_at_first_misfit():
    q = MultiLevelQueue(SPEC, lambda pid: ProgramView(0, 0, 0))
    for i in range(4):
        q.add(i, f"p{i}", now=float(i))
    assert [c.call_id for c in q.form_batch(take(2))] == [0, 1]
    # a misfit stops the walk even if later calls would fit
    assert [c.call_id for c in q.form_batch(lambda c: c.call_id != 1)] == [0]


def test_demotion_after_quantum_and_preemption_by_a_newcomer():
    q = MultiLevelQueue(SPEC, lambda pid: ProgramView(0, 0, 0))
    q.add("long", "a", now=0.0)
    for t in range(2):
        q.rebalance(float(t))
        batch = q.form_batch(take(1))
        assert [c.call_id for c in batch] == ["long"]
        q.advance(t + 1.0)
        q.charge(batch)
    q.add("short", "b", now=2.0)
    q.rebalance(2.0)
    assert q.get("long").level == 1 and q.get("long").demotions == 1
    assert [c.call_id for c in q.form_batch(take(1))] == ["short"]  # "long" is preempted
    assert q.get("long").model_time == 2.0 and q.get("long").wait == 0.0
    q.advance(3.0)
    assert q.get("long").wait == 1.0  # waiting while preempted


def test_anti_starvation_promotes_and_resets_only_the_call():
    programs = {"old": ProgramView(priority=50, wait=30, service=50), "new": ProgramView(0, 0, 0)}
    spec = QueueSpec(boundaries=SPEC.boundaries, quanta=SPEC.quanta, beta=1.0)
    q = MultiLevelQueue(spec, lookup_from(programs))
    starving = q.add("s", "old", now=0.0)
    q.add("n", "new", now=0.0)
    assert starving.level == 1
    for t in range(25):  # "n" holds the only slot; "s" waits
        q.rebalance(float(t))
        q.form_batch(take(1))
        if starving.level == 0:
            break
    # (30 + wait) / 50 >= 1 once wait reaches 20
    assert starving.level == 0 and starving.promotions == 1
    assert starving.wait == 0.0 and starving.total_wait == 20.0


def test_remove_settles_times_and_checks_membership():
    q = MultiLevelQueue(SPEC, lambda pid: ProgramView(0, 0, 0))
    q.add("c", "p", now=0.0)
    q.form_batch(take(1))
    done = q.remove("c", now=3.0)
    assert done.total_model_time == 3.0 and "c" not in q and len(q) == 0
    q.check_invariants()


def one_slot_queue(programs: dict[str, ProgramView], newcomers: int) -> MultiLevelQueue:
    """Queues with beta 1 over ``programs`` and ``newcomers`` programs not served yet (``new0``, ``new1``, ...)."""
    programs |= {f"new{i}": ProgramView(0, 0, 0) for i in range(newcomers)}
    return MultiLevelQueue(QueueSpec(boundaries=SPEC.boundaries, quanta=SPEC.quanta, beta=1.0), lookup_from(programs))


def sweep_until(q: MultiLevelQueue, done, seconds: int) -> tuple[list, float]:
    """A sweep and a one-call batch each second until ``done()``: the calls moved, and the last sweep's time."""
    moved: list = []
    for t in range(seconds):
        moved += q.rebalance(float(t))
        q.form_batch(take(1))
        if done():
            break
    return moved, float(t)


def test_a_promoted_call_takes_its_place_in_q1_by_arrival():
    """At Q1's tail a promoted call would queue again behind every newcomer that
    arrived while it starved; it goes ahead of those, behind the earlier ones."""
    q = one_slot_queue({"old": ProgramView(priority=50, wait=30, service=50)}, newcomers=3)
    q.add("n0", "new0", now=0.0)
    starving = q.add("s", "old", now=0.0)
    q.add("n1", "new1", now=1.0)
    q.add("n2", "new2", now=2.0)
    sweep_until(q, lambda: starving.level == 0, 25)  # "n0" holds the only slot; the others wait
    assert starving.level == 0 and starving.promotions == 1
    assert [c.call_id for c in q] == ["n0", "s", "n1", "n2"]
    assert [c.rank for c in q] == sorted(c.rank for c in q)
    q.check_invariants()
    q.remove("n0", now=21.0)  # the slot frees: the promoted call is next
    assert [c.call_id for c in q.form_batch(take(1))] == ["s"]


def test_promoted_calls_take_the_places_of_their_arrivals_least_served_program_first():
    """A large program lifted for starving does not hold back a small one lifted with it: the promoted calls'
    arrival places go to them by their programs' charged service, the least first; a newcomer between them
    keeps its place, and the order holds until the programs' views change."""
    programs = {"big": ProgramView(priority=60, wait=0, service=60),
                "small": ProgramView(priority=12, wait=0, service=12)}
    q = one_slot_queue(programs, newcomers=2)
    q.add("n0", "new0", now=0.0)
    big = q.add("b", "big", now=0.0)
    q.add("n1", "new1", now=1.0)
    small = q.add("s", "small", now=2.0)
    moved, t = sweep_until(q, lambda: big.level == small.level == 0, 80)  # until both starving calls are lifted
    assert big.promotions == small.promotions == 1 and big in moved and small in moved
    assert [c.call_id for c in q] == ["n0", "s", "n1", "b"]
    assert [c.rank for c in q] == sorted(c.rank for c in q)
    q.check_invariants()
    assert q.rebalance(float(t) + 0.5) == []  # nothing changed but time: no reorder
    programs["small"] = ProgramView(priority=90, wait=0, service=90)  # the small one turns out the larger
    assert q.rebalance(float(t) + 1.0) == [big, small]
    assert [c.call_id for c in q] == ["n0", "b", "n1", "s"]
    q.check_invariants()


def test_backlog_ratio_sums_served_programs_and_counts_unfinished_calls_twice():
    programs = {"a": ProgramView(priority=10, wait=6, service=10), "b": ProgramView(priority=2, wait=1, service=2),
                "fresh": ProgramView(0, 0, 0)}
    q = MultiLevelQueue(SPEC, lookup_from(programs))
    ran = q.add("a1", "a", now=0.0)
    q.add("b1", "b", now=0.0)
    q.add("f1", "fresh", now=0.0)  # never served: no ratio, left out
    q.mark_running([ran.call_id])
    q.advance(2.0)  # "a1" ran 2 s (counted as 4: halfway on average), the others waited 2 s
    lookup = lookup_from(programs)
    assert backlog_ratio(q, lookup) == (6 + 1 + 2) / (10 + 4 + 2)
    assert backlog_ratio([], lookup) == 0.0


def test_under_a_backlog_only_programs_that_fare_worse_than_the_rest_are_promoted():
    """beta 1, but every program has waited 3 times its service: promoting all of
    them would only reshuffle the queue, so the bound rises to the backlog's ratio."""
    programs = {"worse": ProgramView(priority=20, wait=80, service=20),
                "alike": ProgramView(priority=20, wait=45, service=20),
                **{f"busy{i}": ProgramView(priority=20, wait=40, service=20) for i in range(4)}}
    spec = QueueSpec(boundaries=SPEC.boundaries, quanta=SPEC.quanta, beta=1.0)
    q = MultiLevelQueue(spec, lookup_from(programs))
    worse, alike = q.add("w", "worse", now=0.0), q.add("a", "alike", now=0.0)
    for i in range(4):
        q.add(f"b{i}", f"busy{i}", now=0.0)
    moved = q.rebalance(0.0)
    assert q.starvation_bound == (80 + 45 + 4 * 40) / (6 * 20)  # 2.375: "alike" (2.25) stays, "worse" (4) goes
    assert moved == [worse] and worse.level == 0 and alike.level == 1
    q.check_invariants()


def test_the_starvation_bound_is_beta_the_backlogs_ratio_above_it_or_a_multiple_of_a_light_one():
    spec = QueueSpec(boundaries=SPEC.boundaries, quanta=SPEC.quanta, beta=4.0, backlog_factor=3.0)
    assert spec.starvation_bound(6.0) == 6.0  # a heavy backlog: a program that waits like the others stays
    assert spec.starvation_bound(2.0) == 4.0  # beta
    assert spec.starvation_bound(0.5) == 1.5  # a light backlog: three times its ratio
    assert spec.starvation_bound(0.0) == 0.0
    paper = QueueSpec(boundaries=SPEC.boundaries, quanta=SPEC.quanta, beta=4.0)  # no factor: never under beta
    assert paper.starvation_bound(0.5) == 4.0 and paper.starvation_bound(6.0) == 6.0
    off = QueueSpec(boundaries=SPEC.boundaries, quanta=SPEC.quanta, beta=math.inf, backlog_factor=3.0)
    assert off.starvation_bound(0.5) == math.inf
    with pytest.raises(ValueError, match="backlog_factor"):
        QueueSpec(boundaries=SPEC.boundaries, quanta=SPEC.quanta, beta=4.0, backlog_factor=0.5)


@pytest.mark.parametrize(("factor", "promoted"), [(3.0, True), (math.inf, False)])
def test_under_a_light_backlog_a_program_that_waits_far_longer_than_the_others_is_promoted(factor, promoted):
    """Every program has waited far less than beta (4) times its service; one has waited
    1.5 times, the rest 0.2 times: with a factor of 3 it is lifted (3 x 0.44 < 1.5)."""
    programs = {"worse": ProgramView(priority=20, wait=30, service=20),
                **{f"busy{i}": ProgramView(priority=20, wait=4, service=20) for i in range(4)}}
    spec = QueueSpec(boundaries=SPEC.boundaries, quanta=SPEC.quanta, beta=4.0, backlog_factor=factor)
    q = MultiLevelQueue(spec, lookup_from(programs))
    worse = q.add("w", "worse", now=0.0)
    for i in range(4):
        q.add(f"b{i}", f"busy{i}", now=0.0)
    moved = q.rebalance(0.0)
    assert q.starvation_bound == pytest.approx(min(factor * (30 + 16) / 100, 4.0))
    assert (moved == [worse] and worse.level == 0) if promoted else (moved == [] and worse.level == 1)
    q.check_invariants()


@pytest.mark.parametrize("seed", range(40))
def test_the_backlog_ratio_never_falls_below_its_floor_while_the_running_calls_run(seed):
    """What a simulator that skips steps relies on: with no call arriving or leaving, the ratio at
    any later time is at least ``backlog_ratio_floor`` now."""
    rng = random.Random(seed)
    programs = {f"p{i}": ProgramView(priority=0, wait=rng.choice([0.0, rng.uniform(0, 50)]),
                                     service=rng.choice([0.0, rng.uniform(0, 50)])) for i in range(6)}
    q = MultiLevelQueue(SPEC, lookup_from(programs))
    calls = [q.add(f"c{i}", f"p{rng.randrange(6)}", now=rng.uniform(0, 5)) for i in range(rng.randint(1, 12))]
    q.mark_running([c.call_id for c in calls if rng.random() < 0.4])
    q.advance(6.0)
    q.mark_running([c.call_id for c in calls if rng.random() < 0.4])
    lookup = lookup_from(programs)
    floor = backlog_ratio_floor(q, lookup)
    for t in (6.001, 6.5, 8.0, 20.0, 100.0, 1e4):
        q.advance(t)
        assert backlog_ratio(q, lookup) >= floor - 1e-9, t


def test_the_backlog_counts_a_subagent_trees_totals_once():
    """Every member of a tree reads the tree's totals; counted per member, a tree of four would
    weigh four times in the backlog, and a subagent fan-out would rank unlike the one program it is."""
    tree = ProgramView(priority=20, wait=60, service=20, tree="root")
    programs = {**{f"root/agent{i}": tree for i in range(4)}, "chat": ProgramView(priority=20, wait=0, service=20)}
    q = MultiLevelQueue(SPEC, lookup_from(programs))
    for pid in programs:
        q.add(pid, pid, now=0.0)
    lookup = lookup_from(programs)
    assert backlog_ratio(q, lookup) == (60 + 0) / (20 + 20)
    assert backlog_ratio_floor(q, lookup) == (60 + 0) / (20 + 20)


def test_a_new_programs_round_of_calls_does_not_take_the_slots_ahead_of_a_program_with_a_little_service():
    """Attained service counts a call once it has finished: without what its calls in
    flight have committed it to, a program that opens eight calls at once ranks as one
    that has had no service until the first finishes, and its round runs ahead of a
    single-threaded program that has had one short call."""
    from autellix.core import PLAS, ProcessTable

    table = ProcessTable(PLAS())
    spec = QueueSpec(boundaries=(0.5, 1.0, 2.0, 4.0, 8.0), quanta=(math.inf,) * 6, beta=4.0)
    q = MultiLevelQueue(spec, table.view)
    table.start("chat", now=0.0)
    table.call_arrived("chat", "chat0", now=0.0)
    table.call_finished("chat", "chat0", now=1.0, model_time=1.0)
    table.start("wide", now=1.0)
    for i in range(8):
        table.call_arrived("wide", f"wide{i}", now=1.0)
        q.add(f"wide{i}", "wide", now=1.0)
    table.call_arrived("chat", "chat1", now=1.0)
    q.add("chat1", "chat", now=1.0)
    q.rebalance(1.1)  # the wide program's waiting calls follow its priority; none has waited long
    assert q.form_batch(take(2))[0].call_id == "chat1"
    assert not any(c.promoted for c in q)
