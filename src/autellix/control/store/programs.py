"""Program state behind one small interface: ``ProgramStore``.

What the gateway keeps per program (the paper's process table) and per
program and model (routing state), reached only through this interface so that
the in-memory default and a shared store (Redis, for gateway replicas behind
Envoy) are interchangeable. The request controller (``autellix.control``) and
the session rules (``autellix.control.sessions``) use nothing else.

What a shared implementation must do per call, and what it may write behind
---------------------------------------------------------------------------
Envoy hashes a program's calls to one replica while membership is stable, so a
replica *owns* the programs it serves: their entries live in its memory and
the hot path never waits on the store, except when a program arrives that the
replica does not hold (the first call after a move or a restart).

============================  ==========================  =================================
operation                     local (every call)          shared store
============================  ==========================  =================================
``open`` (POST /v1/sessions,  create the entry            **write through** before the 201:
implicit first use)                                       the next call may land elsewhere
``load`` (arrival: a session  local copy                  **read through** on a miss only
the replica does not hold)                                (after a move): take the entry over,
                                                          then check its service against the
                                                          engines' tallies (one bounded read,
                                                          below)
``ended`` (404 for late       local memory                **read through** on a miss
calls on ended ids)
``end`` (DELETE, expiry)      drop the entry              **write through** (the id joins the
                                                          ended set, with a TTL)
``call_arrived`` /            active calls, engine,       never: in-flight calls die with
``call_routed``               last arrival                their replica
``call_finished`` /           service, waiting, tokens,   **written behind, <= 1 s**: each
``call_aborted``              calls done                  replica adds what its calls added;
                                                          a crash loses at most the last
                                                          second, which the takeover's check
                                                          repairs for service (below)
``pin``                       per (program, model)        written behind (a lost pin costs a
                                                          prefix-cache miss, nothing more)
``drop_engine``               free pins to the engine     written behind
``expire``                    idle local entries          per-key TTL in the store
============================  ==========================  =================================

Everything a call reads on the hot path (``priority``, ``pinned``, the entry)
is local. ``flush`` writes the pending state at once (SIGTERM, tests).
The in-memory store is all local: its ``flush`` has nothing to do.

A shared store that takes a program over from another replica checks its service
against the engines' tallies first (``autellix.control.store.takeover``): what the store lost
with a dead replica's last write behind, the engines still count. Programs a replica
holds are never checked.

Time is passed in (``now``): the gateway passes its monotonic clock, the
simulator its virtual one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from autellix.control.recent import RecentIds
from autellix.core import ActiveCall, Policy, ProcessTable, ProgramEntry, ProgramView, TenantShares, UnknownProgram

#: Ended ids remembered so that late calls get a clear 404: at most this many (about 200 bytes
#: each), and each for ``ended_ttl`` seconds (``autellix.control.recent``).
ENDED_MEMORY = 100_000


@runtime_checkable
class ProgramStore(Protocol):
    """The process table, sessions and per-engine routing state of a gateway."""

    policy: Policy
    #: Seconds a program with no active call stays before ``expire`` drops it.
    idle_ttl: float

    # ---- sessions: written through ------------------------------------------------
    async def open(self, program_id: str, now: float, *, owner: str | None = None,
                   implicit: bool = False, parent: str | None = None) -> ProgramEntry:
        """A new program; ``DuplicateProgram`` if the id is live; with ``parent`` (a live program this store
        holds: ``UnknownProgram`` otherwise) a subagent of it, ranked with its tree (``autellix.core``)."""
        ...

    async def load(self, program_id: str) -> ProgramEntry | None:
        """The live program, held locally from now on; None if there is none."""
        ...

    async def ended(self, program_id: str) -> bool:
        """Whether this id named a program that ended or expired (remembered, bounded)."""
        ...

    async def end(self, program_id: str, *, remember: bool = True) -> ProgramEntry | None:
        """Remove the program (None if it was not live); ``remember``: late calls get 404."""
        ...

    async def expire(self, now: float) -> list[ProgramEntry]:
        """Drop programs idle (no active call) for longer than ``idle_ttl``; they count as ended."""
        ...

    async def flush(self) -> None:
        """Write everything written behind now."""
        ...

    # ---- the hot path: local, written behind ----------------------------------------
    def entry(self, program_id: str) -> ProgramEntry:
        """A program held locally (after ``open`` or ``load``); ``UnknownProgram`` otherwise."""
        ...

    def is_active(self, program_id: str, call_id: str) -> bool: ...

    def priority(self, program_id: str) -> float: ...

    def view(self, program_id: str) -> ProgramView:
        """The program's standing as the queues read it: its tree's service and waiting."""
        ...

    @property
    def tenants(self) -> TenantShares:
        """The programs' tenants' shares of model time (``autellix.core.TenantShares``): this replica's calls."""
        ...

    def call_arrived(self, program_id: str, call_id: str, now: float, *,
                     thread_id: str | None = None) -> ActiveCall: ...

    def declare(self, program_id: str, tokens: int) -> None:
        """The program says it will generate ``tokens`` in all (``ProcessTable.declare``)."""
        ...

    def call_routed(self, program_id: str, call_id: str, engine: str) -> None: ...

    def call_finished(self, program_id: str, call_id: str, now: float, *, model_time: float, wait: float = 0.0,
                      prompt_tokens: int = 0, completion_tokens: int = 0) -> ProgramEntry: ...

    def call_aborted(self, program_id: str, call_id: str, now: float, *, wait: float = 0.0) -> ProgramEntry: ...

    # ---- routing state: per program and model ---------------------------------------
    def pinned(self, program_id: str, model: str) -> str | None:
        """The engine the program's calls of ``model`` stick to (Algorithm 2), if any."""
        ...

    def pin(self, program_id: str, model: str, engine: str | None) -> None: ...

    def pins(self, program_id: str) -> dict[str, str]:
        """Model -> pinned engine, for the session view."""
        ...

    def drop_engine(self, engine: str) -> list[str]:
        """An engine left the pool: free every pin to it; the programs unpinned."""
        ...

    # ---- views ------------------------------------------------------------------------
    def programs(self) -> Iterator[ProgramEntry]:
        """The programs held locally (metrics, fairness)."""
        ...

    def __len__(self) -> int: ...


