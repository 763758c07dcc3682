"""Algorithm 1: the discretised, preemptive multi-level queue.

K queues Q1..QK (index 0..K-1 here). A call enters the queue whose service range
holds its program's priority (or Q1 for program-agnostic policies), runs FCFS
inside it, is demoted when it has used its queue's quantum, and is promoted back
to Q1 (a tenant ahead of its share: to that lead's queue, ``MultiLevelQueue._top_level``)
when its program's wait over its service (attained and committed:
``ProgramView.charged``) reaches the starvation bound, which
follows the queues' programs taken together (``QueueSpec.starvation_bound`` over
``backlog_ratio``: docs/scheduling.md, "A starvation bound that follows the
backlog"). A promoted call
takes its place in Q1 by its arrival, ahead of the calls that arrived after it
(not at Q1's tail), and the promoted calls waiting there share out their places
least charged service first (docs/scheduling.md, "Promotion by arrival"). A batch is the
longest prefix of Q1..QK, in that order, that the engine can fit.

The queue knows nothing of engines or clocks: the caller passes ``now`` and an
``Engine``-specific ``fits`` test, and tells it which calls ran. Running calls
stay in their queue slot, so a higher-queue arrival preempts the lowest-ranked
running call simply by ranking ahead of it in the next batch.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain, pairwise
from typing import Any, NamedTuple

from autellix.core.config import SchedulerConfig


@dataclass(frozen=True)
class QueueSpec:
    """Queue layout: K-1 boundaries, K quanta (steps) and the starvation bound's two ratios."""

    boundaries: tuple[float, ...]
    quanta: tuple[float, ...]
    beta: float
    #: ``SchedulerConfig.backlog_factor``; ``inf``: the bound never falls below ``beta``.
    backlog_factor: float = math.inf

    def __post_init__(self) -> None:
        if len(self.quanta) != len(self.boundaries) + 1:
            raise ValueError("a QueueSpec needs exactly one quantum per queue")
        if not self.backlog_factor >= 1:
            raise ValueError(f"backlog_factor: expected >= 1, got {self.backlog_factor}")

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> QueueSpec:
        return cls(boundaries=config.boundaries, quanta=config.quanta, beta=config.beta,
                   backlog_factor=config.backlog_factor)

    def starvation_bound(self, backlog: float) -> float:
        """The (wait / service) ratio at which a program's calls are promoted, given the
        queues' own ratio ``backlog`` (``backlog_ratio``): ``beta``; the backlog's ratio
        when that is higher (a program that waits like all the others stays put); and
        ``backlog_factor`` times the backlog's ratio when that is lower than ``beta``
        (a program that waits that many times longer than the others is lifted, though
        none has waited ``beta`` times its service). Never below the backlog's ratio.

        The last clause is for engines whose calls run long in large batches: their
        model time grows with the batch, so under a backlog the programs' ratios
        stay far under ``beta`` while least-attained-service keeps the same older
        programs waiting (docs/scheduling.md, "A starvation bound that follows the
        backlog")."""
        upper = max(self.beta, backlog)
        if math.isinf(upper) or math.isinf(self.backlog_factor):  # beta inf: no anti-starvation at all
            return upper
        return min(self.backlog_factor * backlog, upper)

    @property
    def num_queues(self) -> int:
        return len(self.quanta)

    def level_for(self, priority: float) -> int:
        """Index of the queue whose range [lo, hi) holds ``priority``."""
        return bisect_right(self.boundaries, priority)


class ProgramView(NamedTuple):
    """What the queue needs to know of a call's program, read live."""

    priority: float  #: the program's current priority (attained service, and ``committed``)
    wait: float  #: queued time of its finished calls
    service: float  #: attained service
    #: The program whose totals these are when several share them (a subagent's tree root):
    #: ``backlog_ratio`` counts them once. Empty: the call's own program.
    tree: str = ""
    #: Service its calls in flight beside the first have committed it to, not yet attained
    #: (``ProcessTable.view``), or that it declared beyond: part of its priority and of its
    #: anti-starvation denominator.
    committed: float = 0.0
    #: The service its program declared it will take (``ProcessTable.declared``; 0: none said).
    declared: float = 0.0
    #: How far its tenant is ahead of its share (``TenantShares.lead``): part of ``committed``.
    lead: float = 0.0
    #: How much longer than others its program may wait for its service before it starves: its tenant's
    #: weight's shortfall (``TenantShares.patience``; 1 without tenants).
    patience: float = 1.0

    @property
    def charged(self) -> float:
        """The anti-starvation denominator: attained and committed service, times ``patience`` (a
        tenant of a third of another's weight waits three times as long for its service, by design)."""
        return (self.service + self.committed) * self.patience


