"""The multi-level queue's step-time shortcuts decide exactly what the straightforward queue decides.

``ReferenceQueue`` is the queue as it was before the scheduler step's optimisations of 2026-12-06
(docs/results/2026-12-06-scheduler-step.md), kept verbatim: every sweep visits every call through
``_program_totals``, charging is a pass of its own after ``advance``, marking the running calls
rebuilds the running set. The order of promoted calls (``_order_promoted``) is the queue's own,
run after the reference's sweep as after the queue's. Random sequences of arrivals, departures,
steps, view changes and rebalances are run through both; every call's level, place, clocks and counters, every list of
moved calls and every starvation bound must come out identical, to the last bit. And a sweep
before ``quiet_until`` moves no call (the promise the engine's planner skips sweeps on).
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Iterable, Iterator

import pytest

from autellix.core import MultiLevelQueue, ProgramView, QueueSpec
from autellix.core.mlq import ProgramViews, QueuedCall, _program_totals, _served_ratio


class ReferenceQueue(MultiLevelQueue):
    """The queue before the step-time optimisations (46883fb), verbatim where they changed it."""

    def __iter__(self) -> Iterator[QueuedCall]:
        for queue in self._queues:
            calls = queue._calls
            for place in queue._places:
                yield calls[place]

    def charge(self, batch: Iterable[QueuedCall], steps: int = 1) -> None:
        for call in batch:
            call.quantum_left -= steps
            call.steps += steps
            self._charged[call.call_id] = call

    def ran(self, now: float, steps: int = 1) -> None:
        # CallPlanner.step_done before: advance, then charge the running calls
        self.advance(now)
        self.charge(self.running, steps=steps)

    def mark_running(self, call_ids: Iterable[Hashable]) -> None:
        self._set_running([c for i in call_ids if (c := self._calls.get(i)) is not None])

    def _set_running(self, calls: list[QueuedCall]) -> None:
        before, after = self._running, {c.call_id: c for c in calls}
        for call_id in before.keys() - after.keys():
            before[call_id].running = False
        for call_id in after.keys() - before.keys():
            after[call_id].running = True
        self._running = after

    def rebalance(self, now: float, *, sweep: bool = True) -> list[QueuedCall]:
        self.advance(now)
        charged = list(self._charged.values())
        self._charged.clear()
        if not sweep:
            return [call for call in charged if self._demote_spent(call)]
        moved: list[QueuedCall] = []
        spec = self.spec
        check_starvation = not math.isinf(spec.beta)
        candidates = list(self._calls.values())
        views = ProgramViews(self._lookup)
        levels: dict[str, int] = {}
        clock = self._shared_clock[0]
        waits = [max(0.0, clock - call.wait_origin - call.model_time) for call in candidates]
        if check_starvation:
            self.starvation_bound = spec.starvation_bound(
                _served_ratio(_program_totals(zip(candidates, waits, strict=True), views.__getitem__)))
        bound = self.starvation_bound
        for call, call_wait in zip(candidates, waits, strict=True):
            if self._demote_spent(call):
                moved.append(call)
            elif call.steps == 0 and not call.promoted and self.places_by_priority:
                level = levels.get(call.program_id)
                if level is None:
                    level = levels[call.program_id] = spec.level_for(views[call.program_id].priority)
                if level != call.level:
                    self._move(call, level, by_arrival=True)
                    moved.append(call)
            if check_starvation and call.level > 0:
                program = views[call.program_id]
                wait = program.wait + call_wait
                service = program.charged + call.model_time
                if wait > 0 and (service <= 0 or wait >= bound * service):
                    call.wait_origin, call.model_time = now, 0.0
                    call.promoted = True
                    call.promotions += 1
                    self._move(call, 0, by_arrival=True)
                    moved.append(call)
        if check_starvation:
            self._order_promoted({call.program_id: views[call.program_id].charged for call in candidates}, moved)
        return moved


FIELDS = ("level", "entered", "quantum_left", "model_time", "total_model_time", "wait_origin", "steps", "running",
          "promoted", "promotions", "demotions")


def snapshot(queue: MultiLevelQueue) -> list[tuple]:
    """Every call in queue order, with every field a decision reads or a record reports."""
    return [(call.call_id, *(getattr(call, name) for name in FIELDS), call.wait, call.total_wait) for call in queue]


SPECS = {
    "default layout": QueueSpec(boundaries=(0.5, 1.0, 2.0, 4.0, 8.0), quanta=(math.inf,) * 6, beta=4.0,
                                backlog_factor=3.0),
    "finite quanta": QueueSpec(boundaries=(0.5, 2.0, 8.0), quanta=(3.0, 6.0, 12.0, math.inf), beta=2.0,
                               backlog_factor=3.0),
    "beta only": QueueSpec(boundaries=(1.0, 4.0), quanta=(4.0, 8.0, 16.0), beta=1.0),
    "no anti-starvation": QueueSpec(boundaries=(0.5, 2.0), quanta=(2.0, 4.0, math.inf), beta=math.inf),
}


def random_view(rng: random.Random, trees: list[str]) -> ProgramView:
    service = rng.choice([0.0, rng.uniform(0, 0.4), rng.uniform(0, 12)])
    committed = rng.choice([0.0, 0.0, rng.uniform(0, 3)])
    return ProgramView(priority=service + committed, wait=rng.choice([0.0, rng.uniform(0, 20)]), service=service,
                       tree=rng.choice(trees), committed=committed)


@pytest.mark.parametrize("places_by_priority", [True, False])
@pytest.mark.parametrize("layout", sorted(SPECS))
@pytest.mark.parametrize("seed", range(6))
def test_the_optimised_queue_decides_as_the_reference(layout: str, places_by_priority: bool, seed: int) -> None:
    rng = random.Random(seed * 1000 + sorted(SPECS).index(layout) * 10 + places_by_priority)
    spec = SPECS[layout]
    programs = [f"p{i}" for i in range(10)]
    trees = ["", "", "", "tree-a", "tree-b"]
    views = {p: random_view(rng, trees) for p in programs}
    fast = MultiLevelQueue(spec, views.__getitem__, places_by_priority=places_by_priority)
    slow = ReferenceQueue(spec, views.__getitem__, places_by_priority=places_by_priority)
    now, next_id, running = 0.0, 0, []
    moved_any = promoted_any = 0
    for _ in range(700):
        op = rng.random()
        now += rng.choice([0.0, 1e-6, 0.003, 0.01, 0.05, 0.4, 1.5])
        if op < 0.18 or not fast._calls:
            call_id, next_id = f"c{next_id}", next_id + 1
            program = rng.choice(programs)
            assert snapshot_one(fast.add(call_id, program, now)) == snapshot_one(slow.add(call_id, program, now))
        elif op < 0.26:
            call_id = rng.choice(list(fast._calls))
            assert snapshot_one(fast.remove(call_id, now)) == snapshot_one(slow.remove(call_id, now))
        elif op < 0.46:
            ids = list(fast._calls)
            if rng.random() < 0.5 and running:  # the same calls, often in the same order
                choice = running if rng.random() < 0.7 else rng.sample(running, len(running))
            else:
                choice = rng.sample(ids, min(len(ids), rng.randint(0, 5))) + ["gone"] * (rng.random() < 0.1)
            running = [i for i in choice if i in fast._calls]
            fast.mark_running(choice)
            slow.mark_running(choice)
        elif op < 0.66:
            steps = rng.choice([1, 1, 1, 4])
            fast.ran(now, steps)
            slow.ran(now, steps)
        elif op < 0.72:
            views[rng.choice(programs)] = random_view(rng, trees)
        else:
            sweep = rng.random() < 0.5
            got = [c.call_id for c in fast.rebalance(now, sweep=sweep)]
            want = [c.call_id for c in slow.rebalance(now, sweep=sweep)]
            assert got == want
            moved_any += bool(want)
            promoted_any += sum(c.promoted for c in slow._calls.values())
            assert fast.starvation_bound == slow.starvation_bound
        assert snapshot(fast) == snapshot(slow)
        assert [c.call_id for c in fast] == [c.call_id for c in slow]
        assert fast.queue_lengths() == slow.queue_lengths()
        assert [c.call_id for c in fast.running] == [c.call_id for c in slow.running]
    fast.check_invariants()
    # the sequences move calls, unless nothing can: every call in Q1 for good
    lifted = places_by_priority or not all(math.isinf(q) for q in spec.quanta)
    assert bool(moved_any) == lifted
    if lifted and not math.isinf(spec.beta):
        assert promoted_any


def snapshot_one(call: QueuedCall) -> tuple:
    return (call.call_id, *(getattr(call, name) for name in FIELDS), call.wait, call.total_wait)


@pytest.mark.parametrize("layout", ["default layout", "finite quanta", "beta only"])
@pytest.mark.parametrize("seed", range(10))
def test_no_sweep_before_quiet_until_moves_a_call(layout: str, seed: int) -> None:
    """Whatever the state, once ``quiet_until`` promises a time, sweeps before it (with nothing
    changing but time, and no quantum spent) move nothing; the sweeps are the reference's."""
    rng = random.Random(seed)
    spec = SPECS[layout]
    views = {f"p{i}": random_view(rng, ["", "", "tree-a"]) for i in range(8)}
    queue = ReferenceQueue(spec, views.__getitem__)
    now = 0.0
    for i in range(60):  # a history: arrivals, steps of a few running calls, sweeps
        now += rng.uniform(0, 0.3)
        queue.add(f"c{i}", rng.choice(list(views)), now)
        if i % 7 == 0:
            queue.mark_running(rng.sample(list(queue._calls), min(4, len(queue._calls))))
        now += rng.uniform(0, 0.2)
        queue.ran(now)
        queue.rebalance(now, sweep=True)
    promised = skipped = 0
    for _ in range(30):
        until = MultiLevelQueue.quiet_until(queue)
        if until <= now:
            # no promise: let time pass and the reference sweep move what it moves
            now += rng.uniform(0.01, 1.0)
            queue.ran(now)
            queue.rebalance(now, sweep=True)
            continue
        promised += 1
        # sweeps at times before the promise: with quanta, stop at the first spent quantum
        horizon = min(until, now + 50.0)
        while True:
            now += rng.uniform(0.0, (horizon - now) * 0.5 + 1e-3)
            if now >= horizon:
                break
            queue.ran(now)
            if MultiLevelQueue.spent(queue):
                break
            assert queue.rebalance(now, sweep=True) == [], f"a sweep at {now} < {until} moved a call"
            skipped += 1
        now = max(now, until) + rng.uniform(0, 0.5)
        queue.ran(now)
        queue.rebalance(now, sweep=True)
    assert promised and skipped


