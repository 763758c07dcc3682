"""The process table: one entry per live agent program.

Like an OS process table, it holds what the scheduler and the load balancer need
to reason about a whole program rather than one call: attained service (PLAS or
ATLAS, per the policy), queued time, the engine it is pinned to, its active
calls (threads) and when it last did anything. Time is always passed in.

Subagents. A program may be started as a subagent of a live program (its
``parent``); the parent's tree (its root and every subagent below it, at any
depth) is ranked as one program: every member's calls get the priority of the
tree's total service, and anti-starvation reads the tree's total waiting, as
if the subagents' calls were the root's own parallel threads. Each member keeps
its own entry (its calls, service, tokens, life) for the process table's views.
The tree's totals are the root's own service and waiting plus what its
members added (``subtree_service``, ``subtree_waiting``, kept on the root and
grown by every member's finished call); a member that leaves keeps its share
there. ATLAS's critical path runs across the tree too: a subagent starts from
its parent's path at the moment it was spawned, and the root's ``tree_path`` is
the longest path of any member. A member whose root has left is ranked on its
own tree from then on (its own totals).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from autellix.core.mlq import ProgramView
from autellix.core.policies.base import Policy
from autellix.core.tenant_shares import TenantShares

#: How many recent calls ``ProcessTable.call_time`` follows.
CALL_TIME_WINDOW = 20


class UnknownProgram(KeyError):
    """No live program has this id (never started, ended, or expired)."""


class DuplicateProgram(KeyError):
    """A program with this id is already in the table."""


class UnknownCall(KeyError):
    """The program has no active call with this id."""


@dataclass(slots=True)
class ActiveCall:
    """Thread metadata: one in-flight LLM call of a program."""

    call_id: str
    thread_id: str | None
    arrival: float
    #: The program's service when the call arrived (ATLAS's ``c.service``).
    inherited: float
    engine: str | None = None
    #: The program's critical path when the call arrived.
    inherited_path: float = 0.0


@dataclass(slots=True)
class ProgramEntry:
    program_id: str
    created_at: float
    #: Attained service: PLAS sums model time, ATLAS keeps the critical path.
    service: float = 0.0
    #: Queued (not executing) time of the program's finished calls.
    waiting: float = 0.0
    #: The longest chain of its calls' model time (the paper's ATLAS value):
    #: ``max(path, inherited_path + model_time)`` per finished call.
    critical_path: float = 0.0
    #: Engine the program is pinned to (Algorithm 2, long prompts).
    pinned_engine: str | None = None
    #: Every engine the program's calls have run on.
    engines: set[str] = field(default_factory=set)
    active: dict[str, ActiveCall] = field(default_factory=dict)
    last_arrival: float | None = None
    last_finish: float | None = None
    calls_done: int = 0
    calls_aborted: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Who may see or end it, and whose share it runs on (the gateway's API-key tenant); None = anyone.
    owner: str | None = None
    #: Created on first use of an agent session header rather than POST /v1/sessions.
    implicit: bool = False
    #: The program that spawned this one (a subagent's parent), and the root of their tree.
    parent: str | None = None
    root: str | None = None
    #: On a tree's root: what its subagents' calls added (live or gone), and the longest critical path of
    #: any member. A lone program has none: its tree is itself.
    subtree_service: float = 0.0
    subtree_waiting: float = 0.0
    tree_path: float = 0.0
    #: On a tree's root: its live subagents, at any depth.
    members: set[str] = field(default_factory=set)
    #: On a tree's root: the highest priority it has had since it last had no call in
    #: flight (``ProcessTable.view``), 0 while it has none.
    round_priority: float = 0.0
    #: The tokens the program said it will generate in all (a client's hint; 0: none said), and the
    #: same as model time where only that travelled (an engine's table: ``ProcessTable.declared``).
    declared_tokens: int = 0
    declared_service: float = 0.0

    @property
    def last_activity(self) -> float:
        return max(t for t in (self.created_at, self.last_arrival, self.last_finish) if t is not None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (the gateway's GET /v1/sessions/{id})."""
        return {
            "id": self.program_id,
            "object": "autellix.session",
            "created_at": self.created_at,
            "service": self.service,
            "waiting": self.waiting,
            "critical_path": self.critical_path,
            "pinned_engine": self.pinned_engine,
            "engines": sorted(self.engines),
            "calls_done": self.calls_done,
            "calls_aborted": self.calls_aborted,
            "calls_active": len(self.active),
            "active": [
                {"call_id": c.call_id, "thread_id": c.thread_id, "arrival": c.arrival,
                 "inherited": c.inherited, "engine": c.engine}
                for c in self.active.values()
            ],
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "last_arrival": self.last_arrival,
            "last_finish": self.last_finish,
            "implicit": self.implicit,
            "parent": self.parent,
            "root": self.root,
            "subagents": sorted(self.members),
            "declared_tokens": self.declared_tokens,
            "tree": {"service": self.tree_service, "waiting": self.tree_waiting,
                     "critical_path": max(self.tree_path, self.critical_path)},
        }

    @property
    def tree_service(self) -> float:
        """On a root: the service of its whole tree (a lone program's own)."""
        return self.service + self.subtree_service

    @property
    def tree_waiting(self) -> float:
        return self.waiting + self.subtree_waiting