class MemoryProgramStore:
    """The default: everything in this process (one gateway, the simulator).

    Wraps the policy core's ``ProcessTable`` (its behaviour unchanged) and adds
    pins per model and the memory of ended ids: an id is remembered for
    ``ended_ttl`` seconds (default: ``idle_ttl``, as long as an idle program is
    kept; a call later than that finds the id unknown), at most ``ended_memory``
    ids, so under steady session churn the memory stops growing after
    ``ended_ttl``. Its clock is the latest ``now`` passed to any method (an end
    is not told the time: it happens at the store's latest time)."""

    def __init__(self, policy: Policy, *, idle_ttl: float = math.inf, ended_memory: int = ENDED_MEMORY,
                 ended_ttl: float | None = None) -> None:
        self.table = ProcessTable(policy, idle_ttl=idle_ttl)
        self.policy = policy
        self.idle_ttl = idle_ttl
        self._pins: dict[str, dict[str, str]] = {}
        self._ended = RecentIds(ended_memory, ended_ttl if ended_ttl is not None else idle_ttl)
        self._now = -math.inf

    def _tick(self, now: float) -> float:
        self._now = max(self._now, now)
        return now

    # ---- sessions ------------------------------------------------------------------------
    async def open(self, program_id: str, now: float, *, owner: str | None = None,
                   implicit: bool = False, parent: str | None = None) -> ProgramEntry:
        return self.table.start(program_id, self._tick(now), owner=owner, implicit=implicit, parent=parent)

    async def load(self, program_id: str) -> ProgramEntry | None:
        return self.table.get(program_id)

    async def ended(self, program_id: str) -> bool:
        self._ended.forget_old(self._now)
        return program_id in self._ended

    async def end(self, program_id: str, *, remember: bool = True) -> ProgramEntry | None:
        if program_id not in self.table:
            return None
        entry = self.table.end(program_id)
        self._pins.pop(program_id, None)
        if remember:
            self._remember_ended(program_id)
        return entry

    async def expire(self, now: float) -> list[ProgramEntry]:
        expired = self.table.expire(self._tick(now))
        self._ended.forget_old(now)
        for entry in expired:
            self._pins.pop(entry.program_id, None)
            self._remember_ended(entry.program_id)
        return expired

    async def flush(self) -> None:
        return None

    def _remember_ended(self, program_id: str) -> None:
        self._ended.add(program_id, self._now)

    # ---- the hot path ------------------------------------------------------------------
    def entry(self, program_id: str) -> ProgramEntry:
        return self.table[program_id]

    def is_active(self, program_id: str, call_id: str) -> bool:
        entry = self.table.get(program_id)
        return entry is not None and call_id in entry.active

    def priority(self, program_id: str) -> float:
        return self.table.priority(program_id)

    def view(self, program_id: str) -> ProgramView:
        return self.table.view(program_id)

    @property
    def tenants(self) -> TenantShares:
        return self.table.tenants

    def call_arrived(self, program_id: str, call_id: str, now: float, *,
                     thread_id: str | None = None) -> ActiveCall:
        return self.table.call_arrived(program_id, call_id, self._tick(now), thread_id=thread_id)

    def declare(self, program_id: str, tokens: int) -> None:
        self.table.declare(program_id, tokens)

    def call_routed(self, program_id: str, call_id: str, engine: str) -> None:
        self.table.call_routed(program_id, call_id, engine)

    def call_finished(self, program_id: str, call_id: str, now: float, *, model_time: float, wait: float = 0.0,
                      prompt_tokens: int = 0, completion_tokens: int = 0) -> ProgramEntry:
        return self.table.call_finished(program_id, call_id, self._tick(now), model_time=model_time, wait=wait,
                                        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)

    def call_aborted(self, program_id: str, call_id: str, now: float, *, wait: float = 0.0) -> ProgramEntry:
        return self.table.call_aborted(program_id, call_id, self._tick(now), wait=wait)

    # ---- routing state -----------------------------------------------------------------
    def pinned(self, program_id: str, model: str) -> str | None:
        return self._pins.get(program_id, {}).get(model)

    def pin(self, program_id: str, model: str, engine: str | None) -> None:
        entry = self.table[program_id]
        pins = self._pins.setdefault(program_id, {})
        if engine is None:
            pins.pop(model, None)
        else:
            pins[model] = engine
        # the core's single pin shows the latest one (the session view's ``pinned_engine``)
        entry.pinned_engine = engine if engine is not None else next(reversed(pins.values()), None)

    def pins(self, program_id: str) -> dict[str, str]:
        return dict(self._pins.get(program_id, {}))

    def drop_engine(self, engine: str) -> list[str]:
        freed = set(self.table.drop_engine(engine))
        for program_id, pins in self._pins.items():
            for model in [m for m, e in pins.items() if e == engine]:
                del pins[model]
                freed.add(program_id)
        return sorted(freed)

    # ---- views ------------------------------------------------------------------------
    def programs(self) -> Iterator[ProgramEntry]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)

    def __contains__(self, program_id: object) -> bool:
        return program_id in self.table


__all__ = ["ENDED_MEMORY", "MemoryProgramStore", "ProgramStore", "UnknownProgram"]