#: Looks a program up by id. Engines without a process table answer from the
#: request itself; the simulator answers from the shared ``ProcessTable``.
ProgramLookup = Callable[[str], ProgramView]


@dataclass(eq=False, slots=True)
class QueuedCall:
    """One LLM call inside the queues (Algorithm 1's ``c``)."""

    call_id: Hashable
    program_id: str
    level: int
    quantum_left: float
    arrival: float
    seq: int
    #: Execution time since arrival or the last promotion (Algorithm 1's
    #: ``c.model_time``; reset on promotion) and since arrival (never reset).
    model_time: float = 0.0
    total_model_time: float = 0.0
    #: When ``wait`` started counting: arrival, or the last promotion.
    wait_origin: float = 0.0
    #: The queue's clock, shared by its calls; frozen when the call leaves.
    clock: list[float] | None = None
    steps: int = 0
    running: bool = False
    promoted: bool = False
    promotions: int = 0
    demotions: int = 0
    #: Its place inside its current queue (calls run in ascending order): when
    #: it entered the queue, or, once promoted to Q1, when it arrived (``seq``).
    entered: int = 0
    #: 1: its tenant's calls fill the tenant's slot quota without it, so it runs behind every call within
    #: a quota, in its queue's order (``CallPlanner``, ``TenantShares.slot_quotas``); 0 otherwise.
    band: int = 0
    payload: Any = None

    # A call in the engine is always either running or waiting, so its waiting
    # time is its time in the queue minus its execution time. Deriving it keeps
    # each engine step O(running calls) instead of touching every queued call.
    @property
    def wait(self) -> float:
        """Queued time since arrival or the last promotion (Algorithm 1's ``c.wait``)."""
        now = self.clock[0] if self.clock else self.wait_origin
        return max(0.0, now - self.wait_origin - self.model_time)

    @property
    def total_wait(self) -> float:
        """Queued time since arrival: what the process table is charged."""
        now = self.clock[0] if self.clock else self.arrival
        return max(0.0, now - self.arrival - self.total_model_time)

    @property
    def rank(self) -> int:
        """One integer that sorts calls exactly as the engine runs them (calls within their tenant's
        slot quota first, then Q1 first, then by place inside each): what an engine's priority heap
        is keyed by."""
        return (self.band << BAND_SHIFT) | (self.level << RANK_BITS) | self.entered


#: What ``MultiLevelQueue.quiet_until`` allows for rounding: a share of the starvation
#: bound, and seconds of wait.
_BOUND_SLACK = 1e-6
_TIME_SLACK = 1e-6

#: Bits of ``QueuedCall.rank`` left for the FCFS position: 2**40 queue entries
#: per engine lifetime, and ranks stay inside vLLM's int64 priority range.
RANK_BITS = 40
#: Where ``QueuedCall.band`` sits in a rank: above any level, within vLLM's int64 priority range.
BAND_SHIFT = 62


def backlog_ratio(calls: Iterable[QueuedCall], view_of: ProgramLookup) -> float:
    """How long the queues' programs have waited for their service, taken
    together: the sum of their waits (finished calls' and the queued calls')
    over the sum of their service, for every program with a call in ``calls``
    that has had some service (one not served yet has no ratio to compare).

    A call in the queues has not finished, so it has had only part of its
    service, on average half: its model time so far counts twice. Counted
    once, the calls that have just started (their whole wait over a step or
    two of service) inflate the ratio, and a long program behind a stream of
    short ones was no longer promoted at all (tests/core/test_properties.py).

    Anti-starvation promotes at ``QueueSpec.starvation_bound`` of this, at
    least this. In a sustained overload every program
    waits, and a fixed beta promoted each long program in turn ahead of the
    short ones, which then waited behind it: the order drifted to FCFS, and
    the short programs, whose few tokens make the tail of token latency, paid
    (docs/scheduling.md). Tied to the whole, the bound still lifts a program
    that fares worse than the rest and leaves the ones that wait like all the
    others."""
    return _served_ratio(_program_totals(((call, call.wait) for call in calls), view_of))