def test_quiet_until_is_the_first_promotion() -> None:
    """One waiting call of a served program behind one running call: promised up to the time its
    wait meets the bound, and promoted at the first sweep after it."""
    spec = QueueSpec(boundaries=(1.0,), quanta=(math.inf, math.inf), beta=4.0)  # no backlog factor: bound = beta
    views = {"old": ProgramView(priority=2.0, wait=0.0, service=2.0), "new": ProgramView(0.0, 0.0, 0.0)}
    queue = MultiLevelQueue(spec, views.__getitem__)
    queue.add("run", "new", 0.0)
    queue.add("wait", "old", 0.0)
    queue.mark_running(["run"])
    queue.ran(1.0)
    assert queue.rebalance(1.0) == []
    until = queue.quiet_until()
    # the bound is at least beta; the waiting call meets 4 x 2 s of service at 8 s
    assert until == pytest.approx(8.0, abs=1e-4) and until < 8.0
    queue.ran(until)
    assert queue.rebalance(until) == []
    queue.ran(8.0 + 1e-3)
    assert [c.call_id for c in queue.rebalance(8.0 + 1e-3)] == ["wait"]


def test_changes_count_what_time_does_not_change() -> None:
    queue = MultiLevelQueue(SPECS["finite quanta"], lambda program: ProgramView(0.0, 0.0, 0.0))
    seen = queue.changes
    queue.add("a", "p", 0.0)
    queue.add("b", "p", 0.0)
    assert queue.changes == seen + 2
    seen = queue.changes
    queue.mark_running(["a"])
    assert queue.changes == seen + 1
    queue.ran(1.0)
    queue.mark_running(["a"])  # the same calls: nothing changed but time
    queue.rebalance(1.0, sweep=True)
    assert queue.changes == seen + 1
    queue.remove("b", 2.0)
    assert queue.changes == seen + 2


