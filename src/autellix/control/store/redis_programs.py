"""``ProgramStore`` shared by gateway replicas through Redis: any replica can take over a program.

The rules are the interface's own (``autellix.control.store.programs``): the hot path is
local (this store is a ``MemoryProgramStore`` of local copies, and its hot path is
that store's), sessions are written through, a replica that does not hold a program
reads it through once and holds it from then on, and what calls change (service,
waiting, tokens, pins) is written behind within ``flush_interval`` (0.5 s). In Redis,
per program (``autellix.control.store.scripts``: its fields and the scripts that
change them):

* ``{prefix}program:{id}``: a hash with the owner, ``implicit``, the counters and
  the pins (JSON); expires after ``key_ttl`` without a write (twice the idle TTL,
  or a day when programs never idle out), so a program nobody serves leaves by
  itself; a replica's own idle expiry drops only its local copy (the program may
  have moved on);
* ``{prefix}ended:{id}``: the id ended or expired (late calls get 404), for ``ended_ttl``.

A write behind sets what this replica's calls have added to the program's sums
(service, waiting, calls, tokens) in all, ``by:{replica}:{name}`` in the hash, and
adds the difference to the sums; it merges the critical path by maximum (a Lua
script, atomic per program). So when two replicas briefly serve one program at once
(calls Envoy retried elsewhere while a dead replica was being ejected, membership
flapping), their calls add up and neither takes the other's back; and a write that
failed without an answer (the store applied it, or not) is simply sent again: it
counts once either way. A replica reads the program as the others' part (the sums
less its own contribution in the store) plus its own calls. A write behind never
recreates a program that ended.

A replica may hold a copy of a program that is served elsewhere: it opened the
session (``POST /v1/sessions`` has no program key, so it lands on any replica) or
served it before a membership change. So a local copy is trusted only while it is
in use here (a call arrived or ended, or it was opened or taken over, within
``revalidate_after``, 1 s); after that, its next ``load`` reads the store once and
catches up (the store's sums plus what its own calls added since) or ends it if
it ended elsewhere. A program whose calls come less than a second apart costs no
read; one whose calls are further apart costs one read per call, small beside an
LLM call.

A replica that takes a program over (it did not hold it, or its copy was stale and
another replica has written since) checks the program's service against the engines
(``autellix.control.store.takeover``). The store's ``service`` is a sum of what replicas
added, and a repair adds nothing to it: the repair raises the program's
``service_floor`` instead, which every write behind merges by maximum with the
writer's own view of the service, and a reader takes the larger of the two. So a
replica that was not dead after all (the program moved on a membership change) and
writes its last second later does not count that second twice.

``opened_at`` (wall clock, written at open) tells the program from an earlier one under
the same id: a write behind for another incarnation is dropped, a local copy of one is
replaced by a takeover, and an engine's tally that began before the open is not counted.

Times (``created_at``, last activity) are each replica's monotonic clock and are
not shared: a replica taking a program over starts its idle clock at the takeover.

No call fails because the store does: while it is out of reach the replica serves
from its local copies and writes back what it owes when the store answers again
(``autellix.control.store.outage``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import time
import uuid
from collections.abc import Iterator

from autellix.control.background import cancel
from autellix.control.store.connection import STORE_ERRORS, StoreConnection
from autellix.control.store.outage import Outage
from autellix.control.store.programs import MemoryProgramStore
from autellix.control.store.scripts import (
    ADDED,
    COUNTERS,
    MAXIMA,
    MERGE,
    OPEN,
    contribution,
    credited,
    merge_args,
    open_args,
    set_counter,
    stored,
)
from autellix.control.store.takeover import EngineService, TakeoverChecks
from autellix.core import ActiveCall, DuplicateProgram, Policy, ProgramEntry

log = logging.getLogger(__name__)

DAY_S = 86_400.0
#: Between a tenant's name and a replica's in the store's ``tenants`` fields (neither can hold it).
TENANT_SEP = "|"


class RedisProgramStore(MemoryProgramStore):
    """A ``ProgramStore`` over Redis: the local copies (the memory store this class extends, whose hot path it
    keeps) written through, read through and written behind; ``close()`` writes what is pending."""

    def __init__(self, connection: StoreConnection, policy: Policy, *, idle_ttl: float = math.inf,
                 flush_interval: float = 0.5, revalidate_after: float = 1.0, ended_ttl: float = DAY_S) -> None:
        if not 0 < flush_interval <= 1.0:
            raise ValueError("flush_interval: the interface promises state written behind within 1 s")
        if policy.attained_service(1.0, 0.0, 1.0) != 2.0:
            raise ValueError(f"policy {policy.name!r}: the store adds up each replica's service, which needs "
                             "service to be a sum of model times")
        super().__init__(policy, idle_ttl=idle_ttl)
        self.flush_interval = flush_interval
        # A program's key outlives its idle TTL on any one replica; programs with calls in
        # flight have it refreshed (a call may run longer than the TTL).
        self.key_ttl = 2 * idle_ttl if math.isfinite(idle_ttl) else DAY_S
        self._refreshed = time.monotonic()
        self.ended_ttl = ended_ttl
        self.connection = connection
        self.redis, self.keys = connection.redis, connection.keys
        self._open_script = self.redis.register_script(OPEN)
        self._merge = self.redis.register_script(MERGE)
        #: What this replica owes the store after an outage, and the store's health.
        self.outage = Outage(connection, ended_ttl=ended_ttl)
        self.health = self.outage.health
        #: A local copy unused here for longer is checked against the store on its next load.
        self.revalidate_after = revalidate_after
        self._used: dict[str, float] = {}
        #: This replica's name in the programs' hashes (``by:{replica}:{name}``): new with each process.
        self.replica_id = uuid.uuid4().hex[:12]
        #: Per program held here: the part of its sums that other replicas' calls added, as of this
        #: replica's last read; the rest of each sum is this replica's contribution.
        self._others: dict[str, dict[str, float]] = {}
        self._exchange = asyncio.Lock()
        self._dirty: set[str] = set()
        self._keeper: asyncio.Task[None] | None = None
        #: Per program held here: its ``opened_at`` in the store (which incarnation of the id).
        self._opened: dict[str, str] = {}
        #: The takeover's check; off until a gateway gives it its engines (``takeovers.check_with``).
        self.takeovers = TakeoverChecks()

    # ---- the store's health ------------------------------------------------------------
    async def ping(self) -> None:
        """Look at the store (its epoch); when it answers after an outage, or with a new epoch (it
        restarted empty), write this replica's programs back first. Raises what the store raised."""
        async with self._exchange:
            await self.outage.look(self)

    # ---- what writing back needs (``autellix.control.store.outage.Holder``) ----------------------
    def held(self) -> Iterator[ProgramEntry]:
        return self.programs()

    def contribution(self, entry: ProgramEntry) -> dict[str, float]:
        return contribution(entry, self._others.setdefault(entry.program_id, dict.fromkeys(ADDED, 0.0)))

    def opened_at(self, program_id: str) -> str:
        return self._opened.get(program_id, "")

    async def refused(self, entry: ProgramEntry, *, ended: bool) -> None:
        program_id = entry.program_id
        if self.table.get(program_id) is entry and not entry.active:
            await super().end(program_id, remember=ended)
            self._untrack(program_id)

    async def written_back(self, entry: ProgramEntry, fields: dict[str, str]) -> bool:
        program_id = entry.program_id
        if self.table.get(program_id) is not entry:
            return False  # ended here meanwhile
        await self._revalidate(entry, fields)  # the store has this replica's calls now: catch up with it
        self._opened[program_id] = fields.get("opened_at", "")
        return True

    # ---- sessions: written through ---------------------------------------------------
    async def open(self, program_id: str, now: float, *, owner: str | None = None,
                   implicit: bool = False, parent: str | None = None) -> ProgramEntry:
        if program_id in self.table:
            raise DuplicateProgram(program_id)
        self._keep_going()
        opened_at = repr(time.time())
        if self.outage.up:
            try:  # one round trip, atomic: of two replicas opening one id, one wins
                await self.outage.first_contact()
                claimed = await self._open_script(
                    keys=[self.keys.program(program_id), self.keys.ended(program_id)],
                    args=open_args(ttl_ms=int(self.key_ttl * 1000), owner=owner, implicit=implicit,
                                   opened_at=opened_at))
            except STORE_ERRORS as exc:
                self.health.unreachable("open", exc)
            else:
                if not claimed:
                    raise DuplicateProgram(program_id)
        entry = await super().open(program_id, now, owner=owner, implicit=implicit, parent=parent)
        if not self.outage.up:
            self.outage.opened_here(program_id)
        self._used[program_id] = time.monotonic()
        self._opened[program_id] = opened_at
        self._others[program_id] = dict.fromkeys(ADDED, 0.0)  # a new program: all its calls to come are ours
        return entry

    async def load(self, program_id: str) -> ProgramEntry | None:
        return await self._load(program_id, check=True)

    async def _load(self, program_id: str, *, check: bool) -> ProgramEntry | None:
        checking = self.takeovers.running(program_id)
        if checking is not None:  # taken over a moment ago: its calls wait for the engines' word
            await asyncio.shield(checking)
        held = await super().load(program_id)
        if held is not None and self._trusted(program_id):
            return held  # in use here (or the store out of reach): the local copy is the truth
        if not self.outage.up:
            return await self._provisional(program_id)
        # One exchange with the store at a time: a flush in flight and a catch-up must not both
        # decide what this replica's calls have added.
        try:
            async with self._exchange:
                entry, checking = await self._read_through(program_id, check=check)
        except STORE_ERRORS as exc:
            self.health.unreachable("load", exc)
            return await self._provisional(program_id)  # the local copy if there is one
        if checking is None:
            return entry
        await asyncio.shield(checking)  # a client that leaves meanwhile does not cut the check short
        return await super().load(program_id)  # None if it ended meanwhile

    async def _read_through(self, program_id: str, *, check: bool) -> tuple[ProgramEntry | None,
                                                                             asyncio.Task[None] | None]:
        """Under the exchange lock: the program as the store and the local copy say together (taken over,
        caught up, provisional or none), and the takeover's check of it if one runs."""
        await self.outage.first_contact()
        held = await super().load(program_id)
        if held is not None and self._trusted(program_id):  # a concurrent load took it over meanwhile
            return held, self.takeovers.running(program_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.program(program_id))
            pipe.get(self.keys.epoch)
            pipe.exists(self.keys.recovering)
            pipe.exists(self.keys.ended(program_id))
            fields, epoch, recovering, ended = await pipe.execute()
        if held is None and not fields and not ended and self.outage.restarted_lately(bool(recovering), epoch):
            # the program may be on its way back from the replica that holds it: serve it meanwhile
            return await self._provisional(program_id), None
        ours, theirs = self._opened.get(program_id, ""), fields.get("opened_at", "")
        if held is not None and fields and ours and theirs != ours:
            await self._drop(program_id)  # a copy of an earlier program under this id: take the new one over
            held = None
        if held is not None:
            entry, moved = await self._revalidate(held, fields)
            if fields and not ours:  # a provisional copy learns which program it is
                self._opened[program_id] = theirs
        elif not fields or "owner" not in fields:
            return None, None
        else:
            entry, moved = await self._take_over(program_id, fields), True
        checking = self.takeovers.running(program_id)
        if moved and check and entry is not None and self.takeovers.enabled and checking is None:
            checking = self.takeovers.start(program_id, float(fields.get("opened_at", "0")),
                                            functools.partial(self._repair, entry))
        return entry, checking

    def _trusted(self, program_id: str) -> bool:
        """Whether the local copy is the truth without a look at the store: it is in use here, or the
        store may not have it, or the store is out of reach."""
        return (self.outage.trusted(program_id)
                or time.monotonic() - self._used.get(program_id, -math.inf) <= self.revalidate_after)

    async def _provisional(self, program_id: str) -> ProgramEntry | None:
        """The store is out of reach (or just restarted empty) and this replica does not hold the program:
        serve it on a copy of its own, written when the store has it (``autellix.control.store.outage``). The
        local copy if there is one; None if it ended here."""
        if (held := await super().load(program_id)) is not None:
            return held
        if await super().ended(program_id):
            return None
        entry = await super().open(program_id, time.monotonic())
        self.outage.served_provisionally(program_id)
        self._others[program_id] = dict.fromkeys(ADDED, 0.0)  # unknown until the store answers
        self._opened[program_id] = ""
        self._used[program_id] = time.monotonic()
        self._keep_going()
        return entry

    async def _drop(self, program_id: str) -> None:
        """Forget the local copy only: the program may live on in the store (and elsewhere)."""
        await super().end(program_id, remember=False)
        self._untrack(program_id)

    def _untrack(self, program_id: str) -> None:
        self._dirty.discard(program_id)
        self._used.pop(program_id, None)
        self._others.pop(program_id, None)
        self._opened.pop(program_id, None)
        self.outage.forget(program_id)

    def _repair(self, entry: ProgramEntry, said: EngineService) -> float:
        """The takeover's check found ``said`` on the engines: raise the program's service to it if the store's
        is lower; the seconds added."""
        program_id = entry.program_id
        if self.table.get(program_id) is not entry or said.service <= entry.service + 1e-9:
            return 0.0
        added = said.service - entry.service
        log.info("program %r taken over: service %.3f s in the store, %.3f s on its engines; repaired",
                 program_id, entry.service, said.service)
        entry.service = said.service
        others = self._others.get(program_id)
        if others is not None:
            others["service"] += added  # not a call of ours: the next write raises the floor, adds nothing
        self._changed(program_id)
        return added

    async def _revalidate(self, held: ProgramEntry, fields: dict[str, str]) -> tuple[ProgramEntry | None, bool]:
        """A local copy not used here for a while may be stale: the program may have been served
        elsewhere meanwhile (it was opened here and hashes elsewhere, or membership changed and
        changed back). Catch up with what the store has; a program ended elsewhere ends here too.
        Also says whether another replica wrote service since our last exchange (a move)."""
        program_id = held.program_id
        if not fields:
            if await self.redis.exists(self.keys.ended(program_id)):
                await super().end(program_id, remember=True)
                self._untrack(program_id)
                return None, False
            return held, False  # the store lost it (restarted empty): this copy is all there is
        others = self._others.setdefault(program_id, dict.fromkeys(ADDED, 0.0))
        mine = contribution(held, others)
        now_others = {name: stored(fields, name) - credited(fields, self.replica_id, name) for name in ADDED}
        moved = now_others["service"] > others["service"] + 1e-6
        for name in ADDED:  # the others' part as the store has it now, plus everything our calls added
            set_counter(held, name, now_others[name] + mine[name])
            others[name] = now_others[name]
        for name in MAXIMA:
            set_counter(held, name, max(getattr(held, name), stored(fields, name)))
        held.engines |= set(json.loads(fields.get("engines", "[]")))
        for model, engine in json.loads(fields.get("pins", "{}")).items():
            if self.pinned(program_id, model) is None:
                super().pin(program_id, model, engine)
        if "owner" in fields and "owner_unknown" not in fields:  # a provisional copy's guess gives way
            held.owner, held.implicit = json.loads(fields["owner"]), bool(int(fields.get("implicit", "0")))
        self._used[program_id] = time.monotonic()
        return held, moved

    async def _take_over(self, program_id: str, fields: dict[str, str]) -> ProgramEntry:
        """Hold locally a program another replica served (after a move or a restart)."""
        try:
            entry = await super().open(program_id, time.monotonic(), owner=json.loads(fields["owner"]),
                                       implicit=bool(int(fields.get("implicit", "0"))))
        except DuplicateProgram:  # a concurrent load took it over first
            return self.entry(program_id)
        for name in COUNTERS:
            set_counter(entry, name, stored(fields, name))
        # what the store credits to this replica (it served the program before, under this process)
        self._others[program_id] = {name: stored(fields, name) - credited(fields, self.replica_id, name)
                                    for name in ADDED}
        self._opened[program_id] = fields.get("opened_at", "")
        entry.engines = set(json.loads(fields.get("engines", "[]")))
        for model, engine in json.loads(fields.get("pins", "{}")).items():
            super().pin(program_id, model, engine)
        log.info("took over program %r (service %.3f s, %d calls)", program_id, entry.service, entry.calls_done)
        self._used[program_id] = time.monotonic()
        return entry

    async def ended(self, program_id: str) -> bool:
        if await super().ended(program_id):
            return True
        if not self.outage.up:
            return False  # the store's ended ids are out of reach: only ends seen here count
        try:
            return bool(await self.redis.exists(self.keys.ended(program_id)))
        except STORE_ERRORS as exc:
            self.health.unreachable("ended", exc)
            return False

    async def end(self, program_id: str, *, remember: bool = True) -> ProgramEntry | None:
        if program_id not in self.table:
            await self._load(program_id, check=False)  # ended here though served elsewhere
        why = self.outage.unwritten.get(program_id)
        entry = await super().end(program_id, remember=remember)
        if entry is None:
            return None
        self._untrack(program_id)
        if why == "opened" and not remember:
            return entry  # never reached the store (a one-call program during an outage): nothing to undo
        if not self.outage.up:
            self.outage.ended_here(program_id, remember)
            return entry
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                self.connection.queue_end(pipe, program_id, remember=remember, ended_ttl=self.ended_ttl)
                await pipe.execute()
        except STORE_ERRORS as exc:
            self.health.unreachable("end", exc)
            self.outage.ended_here(program_id, remember)
        return entry

    async def expire(self, now: float) -> list[ProgramEntry]:
        """Drop local copies idle for ``idle_ttl``, and only those: the program may have moved to
        another replica, which keeps its key alive. A program nobody serves any more leaves the
        store when its key expires (``key_ttl`` after its last write)."""
        idle = [e for e in self.programs() if not e.active and now - e.last_activity > self.idle_ttl]
        for entry in idle:
            await self._drop(entry.program_id)
        return idle

    async def flush(self) -> None:
        """Write every program changed since the last flush: add what its sums grew by here,
        merge its maxima, replace its pins. On an error nothing is lost: the next flush adds it."""
        async with self._exchange:
            await self._flush()

    async def _flush(self) -> None:
        # programs the store may not have wait for the write back (which sends them whole)
        dirty = {p for p in self._dirty if p not in self.outage.unwritten}
        self._dirty -= dirty
        ttl_ms = int(self.key_ttl * 1000)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for program_id in dirty:
                    entry = self.table.get(program_id)
                    if entry is None:
                        continue
                    args = merge_args(entry, self.contribution(entry), ttl_ms=ttl_ms,
                                      opened_at=self._opened.get(program_id, ""), replica_id=self.replica_id,
                                      pins=self.pins(program_id))
                    await self._merge(keys=[self.keys.program(program_id)], args=args, client=pipe)
                await pipe.execute()
        except BaseException:
            self._dirty |= dirty  # sent again whole: counted once whether or not the store applied it
            raise

    async def close(self) -> None:
        """Stop writing behind and write what is pending (the replica's SIGTERM path). The connection stays
        open: it is its owner's (``autellix.control.store.shared``) to close."""
        await self.takeovers.cancel_all()
        await cancel(self._keeper)
        self._keeper = None
        try:
            if not self.outage.up or self.outage.owed:
                await self.ping()  # the store may be back: write back first
            await self.flush()
        except STORE_ERRORS:
            log.warning("program store out of reach at stop: the last state of %d programs is not written",
                        len(self._dirty) + len(self.outage.unwritten))

    def _changed(self, program_id: str) -> None:
        self._dirty.add(program_id)
        self._used[program_id] = time.monotonic()
        self._keep_going()

    def _keep_going(self) -> None:
        """The write behind and the watch on the store, from the first use on."""
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self._keep(), name="autellix-program-store")

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            if time.monotonic() - self._refreshed > self.key_ttl / 4:
                self._refreshed = time.monotonic()
                self._dirty.update(e.program_id for e in self.programs() if e.active)
            if self.outage.due():
                with contextlib.suppress(*STORE_ERRORS):  # counted by ping; tried again next time
                    await self.ping()
            if self._dirty and self.outage.up:
                try:
                    await self.flush()
                except STORE_ERRORS as exc:  # out of reach: keep serving from memory, write it later
                    self.health.unreachable("flush", exc)
            if self.outage.up:
                try:
                    await self.exchange_tenants()
                except STORE_ERRORS as exc:  # the shares go on from this replica's calls alone meanwhile
                    self.health.unreachable("tenants", exc)

    async def exchange_tenants(self) -> None:
        """Tell the store each tenant's model time served here, and hear what the other replicas served:
        the replicas' shares then follow every replica's calls (written as totals, so a retry counts once)."""
        shares = self.tenants
        ours = {f"{share.name or '-'}{TENANT_SEP}{self.replica_id}": share.service for share in shares
                if share.service > 0}
        async with self.redis.pipeline(transaction=False) as pipe:
            if ours:
                pipe.hset(self.keys.tenants, mapping=ours)
                pipe.expire(self.keys.tenants, int(self.ended_ttl))
            pipe.hgetall(self.keys.tenants)
            replies = await pipe.execute()
        elsewhere: dict[str, float] = {}
        for field, seconds in replies[-1].items():
            tenant, _, replica = field.rpartition(TENANT_SEP)
            if replica != self.replica_id:
                elsewhere[tenant] = elsewhere.get(tenant, 0.0) + float(seconds)
        for tenant, seconds in elsewhere.items():
            shares.served_elsewhere(None if tenant == "-" else tenant, seconds)

    # ---- the hot path: the local copies', and what it changes is written behind --------------
    def call_arrived(self, program_id: str, call_id: str, now: float, *,
                     thread_id: str | None = None) -> ActiveCall:
        call = super().call_arrived(program_id, call_id, now, thread_id=thread_id)
        self._used[program_id] = time.monotonic()
        return call

    def declare(self, program_id: str, tokens: int) -> None:
        if tokens > self.table[program_id].declared_tokens:
            super().declare(program_id, tokens)
            self._changed(program_id)

    def call_finished(self, program_id: str, call_id: str, now: float, *, model_time: float, wait: float = 0.0,
                      prompt_tokens: int = 0, completion_tokens: int = 0) -> ProgramEntry:
        entry = super().call_finished(program_id, call_id, now, model_time=model_time, wait=wait,
                                      prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        self._changed(program_id)
        return entry

    def call_aborted(self, program_id: str, call_id: str, now: float, *, wait: float = 0.0) -> ProgramEntry:
        entry = super().call_aborted(program_id, call_id, now, wait=wait)
        self._changed(program_id)
        return entry

    def pin(self, program_id: str, model: str, engine: str | None) -> None:
        super().pin(program_id, model, engine)
        self._changed(program_id)

    def drop_engine(self, engine: str) -> list[str]:
        freed = super().drop_engine(engine)
        for program_id in freed:
            self._changed(program_id)
        return freed


__all__ = ["DAY_S", "RedisProgramStore"]