def _served_ratio(totals: Iterable[list[Any]]) -> float:
    """``backlog_ratio`` of ``_program_totals``."""
    wait = service = 0.0
    for program_wait, program_service, _, _ in totals:
        if program_service > 0:
            wait += program_wait
            service += program_service
    return wait / service if service > 0 else 0.0


def backlog_ratio_floor(calls: Iterable[QueuedCall], view_of: ProgramLookup) -> float:
    """The lowest ``backlog_ratio`` can fall to while the running calls run and the
    others wait, none arriving or leaving: a simulator that skips steps promotes
    nothing before the bound of this could be met.

    Over that time the summed wait grows by one second a second per waiting call
    and the summed service by two per running call (a program with a running
    call counts from its first instant), so the ratio moves monotonically from
    its value now towards waiting / (2 x running)."""
    return _ratio_floor(_program_totals(((call, call.wait) for call in calls), view_of))


def _ratio_floor(totals: Iterable[list[Any]]) -> float:
    """``backlog_ratio_floor`` of ``_program_totals``."""
    wait = service = 0.0
    waiting = running = 0
    for program_wait, program_service, program_waiting, program_running in totals:
        if program_service > 0 or program_running:
            wait += program_wait
            service += program_service
            waiting += program_waiting
            running += program_running
    if not running:
        return wait / service if service > 0 else 0.0
    now = wait / service if service > 0 else math.inf
    return min(now, waiting / (2.0 * running))


def _program_totals(calls: Iterable[tuple[QueuedCall, float]], view_of: ProgramLookup) -> Iterable[list[Any]]:
    """Per program with a call in ``calls`` (each with its wait), a subagent tree as one
    (``ProgramView.tree``): (wait, service with unfinished calls' model time twice, calls
    waiting, calls running). ``view_of`` is called once per call: pass a cache's lookup
    (``ProgramViews``) when it is not cheap."""
    totals: dict[str, list[Any]] = {}
    for call, call_wait in calls:
        program = view_of(call.program_id)
        key = program.tree or call.program_id
        total = totals.get(key)
        if total is None:
            total = totals[key] = [program.wait, program.charged, 0, 0]
        total[0] += call_wait
        total[1] += 2.0 * call.model_time
        total[3 if call.running else 2] += 1
    return totals.values()


class ProgramViews(dict[str, ProgramView]):
    """Program views read once each: ``views[program_id]`` looks a program up on first use
    only (one sweep reads each program's view for every one of its calls)."""

    def __init__(self, lookup: ProgramLookup) -> None:
        super().__init__()
        self._lookup = lookup

    def __missing__(self, program_id: str) -> ProgramView:
        view = self[program_id] = self._lookup(program_id)
        return view


class _Queue:
    """One queue, its calls in ascending ``entered`` order. A call that enters
    it joins the tail in O(1); a promoted call, placed by its arrival, is
    inserted by bisection (O(calls) to shift, a memmove); removal likewise."""

    __slots__ = ("_calls", "_places")

    def __init__(self) -> None:
        self._calls: dict[int, QueuedCall] = {}
        self._places: list[int] = []  # the keys of _calls, ascending

    def __len__(self) -> int:
        return len(self._places)

    def __iter__(self) -> Iterator[QueuedCall]:
        return map(self._calls.__getitem__, self._places)

    def insert(self, call: QueuedCall) -> None:
        place = call.entered
        if not self._places or place > self._places[-1]:
            self._places.append(place)
        else:
            insort(self._places, place)
        self._calls[place] = call

    def hold(self, call: QueuedCall) -> None:
        """The call takes the place it now records, one the queue holds already (calls trading places)."""
        self._calls[call.entered] = call

    def discard(self, call: QueuedCall) -> None:
        del self._calls[call.entered]
        places = self._places
        if places[-1] == call.entered:
            places.pop()
        else:
            del places[bisect_left(places, call.entered)]