def test_a_running_call_is_promised_nothing_while_the_backlog_lightens() -> None:
    """A running call's ratio falls as it runs, but the bound can fall faster: the backlog's other
    programs all run, their service grows and the light-backlog clause takes the bound under beta.
    ``quiet_until`` promises nothing then, and the reference's sweeps do promote the call."""
    spec = QueueSpec(boundaries=(1.0,), quanta=(math.inf, math.inf), beta=4.0, backlog_factor=3.0)
    views = {"x": ProgramView(priority=1.0, wait=0.0, service=1.0), "y": ProgramView(0.1, 50.0, 0.1)}
    queue = ReferenceQueue(spec, views.__getitem__)
    queue.add("x0", "x", 0.0)
    for i in range(20):
        queue.add(f"y{i}", "y", 4.5)
    queue.mark_running(["x0", *(f"y{i}" for i in range(20))])
    assert queue.rebalance(4.5) == [] and queue.get("x0").level == 1  # it waited 4.5 s for 1 s of service
    assert MultiLevelQueue.quiet_until(queue) <= 4.5
    now = 4.5
    while now < 30 and not queue.get("x0").promoted:
        now += 0.25
        queue.ran(now)
        queue.rebalance(now)
    assert queue.get("x0").promoted and now < 14  # about 7 s later
