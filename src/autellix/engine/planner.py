"""The engine's view of Algorithm 1: calls, programs and their queue ranks.

This is the part of the scheduler plugin that knows nothing of vLLM: it maps an
engine's requests onto the policy core's ``MultiLevelQueue`` and
``ProcessTable`` and says, each planning step, which calls changed rank and
which running calls to preempt. ``autellix.engine.scheduler`` applies that to
vLLM's queues. Time is passed in, so tests drive it with a fake clock.

Programs. The gateway sends each call's program id and the program's attained
service and waiting time (``vllm_xargs``); those are the whole cluster's
numbers. The engine keeps its own table of the programs it serves and adds the
service of calls that finish here, so between two calls from the gateway the
engine's numbers are never older than its own work. Without the gateway, a
request's vLLM ``session_id`` names its program, else the request is a program
of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from autellix.core import MultiLevelQueue, ProcessTable, SchedulerConfig, policy_by_name
from autellix.core.mlq import ProgramView, QueuedCall
from autellix.core.policies.base import Policy
from autellix.core.preemption import PreemptionRule, SlotTurnover, preemption_victims
from autellix.core.process_table import ProgramEntry
from autellix.core.tenant_shares import TenantShares
from autellix.protocol import (
    XARG_CALL,
    XARG_DECLARED,
    XARG_EXPECT_RETURN,
    XARG_PROGRAM,
    XARG_SERVICE,
    XARG_TENANT,
    XARG_TENANT_WEIGHT,
    XARG_THREAD,
    XARG_TREE,
    XARG_WAIT,
    CallRecord,
)

#: How often the planner sweeps every queued call for anti-starvation promotion
#: and re-placement. Demotion is checked every planning step (only calls that
#: ran can use up a quantum); the sweep touches every call, so it runs at most
#: this often. Promotion thresholds are beta x seconds of service, so a sweep tens
#: of milliseconds late changes nothing, and a step stays O(running calls)
#: (experiments/scheduler_step_time.py).
#: A sweep that falls due while nothing has changed since the last one but time, and
#: before any call could meet the starvation bound (``MultiLevelQueue.quiet_until``),
#: is skipped: it would move no call.
SWEEP_INTERVAL_S = 0.02
#: With many calls queued, a sweep also waits this many seconds per queued call: it costs about
#: 2 us a call on a slow CPU, so sweeps stay within about a tenth of the engine's time however
#: long the queue (at 4,000 calls, every 80 ms instead of every other step).
SWEEP_INTERVAL_PER_CALL_S = 20e-6

#: The ``vllm_xargs`` keys the gateway sends and the record published for each
#: call (``CallRecord``) are the wire contract: ``autellix.protocol``.


@dataclass(frozen=True, slots=True)
class CallIdentity:
    """Who a request belongs to, read from its ``vllm_xargs`` and session id."""

    program_id: str
    thread_id: str | None = None
    #: The gateway's call id: the key the finished call's record is published under.
    gateway_call: str | None = None
    service: float | None = None
    wait: float | None = None
    #: The subagent tree whose totals ``service`` and ``wait`` are (None: the program's own).
    tree: str | None = None
    #: False when the request is a program of its own (no program id, no session): it never comes back.
    named: bool = True
    #: The model time the program declared it will take (``XARG_DECLARED``).
    declared: float | None = None
    #: A rank set from outside the policy, in place of ``service``: the program's place in the queues
    #: is its latest call's, which may fall (the simulator's ``ProgramRanks``; no gateway sends one).
    rank: float | None = None
    #: The program's tenant and its weight (``XARG_TENANT``): model time is shared between tenants by weight.
    tenant: str | None = None
    tenant_weight: float | None = None
    #: The call offered tools: its program may come back after one runs (``XARG_EXPECT_RETURN``).
    expect_return: bool = False

    @classmethod
    def of(cls, request_id: str, extra_args: Mapping[str, Any] | None, session_id: str | None) -> CallIdentity:
        extra = extra_args or {}
        program = extra.get(XARG_PROGRAM)
        named = True
        if not isinstance(program, str) or not program:
            named = bool(session_id)
            program = f"session:{session_id}" if session_id else f"request:{request_id}"
        return cls(
            program_id=program,
            named=named,
            thread_id=_text(extra.get(XARG_THREAD)),
            gateway_call=_text(extra.get(XARG_CALL)),
            service=_number(extra.get(XARG_SERVICE)),
            wait=_number(extra.get(XARG_WAIT)),
            tree=_text(extra.get(XARG_TREE)),
            declared=_number(extra.get(XARG_DECLARED)),
            tenant=_text(extra.get(XARG_TENANT)),
            tenant_weight=_weight(extra.get(XARG_TENANT_WEIGHT)),
            expect_return=extra.get(XARG_EXPECT_RETURN) is True,
        )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _weight(value: Any) -> float | None:
    number = _number(value)
    return number if number is not None and 0 < number < math.inf else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        return None
    return float(value)


class _EngineTable(ProcessTable):
    """An engine's process table: it knows the gateway's subagent trees by name only
    (``XARG_TREE``), and counts a tree's calls in flight over the members it has seen."""

    def __init__(self, policy: Policy, *, idle_ttl: float) -> None:
        # Tenants share an engine's slots by quota (``CallPlanner``), not by a lead on their programs' priority.
        super().__init__(policy, idle_ttl=idle_ttl, tenants=TenantShares(lead_gain=0.0))
        #: The gateway's subagent tree of each program that has one, and each tree's programs here.
        self.trees: dict[str, str] = {}
        self._members: dict[str, set[str]] = {}

    def join(self, program_id: str, tree: str) -> None:
        if self.trees.get(program_id) != tree:
            self.forget(program_id)
            self.trees[program_id] = tree
            self._members.setdefault(tree, set()).add(program_id)

    def forget(self, program_id: str) -> None:
        tree = self.trees.pop(program_id, None)
        if tree is not None:
            members = self._members[tree]
            members.discard(program_id)
            if not members:
                del self._members[tree]

    def in_flight(self, root: ProgramEntry) -> int:
        tree = self.trees.get(root.program_id)
        if tree is None:
            return super().in_flight(root)
        return sum(len(entry.active) for program_id in self._members[tree]
                   if (entry := self.get(program_id)) is not None)