class MultiLevelQueue:
    """The K queues, FCFS inside each, with demotion and program-level promotion
    (a promoted call placed in Q1 by its arrival, the least served program's first)."""

    def __init__(self, spec: QueueSpec, lookup: ProgramLookup, *, places_by_priority: bool = True) -> None:
        self.spec = spec
        self.places_by_priority = places_by_priority
        self._lookup = lookup
        self._queues: list[_Queue] = [_Queue() for _ in range(spec.num_queues)]
        self._calls: dict[Hashable, QueuedCall] = {}
        self._running: dict[Hashable, QueuedCall] = {}
        #: Calls charged since the last rebalance: the only ones a quantum can run out for.
        self._charged: dict[Hashable, QueuedCall] = {}
        #: Some queue's quantum is finite: with none (the default layout) no call is ever
        #: demoted, and charging keeps no record of who ran.
        self._spendable = not all(math.isinf(q) for q in spec.quanta)
        self._seq = 0
        self._clock: float | None = None
        self._shared_clock: list[float] = [0.0]  # what calls read their wait from
        #: The (wait / service) ratio the last sweep promoted at (``QueueSpec.starvation_bound``); a
        #: sweep an engine skips (``quiet_until``) leaves it as it was.
        self.starvation_bound = spec.beta
        #: Counts what can make a sweep move a call other than time: a call arrived or left,
        #: changed queue, or started or stopped running (``quiet_until``).
        self.changes = 0

    # ---- membership -------------------------------------------------------
    def __len__(self) -> int:
        return len(self._calls)

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._calls

    def __iter__(self) -> Iterator[QueuedCall]:
        """Calls in scheduling order: Q1 first, by place (FCFS, promoted calls by arrival) inside each."""
        return chain.from_iterable(self._queues)

    def get(self, call_id: Hashable) -> QueuedCall | None:
        return self._calls.get(call_id)

    def queue_lengths(self) -> list[int]:
        return [len(q) for q in self._queues]

    def _arrival_level(self, program_id: str) -> int:
        if not self.places_by_priority:
            return 0
        return self.spec.level_for(self._lookup(program_id).priority)

    def add(self, call_id: Hashable, program_id: str, now: float, payload: Any = None) -> QueuedCall:
        """A call arrives (Algorithm 1, lines 9-14)."""
        if call_id in self._calls:
            raise KeyError(f"call {call_id!r} is already queued")
        self.advance(now)
        level = self._arrival_level(program_id)
        call = QueuedCall(
            call_id=call_id,
            program_id=program_id,
            level=level,
            quantum_left=self.spec.quanta[level],
            arrival=now,
            seq=self._seq,
            entered=self._seq,
            wait_origin=now,
            clock=self._shared_clock,
            payload=payload,
        )
        self._seq += 1
        self._calls[call_id] = call
        self._queues[level].insert(call)
        self.changes += 1
        return call

    def remove(self, call_id: Hashable, now: float) -> QueuedCall:
        """A call leaves (finished or aborted); its times are settled to ``now``."""
        self.advance(now)
        call = self._calls.pop(call_id)
        self._queues[call.level].discard(call)
        self._running.pop(call_id, None)
        self._charged.pop(call_id, None)
        call.running = False
        call.clock = [self._shared_clock[0]]  # its times stop here
        self.changes += 1
        return call

    def _move(self, call: QueuedCall, level: int, *, by_arrival: bool = False) -> None:
        """Into ``level``'s tail, or, ``by_arrival``, at the place its arrival gives it."""
        self._queues[call.level].discard(call)
        call.level = level
        call.quantum_left = self.spec.quanta[level]
        if by_arrival:
            call.entered = call.seq
        else:
            call.entered = self._seq  # joins the tail of its new queue
            self._seq += 1
        self._queues[level].insert(call)
        self.changes += 1

    # ---- time -------------------------------------------------------------
    def advance(self, now: float) -> None:
        """Charge the time since the last call: running calls run, others wait."""
        if self._clock is None or now <= self._clock:
            self._clock = now if self._clock is None else max(self._clock, now)
            self._shared_clock[0] = self._clock
            return
        dt = now - self._clock
        self._clock = self._shared_clock[0] = now
        for call in self._running.values():
            call.model_time += dt
            call.total_model_time += dt

    def charge(self, batch: Iterable[QueuedCall], steps: int = 1) -> None:
        """The batch ran ``steps`` scheduler steps: spend that much quantum."""
        if not self._spendable:  # every quantum infinite: nothing to spend, no one to demote
            for call in batch:
                call.steps += steps
            return
        charged = self._charged
        for call in batch:
            call.quantum_left -= steps
            call.steps += steps
            charged[call.call_id] = call

    def ran(self, now: float, steps: int = 1) -> None:
        """The running calls ran until ``now``, ``steps`` scheduler steps: ``advance(now)`` and
        ``charge`` of the running calls in one pass (the same arithmetic, in the same order)."""
        running = self._running
        if self._clock is None or now <= self._clock or not running:
            self.advance(now)
            self.charge(running.values(), steps=steps)
            return
        dt = now - self._clock
        self._clock = self._shared_clock[0] = now
        if not self._spendable:
            for call in running.values():
                call.model_time += dt
                call.total_model_time += dt
                call.steps += steps
            return
        charged = self._charged
        for call_id, call in running.items():
            call.model_time += dt
            call.total_model_time += dt
            call.quantum_left -= steps
            call.steps += steps
            charged[call_id] = call

    @property
    def running(self) -> list[QueuedCall]:
        return list(self._running.values())

    # ---- one scheduling round ----------------------------------------------
    def rebalance(self, now: float, *, sweep: bool = True) -> list[QueuedCall]:
        """Demotion, anti-starvation and placement (Algorithm 1, lines 15-31).

        ``sweep=False`` does only the demotions (a quantum runs out only for a
        call that ran): an engine sweeps every call for promotion and placement
        less often than it steps. Returns the calls that changed queue, so an
        engine re-keys only those."""
        self.advance(now)
        charged = self._charged
        if not sweep:
            if not charged:
                return []
            spent = [call for call in charged.values() if not call.quantum_left > 0]
            charged.clear()
            return [call for call in spent if self._demote_spent(call)]
        charged.clear()
        return self._sweep(now)

    def _sweep(self, now: float) -> list[QueuedCall]:
        """Every call, in arrival order: demotion, placement, then anti-starvation at the
        bound of the backlog as it stands (``backlog_ratio``, read in the same pass as each
        call's wait). Each program's view is read once."""
        moved: list[QueuedCall] = []
        spec = self.spec
        check_starvation = not math.isinf(spec.beta)
        places = self.places_by_priority
        candidates = list(self._calls.values())
        views = ProgramViews(self._lookup)  # one lookup per program, not per call
        levels: dict[str, int] = {}  # the level of each program's priority, once per program
        tops: dict[str, int] = {}  # the level anti-starvation lifts each program to (``_top_level``)
        # per program: its view's wait and charged service, and its key's backlog totals
        terms: dict[str, tuple[float, float]] = {}
        of_program: dict[str, list[Any]] = {}
        waits: list[float] = []  # QueuedCall.wait, read once per call
        if check_starvation:
            clock = self._shared_clock[0]
            totals: dict[str, list[Any]] = {}
            keep = waits.append
            for call in candidates:
                model_time = call.model_time
                call_wait = clock - call.wait_origin - model_time
                if not call_wait > 0.0:  # max(0.0, ...)
                    call_wait = 0.0
                keep(call_wait)
                program_id = call.program_id
                total = of_program.get(program_id)
                if total is None:
                    program = views[program_id]
                    key = program.tree or program_id
                    total = totals.get(key)
                    if total is None:  # as _program_totals: the first program of a key gives its totals
                        total = totals[key] = [program.wait, program.charged, 0, 0]
                    of_program[program_id] = total
                    terms[program_id] = (program.wait, program.charged)
                total[0] += call_wait
                total[1] += 2.0 * model_time
            self.starvation_bound = spec.starvation_bound(_served_ratio(totals.values()))
        else:
            waits = [0.0] * len(candidates)
        bound = self.starvation_bound
        move = self._move
        for call, call_wait in zip(candidates, waits, strict=True):
            if not call.quantum_left > 0:
                self._demote_spent(call)
                moved.append(call)
            elif places and call.steps == 0:
                # Not started yet: follow the program's priority as it moves, so all
                # waiting calls of one program sit at one level (ATLAS's shared priority),
                # each at the place its arrival gives it: at the tail, the calls that had
                # waited would fall behind a sibling placed there on arrival. A promoted
                # call follows its tenant's lead (``_top_level``).
                level = self._placed_level(call, levels, tops, views)
                if level != call.level:
                    move(call, level, by_arrival=True)
                    moved.append(call)
            if check_starvation and call.level > 0:
                top = self._top_level(call.program_id, tops, views)
                if call.level <= top:
                    continue
                program_wait, program_charged = terms[call.program_id]
                wait = program_wait + call_wait
                service = program_charged + call.model_time
                if wait > 0 and (service <= 0 or wait >= bound * service):
                    call.wait_origin, call.model_time = now, 0.0
                    call.promoted = True
                    call.promotions += 1
                    # Ahead of the calls that arrived after it: at its top queue's tail, a
                    # promoted call would wait again behind every newcomer.
                    move(call, top, by_arrival=True)
                    moved.append(call)
        if check_starvation:
            self._order_promoted({program_id: term[1] for program_id, term in terms.items()}, moved)
        return moved

    def _order_promoted(self, charged: Mapping[str, float], moved: list[QueuedCall]) -> None:
        """The promoted calls waiting in each queue hold the places their arrivals gave them; those places
        go to them least charged service first (``charged``: each queued program's ``ProgramView.charged``,
        plus what the call itself ran). Among programs lifted for starving, a late small one runs before the
        large ones lifted with it (docs/scheduling.md, "Promotion by arrival"). A call's arrival place moves
        with it (``seq``), so a later move by arrival lands on a free place. Orders only change with
        programs' views or the queue's calls, so a sweep ``quiet_until`` lets an engine skip would reorder
        nothing."""
        for queue in self._queues:
            calls = [call for call in queue if call.promoted and not call.running]  # in place order
            if len(calls) < 2:
                continue
            keys = [charged[call.program_id] + call.model_time for call in calls]
            if all(a <= b for a, b in pairwise(keys)):  # as it stands, mostly: sorted at an earlier sweep
                continue
            ranked = [calls[i] for i in sorted(range(len(calls)), key=keys.__getitem__)]
            places = [(call.entered, call.seq) for call in calls]
            listed = {id(call) for call in moved}
            for call, (entered, seq) in zip(ranked, places, strict=True):
                if call.entered != entered:
                    call.entered, call.seq = entered, seq
                    queue.hold(call)
                    if id(call) not in listed:
                        moved.append(call)
            self.changes += 1

    def _placed_level(self, call: QueuedCall, levels: dict[str, int], tops: dict[str, int],
                      views: ProgramViews) -> int:
        """Where a call not started yet belongs: its program's priority's queue (``levels``, once per
        program), or, once promoted, its tenant's top queue (``_top_level``)."""
        if call.promoted:
            return self._top_level(call.program_id, tops, views)
        level = levels.get(call.program_id)
        if level is None:
            level = levels[call.program_id] = self.spec.level_for(views[call.program_id].priority)
        return level

    def _top_level(self, program_id: str, tops: dict[str, int], views: ProgramViews) -> int:
        """The queue anti-starvation lifts the program's calls to: Q1, or, when its tenant is ahead of
        its share, the queue of that lead (``ProgramView.lead``): a starving program is lifted ahead of
        its own tenant's, never past the tenants that are behind theirs."""
        top = tops.get(program_id)
        if top is None:
            lead = views[program_id].lead
            top = tops[program_id] = self.spec.level_for(lead) if lead > 0 and self.places_by_priority else 0
        return top

    def spent(self) -> bool:
        """Has a call charged since the last rebalance used its queue's quantum (it is demoted there)?"""
        return self._spendable and any(not call.quantum_left > 0 for call in self._charged.values())

    def quiet_until(self) -> float:
        """The earliest time a sweep could move a call, if from the queue's clock on nothing
        changes but time: no call arrives, leaves, changes queue, starts or stops running
        (``changes`` stays as it is), no program's view changes, and no call's quantum runs
        out (``spent``, for the caller to check at each sweep). ``math.inf``: never; the
        clock or earlier: a sweep now may move a call.

        A sweep then demotes no one, places no one (each call not started yet sits at its
        program's level already, or the clock is returned) and promotes a call only once it
        meets the starvation bound. A running call's wait stays and its service grows; a
        waiting call's wait grows one second a second; the bound is never below its value
        at the lowest the backlog's ratio can fall to (``backlog_ratio_floor``, or its value
        now, if lower). Rounding is allowed for: the bound by a millionth of itself, the
        times by a microsecond. An engine that sweeps every ``interval`` may skip sweeps
        until then (``autellix.engine.planner``): they would move no call."""
        clock = self._shared_clock[0]
        spec = self.spec
        check_starvation = not math.isinf(spec.beta)
        places = self.places_by_priority
        views = ProgramViews(self._lookup)
        levels: dict[str, int] = {}
        tops: dict[str, int] = {}
        terms: dict[str, tuple[float, float, list[Any]]] = {}
        totals: dict[str, list[Any]] = {}
        lifted: list[tuple[QueuedCall, float, float]] = []  # calls above their top: (call, its wait, its service)
        for call in self._calls.values():
            if not call.quantum_left > 0:
                return clock
            if places and call.steps == 0:
                level = self._placed_level(call, levels, tops, views)
                if level != call.level:
                    return clock
            if not check_starvation:
                continue
            call_wait = clock - call.wait_origin - call.model_time
            if not call_wait > 0.0:
                call_wait = 0.0
            term = terms.get(call.program_id)
            if term is None:
                program = views[call.program_id]
                key = program.tree or call.program_id
                total = totals.get(key)
                if total is None:
                    total = totals[key] = [program.wait, program.charged, 0, 0]
                term = terms[call.program_id] = (program.wait, program.charged, total)
            total = term[2]
            total[0] += call_wait
            total[1] += 2.0 * call.model_time
            total[3 if call.running else 2] += 1
            if call.level > 0 and call.level > self._top_level(call.program_id, tops, views):
                lifted.append((call, term[0] + call_wait, term[1] + call.model_time))
        if not check_starvation:
            return math.inf
        lowest = min(_served_ratio(totals.values()), _ratio_floor(totals.values()))
        bound = spec.starvation_bound(lowest) * (1.0 - _BOUND_SLACK)
        first = math.inf
        for call, wait, service in lifted:
            if service <= 0:
                return clock
            if call.running:  # its wait stays, its service grows
                if wait + _TIME_SLACK >= bound * service:
                    return clock
            else:  # its wait grows a second a second
                at = clock + bound * service - wait - _TIME_SLACK
                if at <= clock:
                    return clock
                if at < first:
                    first = at
        return first

    def _demote_spent(self, call: QueuedCall) -> bool:
        """Demote the call if it has used its queue's quantum (the last queue round-robins)."""
        if call.quantum_left > 0:
            return False
        call.demotions += 1
        call.promoted = False
        self._move(call, min(call.level + 1, self.spec.num_queues - 1))
        return True

    def form_batch(self, fits: Callable[[QueuedCall], bool]) -> list[QueuedCall]:
        """Walk Q1..QK in order and take calls until the first that does not fit.

        Marks the chosen calls running and all others waiting; time from here to
        the next ``advance`` is charged accordingly.
        """
        batch: list[QueuedCall] = []
        for call in self:
            if not fits(call):
                break
            batch.append(call)
        self._set_running(batch)
        return batch

    def mark_running(self, call_ids: Iterable[Hashable]) -> None:
        """The engine runs exactly these calls (it may admit fewer than the batch
        when memory is short): time is charged to them, waiting to the rest."""
        ids = list(call_ids)
        if ids == list(self._running):  # step to step the engine mostly runs the same calls, in the same order
            return
        self._set_running([c for i in ids if (c := self._calls.get(i)) is not None])

    def _set_running(self, calls: list[QueuedCall]) -> None:
        # Flags change only for calls that start or stop: step to step, most keep running.
        before, after = self._running, {c.call_id: c for c in calls}
        stopped = before.keys() - after.keys()
        started = after.keys() - before.keys()
        for call_id in stopped:
            before[call_id].running = False
        for call_id in started:
            after[call_id].running = True
        if stopped or started:
            self.changes += 1
        self._running = after

    # ---- checks -----------------------------------------------------------
    def check_invariants(self) -> None:
        """Every call sits in exactly one queue, at the level it records."""
        seen = 0
        for level, queue in enumerate(self._queues):
            for call in queue:
                assert call.level == level, f"{call.call_id!r} recorded at {call.level}, queued at {level}"
                assert self._calls.get(call.call_id) is call, f"{call.call_id!r} queued but not indexed"
                seen += 1
            entered = [c.entered for c in queue]
            assert entered == sorted(entered), f"queue {level} is not in order"
        assert seen == len(self._calls), "a call is indexed but not queued, or queued twice"