class ProcessTable:
    """Live programs by id, updated as their calls arrive and finish."""

    def __init__(self, policy: Policy, *, idle_ttl: float = math.inf, tenants: TenantShares | None = None) -> None:
        self.policy = policy
        self.idle_ttl = idle_ttl
        self._programs: dict[str, ProgramEntry] = {}
        #: A typical call's model time: the moving average of finished calls' (0 before the first).
        self.call_time = 0.0
        self._calls_timed = 0
        #: Model time per generated token, over about the last ``CALL_TIME_WINDOW`` calls that generated
        #: any: what a program's declared tokens come to (``declared``).
        self._recent_model_time = 0.0
        self._recent_tokens = 0.0
        #: Model time shared between the programs' tenants (``owner``) by weight.
        self.tenants = tenants if tenants is not None else TenantShares()

    def __len__(self) -> int:
        return len(self._programs)

    def __contains__(self, program_id: object) -> bool:
        return program_id in self._programs

    def __iter__(self) -> Iterator[ProgramEntry]:
        return iter(list(self._programs.values()))

    def get(self, program_id: str) -> ProgramEntry | None:
        return self._programs.get(program_id)

    def __getitem__(self, program_id: str) -> ProgramEntry:
        try:
            return self._programs[program_id]
        except KeyError:
            raise UnknownProgram(program_id) from None

    # ---- sessions ---------------------------------------------------------
    def start(self, program_id: str, now: float, *, owner: str | None = None, implicit: bool = False,
              parent: str | None = None) -> ProgramEntry:
        """A new program; with ``parent`` (a live program: ``UnknownProgram`` otherwise), a subagent of it."""
        if program_id in self._programs:
            raise DuplicateProgram(program_id)
        entry = ProgramEntry(program_id=program_id, created_at=now, owner=owner, implicit=implicit)
        if parent is not None:
            spawner = self[parent]
            root = self.tree_root(spawner)
            entry.parent, entry.root = parent, root.program_id
            entry.critical_path = spawner.critical_path  # the chain so far leads into the subagent
            root.members.add(program_id)
        self._programs[program_id] = entry
        return entry

    def end(self, program_id: str) -> ProgramEntry:
        entry = self[program_id]
        del self._programs[program_id]
        self._left(entry)
        return entry

    def expire(self, now: float) -> list[ProgramEntry]:
        """Drop programs idle (no active call) for longer than the TTL."""
        stale = [
            e for e in self._programs.values()
            if not e.active and now - e.last_activity > self.idle_ttl
        ]
        for entry in stale:
            del self._programs[entry.program_id]
        for entry in stale:
            self._left(entry)
        return stale

    def _left(self, entry: ProgramEntry) -> None:
        """A member left its tree (its share stays in the root's totals); a root that left frees its members;
        the calls it still had in flight leave its tenant's account unserved."""
        for _ in entry.active:
            self.tenants.call_ended(entry.owner, 0.0, entry.last_activity)
        root = self._programs.get(entry.root) if entry.root is not None else None
        if root is not None:
            root.members.discard(entry.program_id)
        for member_id in entry.members:
            member = self._programs.get(member_id)
            if member is not None:
                member.root = None

    # ---- priorities -------------------------------------------------------
    def tree_root(self, entry: ProgramEntry) -> ProgramEntry:
        """The root of the program's tree: itself, unless it is a subagent whose root is live."""
        root = self._programs.get(entry.root) if entry.root is not None else None
        return root if root is not None else entry

    def priority(self, program_id: str) -> float:
        """The priority every active call of the program (and of its whole tree) shares right now."""
        return self.view(program_id).priority

    def view(self, program_id: str) -> ProgramView:
        """What the multi-level queue reads for placement and anti-starvation: the tree's totals,
        the service its calls in flight have committed it to, and the service its root declared
        (``declared``), each a floor under its priority, and its tenant's lead over its share
        (``TenantShares.lead``) on top (``committed``: what the priority has over the service), and
        how much longer than others it waits before anti-starvation lifts it (``TenantShares.patience``)."""
        root = self.tree_root(self[program_id])
        in_flight = self.in_flight(root)
        service = root.tree_service
        priority = service + self._commitment(in_flight)
        if in_flight and root.round_priority > priority:
            priority = root.round_priority
        declared = self.declared(root)
        if declared > priority:
            priority = declared
        tenants = self.tenants
        lead = tenants.lead(root.owner)
        priority += lead
        return ProgramView(priority=priority, wait=root.tree_waiting, service=service,
                           tree=root.program_id, committed=priority - service, declared=declared, lead=lead,
                           patience=tenants.patience(root.owner))

    # ---- declared sizes ---------------------------------------------------
    @property
    def seconds_per_token(self) -> float:
        """Model time per generated token of recent calls (0 before the first call that generated one)."""
        return self._recent_model_time / self._recent_tokens if self._recent_tokens else 0.0

    def declare(self, program_id: str, tokens: int) -> ProgramEntry:
        """The program says it will generate ``tokens`` in all (its whole tree, when it is a root). A
        declaration only ever grows: a program cannot take back what it said."""
        if tokens < 0:
            raise ValueError("declared tokens must be >= 0")
        entry = self[program_id]
        entry.declared_tokens = max(entry.declared_tokens, tokens)
        return entry

    def declared(self, root: ProgramEntry) -> float:
        """The service ``root``'s tree declared: its declared tokens at the recent model time per token,
        or the model time that travelled with its calls (an engine's table, which counts no tokens).

        A program ranks at the larger of what it attained and what it declared
        (``view``), so a declaration can only place it later: a program that
        declares too little ranks as if it had declared nothing as soon as its
        attained service passes the declaration, and never ahead of that; one
        that declares what it will take ranks, from its first call, where the
        clairvoyant order would put it among programs that declared. Small
        programs gain by others' declarations, so clients of one tenant gain by
        declaring together."""
        if root.declared_tokens:
            return root.declared_tokens * self.seconds_per_token
        return root.declared_service

    def in_flight(self, root: ProgramEntry) -> int:
        """Calls in flight across the tree of ``root``: its own and its live members'. An
        engine's table knows the gateway's trees by name only and counts its own way
        (``autellix.engine.planner``)."""
        if not root.members:
            return len(root.active)
        return len(root.active) + sum(len(member.active) for member_id in root.members
                                      if (member := self._programs.get(member_id)) is not None)

    def _commitment(self, in_flight: int) -> float:
        """Service a tree's ``in_flight`` calls beside the first will take: one typical call's
        (``call_time``) each. Attained service counts a call only once it has finished, so
        a program that opens a round of 16 calls would rank, until the first of them
        finishes, as a program that has had none, and its round would take every
        slot ahead of single-threaded programs that have had a little."""
        return (in_flight - 1) * self.call_time if in_flight > 1 else 0.0

    def _hold_round(self, entry: ProgramEntry) -> None:
        """While a tree has calls in flight its priority never falls: a call that finishes
        under the typical time would otherwise lift the round's waiting calls ahead of
        its running ones, and the engine would preempt the program's own calls."""
        root = self.tree_root(entry)
        in_flight = self.in_flight(root)
        if in_flight:
            root.round_priority = max(root.round_priority, root.tree_service + self._commitment(in_flight))
        else:
            root.round_priority = 0.0

    # ---- calls ------------------------------------------------------------
    def call_arrived(
        self, program_id: str, call_id: str, now: float, *, thread_id: str | None = None, engine: str | None = None
    ) -> ActiveCall:
        entry = self[program_id]
        if call_id in entry.active:
            raise KeyError(f"call {call_id!r} of program {program_id!r} is already active")
        call = ActiveCall(call_id=call_id, thread_id=thread_id, arrival=now, inherited=entry.service, engine=engine,
                          inherited_path=entry.critical_path)
        entry.active[call_id] = call
        entry.last_arrival = now
        self.tenants.call_started(entry.owner, now)
        if engine is not None:
            entry.engines.add(engine)
        self._hold_round(entry)
        return call

    def call_routed(self, program_id: str, call_id: str, engine: str) -> None:
        """The call was (re)sent to ``engine`` (a retry after a failure moves it)."""
        entry = self[program_id]
        self._active(entry, call_id).engine = engine
        entry.engines.add(engine)

    def call_finished(
        self,
        program_id: str,
        call_id: str,
        now: float,
        *,
        model_time: float,
        wait: float = 0.0,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> ProgramEntry:
        """Update attained service with the call's execution time (never its queueing)."""
        if model_time < 0 or wait < 0:
            raise ValueError("model_time and wait must be >= 0")
        entry = self[program_id]
        call = self._active(entry, call_id)
        del entry.active[call_id]
        self.tenants.call_ended(entry.owner, model_time, now)
        self._time_call(model_time, completion_tokens)
        before = entry.service
        entry.service = self.policy.attained_service(entry.service, call.inherited, model_time)
        entry.critical_path = max(entry.critical_path, call.inherited_path + model_time)
        entry.waiting += wait
        root = self.tree_root(entry)
        if root is not entry:
            root.subtree_service += entry.service - before
            root.subtree_waiting += wait
            root.tree_path = max(root.tree_path, entry.critical_path)
        entry.calls_done += 1
        entry.prompt_tokens += prompt_tokens
        entry.completion_tokens += completion_tokens
        entry.last_finish = now
        self._hold_round(entry)
        return entry

    def _time_call(self, model_time: float, tokens: int) -> None:
        """``call_time``: the mean of the first calls, then an exponential average over about
        the last ``CALL_TIME_WINDOW`` calls, so it follows the mix as it changes; the same
        for model time and tokens of calls that generated tokens (``seconds_per_token``)."""
        self._calls_timed += 1
        weight = 1.0 / min(self._calls_timed, CALL_TIME_WINDOW)
        self.call_time += weight * (model_time - self.call_time)
        if tokens > 0:
            decay = 1.0 - 1.0 / CALL_TIME_WINDOW
            self._recent_model_time = decay * self._recent_model_time + model_time
            self._recent_tokens = decay * self._recent_tokens + tokens

    def call_aborted(self, program_id: str, call_id: str, now: float, *, wait: float = 0.0) -> ProgramEntry:
        """The call left without a result: its queueing counts, no service is earned."""
        entry = self[program_id]
        self._active(entry, call_id)
        del entry.active[call_id]
        self.tenants.call_ended(entry.owner, 0.0, now)
        entry.waiting += max(wait, 0.0)
        root = self.tree_root(entry)
        if root is not entry:
            root.subtree_waiting += max(wait, 0.0)
        entry.calls_aborted += 1
        entry.last_finish = now
        self._hold_round(entry)
        return entry

    @staticmethod
    def _active(entry: ProgramEntry, call_id: str) -> ActiveCall:
        try:
            return entry.active[call_id]
        except KeyError:
            raise UnknownCall(f"program {entry.program_id!r} has no active call {call_id!r}") from None

    # ---- engines ----------------------------------------------------------
    def pin(self, program_id: str, engine: str | None) -> None:
        self[program_id].pinned_engine = engine

    def drop_engine(self, engine: str) -> list[str]:
        """An engine left the pool: free every pin to it. Returns the programs unpinned."""
        freed = []
        for entry in self._programs.values():
            if entry.pinned_engine == engine:
                entry.pinned_engine = None
                freed.append(entry.program_id)
        return freed
