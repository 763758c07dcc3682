"""Outage mode of the shared program store: what a replica owes the store it could not reach, written back after.

No call fails because the store does. An operation that cannot reach it (refused,
reset, no answer within the client's timeout) marks the store down
(``autellix.control.store.health``), and until a look at the store succeeds again
(``Outage.look``: every ``flush_interval`` by the write behind, and every second by
the store's watch) the replica does not try it on the hot path:

* a program held here is served from its local copy;
* a new session (``open``) is opened here and written when the store is back;
* a call naming a program this replica does not hold is served on a *provisional*
  copy opened for it (no service yet, no owner: a tenant's session, whose owner this
  replica cannot check, still gets 404): the replica cannot tell a session opened on
  another replica from an id nobody opened, and answering 404 would end a live
  program. Its calls add up like any replica's and are written when the store is back;
* an end is applied here and written when the store is back.

When the store answers again, before anything else is written, this replica writes
back what it owes (``Outage.look``): the ends it applied, every program opened here
or held provisionally (added to what the store has, then caught up with it; one that
ended meanwhile ends here too; a provisional copy that served no call is dropped),
and, if the store lost its state (its epoch changed), every program held here,
merged by maximum with what other replicas wrote back first (each replica's copy is
what the store had at its last exchange plus its own calls since: the largest is the
best). Sessions are then known on every replica again. Until every replica has done
so, a program missing from the store may be on its way back: for
``WRITE_BACK_GRACE_S`` (10 s) after a replica noticed the new epoch (it says so in
``{prefix}recovering``), and on a replica that has not noticed yet, a call naming a
program the store does not have (and that did not end) is served provisionally too
(``Outage.restarted_lately``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from typing import Literal, Protocol

from autellix.control.store.connection import STORE_ERRORS, StoreConnection
from autellix.control.store.health import StoreHealth
from autellix.control.store.scripts import WRITE_BACK, write_back_args
from autellix.core import ProgramEntry

log = logging.getLogger(__name__)

#: Seconds between two looks at the store's epoch while it answers (a store that restarted
#: empty is noticed within this, and this replica's programs written back).
EPOCH_CHECK_S = 1.0
#: Seconds after a replica noticed that the store restarted empty during which a program missing
#: from the store may still be on its way back from another replica: served provisionally, not 404.
WRITE_BACK_GRACE_S = 10.0

#: Why this replica holds a program the store may not have: opened here, or served here
#: (provisionally) without reading the store, while the store was out of reach.
Unwritten = Literal["opened", "provisional"]


class Holder(Protocol):
    """What writing back needs of the program store it writes back for (``RedisProgramStore``)."""

    #: This replica's name in the programs' hashes; seconds a program's key lives after a write.
    replica_id: str
    key_ttl: float

    def held(self) -> Iterable[ProgramEntry]:
        """The programs held here."""
        ...

    def contribution(self, entry: ProgramEntry) -> dict[str, float]:
        """What this replica's calls have added to the program's sums."""
        ...

    def opened_at(self, program_id: str) -> str:
        """Which incarnation of the id the local copy is ('' unknown: a provisional copy)."""
        ...

    def pins(self, program_id: str) -> dict[str, str]: ...

    async def refused(self, entry: ProgramEntry, *, ended: bool) -> None:
        """The store did not take the program back: it ended meanwhile, or it is a provisional copy that
        served no call. The local copy goes too."""
        ...

    async def written_back(self, entry: ProgramEntry, fields: dict[str, str]) -> bool:
        """The store has the program now (``fields``: its hash): catch up with it. Whether the local copy
        was still held (not ended here meanwhile)."""
        ...


class Outage:
    """A replica's side of the store's outages: the store's health, the programs and ends the store may not
    have, and the store's epoch as of the last exchange."""

    def __init__(self, connection: StoreConnection, *, ended_ttl: float, health: StoreHealth | None = None) -> None:
        self.connection = connection
        self.ended_ttl = ended_ttl
        self.health = health if health is not None else StoreHealth()
        #: Programs held here that the store may not have (the store was out of reach).
        self.unwritten: dict[str, Unwritten] = {}
        #: Ends applied here while the store was out of reach: program id -> remembered (404 later).
        self.ends: dict[str, bool] = {}
        #: The store's epoch as of this replica's last exchange; None before the first.
        self.epoch: str | None = None
        self.epoch_checked = -math.inf
        self._write_back_one = connection.redis.register_script(WRITE_BACK)

    # ---- the ledger ---------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self.health.up

    @property
    def owed(self) -> bool:
        """Whether this replica has something to write back."""
        return bool(self.unwritten or self.ends)

    def due(self) -> bool:
        """Whether the store should be looked at now: it is down, or its epoch was not read for a while."""
        return not self.health.up or time.monotonic() - self.epoch_checked >= EPOCH_CHECK_S

    def trusted(self, program_id: str) -> bool:
        """Whether the local copy is the truth without a look at the store: the store is out of reach,
        or may not have the program."""
        return not self.health.up or program_id in self.unwritten

    def opened_here(self, program_id: str) -> None:
        self.unwritten[program_id] = "opened"

    def served_provisionally(self, program_id: str) -> None:
        self.unwritten[program_id] = "provisional"
        self.health.provisional += 1
        log.info("program %r served here provisionally, until the store has it", program_id)

    def ended_here(self, program_id: str, remember: bool) -> None:
        self.ends[program_id] = remember

    def forget(self, program_id: str) -> None:
        self.unwritten.pop(program_id, None)

    def restarted_lately(self, recovering: bool, epoch: str | None) -> bool:
        """Whether the store restarted empty a moment ago (another replica says so, or this one has not
        noticed yet): a program it does not have may be on its way back from the replica that holds it."""
        return bool(recovering) or epoch != self.epoch

    # ---- looks at the store -----------------------------------------------------------------
    async def first_contact(self) -> None:
        """The store's epoch before this replica first writes or reads a program, so that a store that
        restarts empty afterwards is told from the one this replica knew."""
        if self.epoch is None:
            self.epoch = await self.connection.epoch()
            self.epoch_checked = time.monotonic()

    async def look(self, holder: Holder) -> None:
        """Look at the store (its epoch); when it answers after an outage, or with a new epoch (it
        restarted empty), write back what ``holder`` owes it first. Raises what the store raised. The
        caller holds the store's exchange lock: nothing else decides what this replica's calls added."""
        try:
            epoch = await self.connection.epoch()
        except STORE_ERRORS as exc:
            self.health.unreachable("check", exc)
            raise
        self.epoch_checked = time.monotonic()
        if self.epoch is None:
            self.epoch = epoch
        lost = epoch != self.epoch
        if lost or self.owed:
            try:
                if lost:  # other replicas: a program missing now may be on its way back
                    await self.connection.redis.set(self.connection.keys.recovering, "1",
                                                    px=int(WRITE_BACK_GRACE_S * 1000))
                await self._write_back(holder, lost=lost)
            except STORE_ERRORS as exc:
                self.health.unreachable("write_back", exc)
                raise
            self.epoch = epoch
        self.health.answered()

    async def _write_back(self, holder: Holder, *, lost: bool) -> None:
        """Write what this replica did while the store was out of reach (the module's docstring);
        ``lost``: the store restarted empty, so every program held here is written back."""
        connection, keys = self.connection, self.connection.keys
        ends = dict(self.ends)
        if ends:
            async with connection.redis.pipeline(transaction=False) as pipe:
                for program_id, remember in ends.items():
                    connection.queue_end(pipe, program_id, remember=remember, ended_ttl=self.ended_ttl)
                await pipe.execute()
            for program_id in ends:
                self.ends.pop(program_id, None)
        programs = [e for e in holder.held() if lost or e.program_id in self.unwritten]
        if not programs:
            return
        async with connection.redis.pipeline(transaction=False) as pipe:
            for entry in programs:
                program_id = entry.program_id
                why = self.unwritten.get(program_id)
                had_calls = bool(entry.calls_done or entry.calls_aborted or entry.active)
                # a provisional copy's owner is a guess, and one that served no call is nobody's program
                args = write_back_args(entry, holder.contribution(entry), ttl_ms=int(holder.key_ttl * 1000),
                                       mode="add" if why is not None else "max",
                                       create=why != "provisional" or had_calls, owner_known=why != "provisional",
                                       opened_at=holder.opened_at(program_id), replica_id=holder.replica_id,
                                       pins=holder.pins(program_id))
                await self._write_back_one(keys=[keys.program(program_id), keys.ended(program_id)], args=args,
                                           client=pipe)
            replies = await pipe.execute()
        for entry, reply in zip(programs, replies, strict=True):
            self.unwritten.pop(entry.program_id, None)
            if reply[0] != "written":
                await holder.refused(entry, ended=reply[0] == "ended")
            elif await holder.written_back(entry, dict(zip(reply[1::2], reply[2::2], strict=True))):
                self.health.written_back += 1
        log.info("wrote %d programs back to the program store%s", len(programs),
                 " (it had restarted empty)" if lost else "")


__all__ = ["EPOCH_CHECK_S", "WRITE_BACK_GRACE_S", "Holder", "Outage", "Unwritten"]