class CallPlanner:
    """The queues and program table of one engine."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.policy = policy_by_name(config.policy)
        self.table = _EngineTable(self.policy, idle_ttl=config.program_idle_ttl)
        self.queue = MultiLevelQueue(self.policy.queues(config), self.program_view,
                                     places_by_priority=self.policy.places_by_priority)
        self._identity: dict[str, CallIdentity] = {}
        self._preemptions: dict[str, int] = {}
        self._left = 0
        self._last_sweep = -float("inf")
        self.sweep_interval = SWEEP_INTERVAL_S
        self.sweep_interval_per_call = SWEEP_INTERVAL_PER_CALL_S
        #: Skip sweeps that would move no call (``replan``); off: every due sweep runs.
        self.skip_quiet_sweeps = True
        #: Arrivals and departures: the only times the table, and so a program's view, changes.
        self._table_changes = 0
        #: The queue's and the table's changes after the last sweep, and, once asked, until when nothing can move.
        self._changes_at_sweep = (-1, -1)
        self._quiet_until: float | None = None
        #: Sweeps that fell due and ran, and those skipped.
        self.sweeps = self.skipped_sweeps = 0
        self.preemption_rule = PreemptionRule(max_victims=config.max_preemptions)
        self.turnover = SlotTurnover()
        #: Whether the last planning step put any call beyond its tenant's slot quota (``_band``).
        self._banded = False

    def __len__(self) -> int:
        return len(self.queue)

    def identity(self, call_id: str) -> CallIdentity | None:
        """Who a queued call belongs to (None once it left)."""
        return self._identity.get(call_id)

    def program_view(self, program_id: str) -> ProgramView:
        """The program as the queues read it, with its tree when the gateway named one: the
        members of one tree then count once in the backlog (``core.mlq.backlog_ratio``)."""
        view = self.table.view(program_id)
        tree = self.table.trees.get(program_id)
        return view._replace(tree=tree) if tree is not None else view

    def rank(self, call_id: str) -> int:
        call = self.queue.get(call_id)
        return call.rank if call is not None else 0

    # ---- life of a call ------------------------------------------------------
    def arrive(self, call_id: str, who: CallIdentity, now: float) -> QueuedCall:
        self._table_changes += 1
        entry = self.table.get(who.program_id) or self.table.start(who.program_id, now, owner=who.tenant)
        if who.tenant_weight is not None:
            self.table.tenants.set_weight(entry.owner, who.tenant_weight)
        # The gateway's numbers cover every engine; ours cover calls that finished
        # here since. Both only grow, so the larger is the fresher.
        if who.rank is not None:
            entry.service = who.rank
        elif who.service is not None:
            entry.service = max(entry.service, who.service)
        if who.wait is not None:
            entry.waiting = max(entry.waiting, who.wait)
        if who.declared is not None:  # the gateway's reckoning, in model time: the latest is the freshest
            entry.declared_service = who.declared
        if who.tree is not None:  # before the call counts in its tree's calls in flight
            self.table.join(who.program_id, who.tree)
        self.table.call_arrived(who.program_id, call_id, now, thread_id=who.thread_id)
        self._identity[call_id] = who
        return self.queue.add(call_id, who.program_id, now)

    def leave(self, call_id: str, now: float, *, finished: bool) -> CallRecord | None:
        """The call finished or was aborted. None if it was never queued here."""
        who = self._identity.pop(call_id, None)
        if who is None or call_id not in self.queue:
            return None
        self._table_changes += 1
        call = self.queue.remove(call_id, now)
        if finished:
            self.table.call_finished(who.program_id, call_id, now, model_time=call.total_model_time,
                                     wait=call.total_wait)
        else:
            self.table.call_aborted(who.program_id, call_id, now, wait=call.total_wait)
        self._left += 1
        self.turnover.departed()
        if self._left % 256 == 0:  # programs that went quiet leave the table
            for entry in self.table.expire(now):
                self.table.forget(entry.program_id)
        return CallRecord(call=who.gateway_call, program=who.program_id, finished=finished,
                          service_s=call.total_model_time, wait_s=call.total_wait, steps=call.steps,
                          promotions=call.promotions, demotions=call.demotions,
                          preemptions=self._preemptions.pop(call_id, 0))

    # ---- one engine step -------------------------------------------------------
    def replan(self, now: float, running: Iterable[str], capacity: int, *,
               lost_tokens: Callable[[str], int] | None = None) -> tuple[list[QueuedCall], list[QueuedCall]]:
        """Demotion, anti-starvation and placement, then the preemptions that pay
        for themselves (``autellix.core.preemption``): ``lost_tokens(call_id)``
        says how many computed KV tokens preempting a running call would lose.
        Returns (calls whose rank changed, running calls to preempt).

        A due sweep is skipped when nothing but time has changed since the last one
        (no call arrived, left, changed queue, started or stopped running, and so no
        program's view changed: this table changes only in ``arrive`` and ``leave``)
        and the queue promises that no call can move before the next
        (``MultiLevelQueue.quiet_until``): it would move nothing. The sweeps still
        fall due at the same times, so every decision is the same as sweeping."""
        queue = self.queue
        sweep = now - self._last_sweep >= max(self.sweep_interval, len(queue) * self.sweep_interval_per_call)
        if sweep:
            self._last_sweep = now
            changes = (queue.changes, self._table_changes)
            if self.skip_quiet_sweeps and changes == self._changes_at_sweep and not queue.spent():
                # Nothing but time has changed since the last sweep: the queue says until when no
                # call can move (asked once a quiet stretch, O(calls) as a sweep; -inf: no promise).
                if self._quiet_until is None:
                    queue.advance(now)
                    until = queue.quiet_until()
                    self._quiet_until = until if until > now else -math.inf
                if now < self._quiet_until:
                    sweep = False
                    self.skipped_sweeps += 1
                elif self._quiet_until > -math.inf:
                    self._quiet_until = None  # its time came: sweep, then ask again
        moved = queue.rebalance(now, sweep=sweep)
        if sweep:
            self.sweeps += 1
            changes = (queue.changes, self._table_changes)
            if changes != self._changes_at_sweep:
                self._changes_at_sweep = changes
                self._quiet_until = None
        rebanded, beyond = self._band(capacity)
        # the queue's order with the calls beyond their quotas last: the order of their ranks
        ordered: Iterable[QueuedCall] = [c for c in queue if not c.band] + beyond if beyond else queue
        if rebanded:
            moved = [*moved, *rebanded]
        cost: Callable[[QueuedCall], int] | None = None
        if lost_tokens is not None:
            by_id = lost_tokens
            cost = lambda call: by_id(call.call_id)  # noqa: E731
        victims = preemption_victims(ordered, set(running), capacity, rule=self.preemption_rule,
                                     lost_tokens=cost, turnover=self.turnover)
        for call in victims:
            self._preemptions[call.call_id] = self._preemptions.get(call.call_id, 0) + 1
        return moved, victims

    def _band(self, capacity: int) -> tuple[list[QueuedCall], list[QueuedCall]]:
        """Tenants' slot quotas (``TenantShares.slot_quotas``): each tenant's first calls in queue order,
        as many as its quota, stay in band 0, and the rest go to band 1, behind every tenant's calls
        within their quotas (``QueuedCall.band``), so the engine's batch holds each
        tenant's quota when it has the calls to fill it and what is left goes by rank (work-conserving).
        Returns the calls whose band changed, and those in band 1 in queue order. With one tenant (or
        none named) nothing is banded."""
        quotas = self.table.tenants.slot_quotas(capacity)
        if quotas is None and not self._banded:
            return [], []
        changed: list[QueuedCall] = []
        beyond: list[QueuedCall] = []
        if quotas is None:
            for call in self.queue:
                if call.band:
                    call.band = 0
                    changed.append(call)
        else:
            left = dict(quotas)
            table = self.table
            for call in self.queue:
                tenant = table[call.program_id].owner
                band = 0
                if left.get(tenant, 0) > 0:
                    left[tenant] -= 1
                else:
                    band = 1
                    beyond.append(call)
                if call.band != band:
                    call.band = band
                    changed.append(call)
        self._banded = bool(beyond)
        return changed, beyond

    def started(self, call_ids: Iterable[str]) -> None:
        """The engine scheduled these calls for the step that starts now."""
        self.queue.mark_running(call_ids)

    def step_done(self, now: float, steps: int = 1) -> None:
        """The step ran (or ``steps`` decode steps did): the time since the last
        step is the scheduled calls' model time (the scheduler's own few
        microseconds between steps are theirs too) and that many steps of their
        quantum; everyone else waited."""
        self.queue.ran(now, steps)
        self.turnover.stepped(steps)

