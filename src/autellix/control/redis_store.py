"""``ProgramStore`` shared by gateway replicas through Redis: any replica can take over a program.

The rules are the interface's own (``autellix.control.store``): the hot path is
local (a ``MemoryProgramStore`` inside), sessions are written through, a replica
that does not hold a program reads it through once and holds it from then on,
and what calls change (service, waiting, tokens, pins) is written behind within
``flush_interval`` (0.5 s). In Redis, per program:

* ``{prefix}program:{id}``: a hash with the owner, ``implicit``, the counters and
  the pins (JSON); expires after ``key_ttl`` without a write (twice the idle TTL,
  or a day when programs never idle out), so a program nobody serves leaves by
  itself; a replica's own idle expiry drops only its local copy (the program may
  have moved on);
* ``{prefix}ended:{id}``: the id ended or expired (late calls get 404), for ``ended_ttl``;

and once, ``{prefix}epoch``: a random id set by the first replica that finds none.
A store that restarted empty has none (or a new one): that is how a replica tells
a store that lost everything from one that was only out of reach.

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
(``check_takeovers``; the rule: ``autellix.control.store``): what the store lost with a
dead replica's last write behind, the engines still count. The store's ``service`` is a
sum of what replicas added, and a repair adds nothing to it: the repair raises the
program's ``service_floor`` instead, which every write behind merges by maximum with
the writer's own view of the service, and a reader takes the larger of the two. So a
replica that was not dead after all (the program moved on a membership change) and
writes its last second later does not count that second twice. Calls of the program
arriving during the check wait for it (at most ``check_timeout`` and a little); calls
of programs held here never see it.

``opened_at`` (wall clock, written at open) tells the program from an earlier one under
the same id: a write behind for another incarnation is dropped, a local copy of one is
replaced by a takeover, and an engine's tally that began before the open is not counted.

Times (``created_at``, last activity) are each replica's monotonic clock and are
not shared: a replica taking a program over starts its idle clock at the takeover.

When the store is out of reach
------------------------------
No call fails because the store does. An operation that cannot reach it (refused,
reset, no answer within ``socket_timeout``) marks the store down (``health``), and
until a look at the store succeeds again (every ``flush_interval``, by the write
behind) the replica does not try it on the hot path:

* a program held here is served from its local copy;
* a new session (``open``) is opened here and written when the store is back;
* a call naming a program this replica does not hold is served on a *provisional*
  copy opened for it (no service yet, no owner: a tenant's session, whose owner this
  replica cannot check, still gets 404): the replica cannot tell a session opened on
  another replica from an id nobody opened, and answering 404 would end a live
  program. Its calls add up like any replica's and are written when the store is back;
* an end is applied here and written when the store is back.

When the store answers again, before anything else is written, this replica writes
its programs back (``_write_back``): the ends it applied, every program opened here
or held provisionally (added to what the store has, then caught up with it; one that
ended meanwhile ends here too; a provisional copy that served no call is dropped),
and, if the store lost its state (its epoch changed), every program held here,
merged by maximum with what other replicas wrote back first (each replica's copy is
what the store had at its last exchange plus its own calls since: the largest is the
best). Sessions are then known on every replica again. Until every replica has done
so, a program missing from the store may be on its way back: for
``WRITE_BACK_GRACE_S`` (10 s) after a replica noticed the new epoch (it says so in
``{prefix}recovering``), and on a replica that has not noticed yet, a call naming a
program the store does not have (and that did not end) is served provisionally too.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from autellix.control.store import EngineService, MemoryProgramStore, ServiceWitness
from autellix.core import ActiveCall, DuplicateProgram, Policy, ProgramEntry, ProgramView

log = logging.getLogger(__name__)

#: Sums over a program's calls: each replica adds what its calls added (so two replicas
#: that briefly serve one program at once add up). Attained service is a sum of model
#: times under every policy (``autellix.core.policies``); the constructor checks it.
ADDED = ("service", "waiting", "calls_done", "calls_aborted", "prompt_tokens", "completion_tokens")
#: A maximum over the program's calls: merged as the larger value.
MAXIMA = ("critical_path",)
COUNTERS = ADDED + MAXIMA
#: Service that a takeover's check found on the engines: merged by maximum with every writer's view
#: of the service; a reader's service is the larger of it and the sum (the module's docstring).
SERVICE_FLOOR = "service_floor"
DAY_S = 86_400.0
#: How long a takeover waits for the engines' tallies, at most (plus ``CHECK_GRACE``).
CHECK_TIMEOUT = 0.15
CHECK_GRACE = 0.05
#: Seconds between two looks at the store's epoch while it answers (a store that restarted
#: empty is noticed within this, and this replica's programs written back).
EPOCH_CHECK_S = 1.0
#: Seconds after a replica noticed that the store restarted empty during which a program missing
#: from the store may still be on its way back from another replica: served provisionally, not 404.
WRITE_BACK_GRACE_S = 10.0
#: What counts as the store being out of reach (not a bug of ours): no connection, no answer in
#: time, a replica that cannot take writes (a failover under way).
STORE_ERRORS: tuple[type[BaseException], ...] = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                                                 redis.exceptions.ReadOnlyError, OSError)
#: Operations counted in ``StoreHealth.errors``.
OPERATIONS = ("open", "load", "ended", "end", "flush", "check", "write_back")

# KEYS: the program's hash, its ended marker. ARGV: ttl in ms, owner (JSON), implicit (0/1),
# opened_at. 0 if the program is live already; else creates it (an id reused after its end is
# live again).
_OPEN = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'implicit', ARGV[3], 'pins', '{}', 'engines', '[]',
           'opened_at', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
return 1
"""

# KEYS[1]: the program's hash. ARGV: ttl in ms, opened_at (the incarnation written to; '' for
# any), the replica's id, A, M, then A (name, this replica's contribution in all) pairs, M (name,
# value) pairs merged by maximum, then (name, value) pairs replaced. Nothing (0) if the program is
# gone (ended or expired meanwhile: a write behind never recreates it) or is another program
# under the same id.
_MERGE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local opened = redis.call('HGET', KEYS[1], 'opened_at') or ''
if ARGV[2] ~= '' and opened ~= '' and opened ~= ARGV[2] then return 0 end
local added, maxima = tonumber(ARGV[4]), tonumber(ARGV[5])
local i = 6
for _ = 1, added do
  local mine = 'by:' .. ARGV[3] .. ':' .. ARGV[i]
  local before = tonumber(redis.call('HGET', KEYS[1], mine) or '0') or 0
  local now = tonumber(ARGV[i + 1])
  if now ~= before then
    redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], string.format('%.17g', now - before))
    redis.call('HSET', KEYS[1], mine, ARGV[i + 1])
  end
  i = i + 2
end
for _ = 1, maxima do
  local old = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0') or 0
  if tonumber(ARGV[i + 1]) > old then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
  i = i + 2
end
while i < #ARGV do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""

# KEYS[1]: the epoch's key. ARGV[1]: a new random id, set if there is none. Returns the epoch.
_EPOCH = """
local epoch = redis.call('GET', KEYS[1])
if epoch then return epoch end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"""

# A program written back after an outage. KEYS: its hash, its ended marker. ARGV: ttl in ms,
# mode ('add': this replica's contribution set, as a write behind does; 'max': the store lost its
# state, so each sum becomes the larger of what it has and this replica's whole view), create (1:
# create the program if it is missing and did not end), owner (JSON), implicit, opened_at (''
# unknown), owner_known (0: a provisional copy's owner is a guess), pins (JSON), engines (JSON),
# the replica's id, S, then S (name, whole view, contribution) triples, then (name, value) pairs
# merged by maximum. Returns {'ended'}, {'missing'} or {'written', the hash's fields...}.
_WRITE_BACK = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  if redis.call('EXISTS', KEYS[2]) == 1 then return {'ended'} end
  if ARGV[3] ~= '1' then return {'missing'} end
  redis.call('HSET', KEYS[1], 'owner', ARGV[4], 'implicit', ARGV[5], 'opened_at', ARGV[6], 'pins', ARGV[8],
             'engines', ARGV[9])
  if ARGV[7] ~= '1' then redis.call('HSET', KEYS[1], 'owner_unknown', '1') end
elseif ARGV[7] == '1' and redis.call('HEXISTS', KEYS[1], 'owner_unknown') == 1 then
  redis.call('HSET', KEYS[1], 'owner', ARGV[4], 'implicit', ARGV[5])
  redis.call('HDEL', KEYS[1], 'owner_unknown')
end
if (redis.call('HGET', KEYS[1], 'opened_at') or '') == '' and ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'opened_at', ARGV[6])
end
local i = 12
for _ = 1, tonumber(ARGV[11]) do
  local mine = 'by:' .. ARGV[10] .. ':' .. ARGV[i]
  local now = tonumber(ARGV[i + 2])
  if ARGV[2] == 'add' then
    local before = tonumber(redis.call('HGET', KEYS[1], mine) or '0') or 0
    if now ~= before then
      redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], string.format('%.17g', now - before))
    end
  elseif tonumber(ARGV[i + 1]) > (tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0') or 0) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
  redis.call('HSET', KEYS[1], mine, ARGV[i + 2])
  i = i + 3
end
for j = i, #ARGV, 2 do
  if tonumber(ARGV[j + 1]) > (tonumber(redis.call('HGET', KEYS[1], ARGV[j]) or '0') or 0) then
    redis.call('HSET', KEYS[1], ARGV[j], ARGV[j + 1])
  end
end
if (redis.call('HGET', KEYS[1], 'pins') or '{}') == '{}' then redis.call('HSET', KEYS[1], 'pins', ARGV[8]) end
if (redis.call('HGET', KEYS[1], 'engines') or '[]') == '[]' then redis.call('HSET', KEYS[1], 'engines', ARGV[9]) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
local reply = redis.call('HGETALL', KEYS[1])
table.insert(reply, 1, 'written')
return reply
"""

#: Why this replica holds a program the store may not have: opened here, or served here
#: (provisionally) without reading the store, while the store was out of reach.
Unwritten = Literal["opened", "provisional"]


def _stored(fields: dict[str, str], name: str) -> float:
    """A counter as the store has it: the service is the larger of its sum and its floor."""
    value = float(fields.get(name, "0"))
    return max(value, float(fields.get(SERVICE_FLOOR, "0"))) if name == "service" else value


def _contribution(entry: ProgramEntry, others: dict[str, float]) -> dict[str, float]:
    """What this replica's calls have added to each sum: the program's sums less the others' part."""
    return {name: float(getattr(entry, name)) - others[name] for name in ADDED}


def _set(entry: ProgramEntry, name: str, value: float) -> None:
    setattr(entry, name, round(value) if isinstance(getattr(entry, name), int) else value)


@dataclass
class StoreHealth:
    """What a shared store says of itself (the gateway's ``/metrics``): whether it answered last, its
    failed operations, its outages, and what the replica did about them."""

    up: bool = True
    #: Operations that failed because the store was out of reach, by operation (``OPERATIONS``).
    errors: collections.Counter[str] = field(default_factory=lambda: collections.Counter(dict.fromkeys(OPERATIONS, 0)))
    outages: int = 0
    #: Programs this replica served without holding them, while the store was out of reach.
    provisional: int = 0
    #: Programs written back to the store after an outage (``_write_back``).
    written_back: int = 0


async def store_epoch(client: aioredis.Redis, key: str) -> str:
    """The store's epoch at ``key``, set to a new random id if it has none (it started empty)."""
    return str(await client.eval(_EPOCH, 1, key, uuid.uuid4().hex))


def store_client(url: str) -> aioredis.Redis:
    """A client that gives up fast: a store out of reach must not hold calls up. Connect within 0.5 s,
    answer within 1 s, and one immediate retry on a connection error only (a pooled connection the store
    closed when it restarted), never on a timeout (that would double the wait)."""
    return aioredis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=0.5, socket_timeout=1.0,
                                   retry=Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)))


class RedisProgramStore:
    """A ``ProgramStore`` (``autellix.control.store``) over Redis; ``close()`` flushes and disconnects."""

    def __init__(self, url: str, policy: Policy, *, idle_ttl: float = math.inf, flush_interval: float = 0.5,
                 revalidate_after: float = 1.0, ended_ttl: float = DAY_S, prefix: str = "autellix:") -> None:
        if not 0 < flush_interval <= 1.0:
            raise ValueError("flush_interval: the interface promises state written behind within 1 s")
        if policy.attained_service(1.0, 0.0, 1.0) != 2.0:
            raise ValueError(f"policy {policy.name!r}: the store adds up each replica's service, which needs "
                             "service to be a sum of model times")
        self.local = MemoryProgramStore(policy, idle_ttl=idle_ttl)
        self.policy = policy
        self.idle_ttl = idle_ttl
        self.flush_interval = flush_interval
        # A program's key outlives its idle TTL on any one replica; programs with calls in
        # flight have it refreshed (a call may run longer than the TTL).
        self.key_ttl = 2 * idle_ttl if math.isfinite(idle_ttl) else DAY_S
        self._refreshed = time.monotonic()
        self.ended_ttl = ended_ttl
        self.prefix = prefix
        self.redis = store_client(url)
        self._open = self.redis.register_script(_OPEN)
        self._merge = self.redis.register_script(_MERGE)
        self._write_back_one = self.redis.register_script(_WRITE_BACK)
        self.health = StoreHealth()
        #: The store's epoch as of this replica's last exchange; None before the first.
        self._epoch: str | None = None
        self._epoch_checked = -math.inf
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
        #: Programs held here that the store may not have (the store was out of reach).
        self._unwritten: dict[str, Unwritten] = {}
        #: Ends applied here while the store was out of reach: program id -> remembered (404 later).
        self._unwritten_ends: dict[str, bool] = {}
        #: The takeover's check (``check_takeovers``); off until a gateway gives it its engines.
        self._witness: ServiceWitness | None = None
        self._observe: Callable[[str, float], None] | None = None
        self.check_timeout = CHECK_TIMEOUT
        self._checking: dict[str, asyncio.Task[None]] = {}

    def check_takeovers(self, witness: ServiceWitness, observe: Callable[[str, float], None] | None = None, *,
                        timeout: float = CHECK_TIMEOUT) -> None:
        """Check every program taken over against ``witness`` (the engines), waiting at most
        ``timeout`` seconds; ``observe(outcome, seconds added)`` hears each check's outcome
        (``autellix.control.store.CHECK_OUTCOMES``)."""
        self._witness, self._observe, self.check_timeout = witness, observe, timeout

    def _program_key(self, program_id: str) -> str:
        return f"{self.prefix}program:{program_id}"

    def _ended_key(self, program_id: str) -> str:
        return f"{self.prefix}ended:{program_id}"

    @property
    def _epoch_key(self) -> str:
        return f"{self.prefix}epoch"

    @property
    def _recovering_key(self) -> str:
        return f"{self.prefix}recovering"

    # ---- the store's health ------------------------------------------------------------
    def _unreachable(self, operation: str, exc: BaseException) -> None:
        self.health.errors[operation] += 1
        if self.health.up:
            self.health.up = False
            self.health.outages += 1
            log.warning("program store out of reach (%s: %r): serving from local copies until it answers",
                        operation, exc)

    async def ping(self) -> None:
        """Look at the store (its epoch); when it answers after an outage, or with a new epoch (it
        restarted empty), write this replica's programs back first. Raises what the store raised."""
        async with self._exchange:
            try:
                epoch = await store_epoch(self.redis, self._epoch_key)
            except STORE_ERRORS as exc:
                self._unreachable("check", exc)
                raise
            self._epoch_checked = time.monotonic()
            if self._epoch is None:
                self._epoch = epoch
            if epoch != self._epoch or self._unwritten or self._unwritten_ends:
                try:
                    if epoch != self._epoch:  # other replicas: a program missing now may be on its way back
                        await self.redis.set(self._recovering_key, "1", px=int(WRITE_BACK_GRACE_S * 1000))
                    await self._write_back(lost=epoch != self._epoch)
                except STORE_ERRORS as exc:
                    self._unreachable("write_back", exc)
                    raise
                self._epoch = epoch
        if not self.health.up:
            log.info("program store answers again; this replica's programs are written back")
            self.health.up = True

    async def _write_back(self, lost: bool) -> None:
        """Write what this replica did while the store was out of reach (the module's docstring);
        ``lost``: the store restarted empty, so every program held here is written back."""
        ends = dict(self._unwritten_ends)
        if ends:
            async with self.redis.pipeline(transaction=False) as pipe:
                for program_id, remember in ends.items():
                    pipe.delete(self._program_key(program_id))
                    if remember:
                        pipe.set(self._ended_key(program_id), "1", px=int(self.ended_ttl * 1000))
                await pipe.execute()
            for program_id in ends:
                self._unwritten_ends.pop(program_id, None)
        programs = [e for e in self.local.programs() if lost or e.program_id in self._unwritten]
        if not programs:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for entry in programs:
                program_id = entry.program_id
                why = self._unwritten.get(program_id)
                had_calls = bool(entry.calls_done or entry.calls_aborted or entry.active)
                mine = _contribution(entry, self._others.setdefault(program_id, dict.fromkeys(ADDED, 0.0)))
                sums = [x for name in ADDED for x in (name, repr(float(getattr(entry, name))), repr(mine[name]))]
                maxima = [x for name in MAXIMA for x in (name, repr(float(getattr(entry, name))))]
                await self._write_back_one(
                    keys=[self._program_key(program_id), self._ended_key(program_id)],
                    args=[int(self.key_ttl * 1000), "add" if why is not None else "max",
                          int(why != "provisional" or had_calls), json.dumps(entry.owner), int(entry.implicit),
                          self._opened.get(program_id, ""), int(why != "provisional"),
                          json.dumps(self.local.pins(program_id)), json.dumps(sorted(entry.engines)),
                          self.replica_id, len(ADDED), *sums, *maxima, SERVICE_FLOOR, repr(float(entry.service))],
                    client=pipe)
            replies = await pipe.execute()
        for entry, reply in zip(programs, replies, strict=True):
            program_id = entry.program_id
            self._unwritten.pop(program_id, None)
            if reply[0] != "written":
                if self.local.table.get(program_id) is entry and not entry.active:
                    await self.local.end(program_id, remember=reply[0] == "ended")
                    self._untrack(program_id)
                continue
            fields = dict(zip(reply[1::2], reply[2::2], strict=True))
            if self.local.table.get(program_id) is not entry:
                continue  # ended here meanwhile
            await self._revalidate(entry, fields)  # the store has this replica's calls now: catch up with it
            self._opened[program_id] = fields.get("opened_at", "")
            self.health.written_back += 1
        log.info("wrote %d programs back to the program store%s", len(programs),
                 " (it had restarted empty)" if lost else "")

    # ---- sessions: written through ---------------------------------------------------
    async def open(self, program_id: str, now: float, *, owner: str | None = None,
                   implicit: bool = False, parent: str | None = None) -> ProgramEntry:
        if program_id in self.local:
            raise DuplicateProgram(program_id)
        self._keep_going()
        opened_at = repr(time.time())
        if self.health.up:
            try:  # one round trip, atomic: of two replicas opening one id, one wins
                await self._first_contact()
                claimed = await self._open(keys=[self._program_key(program_id), self._ended_key(program_id)],
                                           args=[int(self.key_ttl * 1000), json.dumps(owner), int(implicit),
                                                 opened_at])
            except STORE_ERRORS as exc:
                self._unreachable("open", exc)
            else:
                if not claimed:
                    raise DuplicateProgram(program_id)
        entry = await self.local.open(program_id, now, owner=owner, implicit=implicit, parent=parent)
        if not self.health.up:
            self._unwritten[program_id] = "opened"
        self._used[program_id] = time.monotonic()
        self._opened[program_id] = opened_at
        self._others[program_id] = dict.fromkeys(ADDED, 0.0)  # a new program: all its calls to come are ours
        return entry

    async def load(self, program_id: str) -> ProgramEntry | None:
        return await self._load(program_id, check=True)

    async def _load(self, program_id: str, *, check: bool) -> ProgramEntry | None:
        checking = self._checking.get(program_id)
        if checking is not None:  # taken over a moment ago: its calls wait for the engines' word
            await asyncio.shield(checking)
        held = await self.local.load(program_id)
        if held is not None and self._trusted(program_id):
            return held  # in use here (or the store out of reach): the local copy is the truth
        if not self.health.up:
            return await self._provisional(program_id)
        # One exchange with the store at a time: a flush in flight and a catch-up must not both
        # decide what this replica's calls have added.
        try:
            async with self._exchange:
                entry, checking = await self._read_through(program_id, check=check)
        except STORE_ERRORS as exc:
            self._unreachable("load", exc)
            return await self._provisional(program_id)  # the local copy if there is one
        if checking is None:
            return entry
        await asyncio.shield(checking)  # a client that leaves meanwhile does not cut the check short
        return await self.local.load(program_id)  # None if it ended meanwhile

    async def _read_through(self, program_id: str, *, check: bool) -> tuple[ProgramEntry | None,
                                                                             asyncio.Task[None] | None]:
        """Under the exchange lock: the program as the store and the local copy say together (taken over,
        caught up, provisional or none), and the takeover's check of it if one runs."""
        await self._first_contact()
        held = await self.local.load(program_id)
        if held is not None and self._trusted(program_id):  # a concurrent load took it over meanwhile
            return held, self._checking.get(program_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._program_key(program_id))
            pipe.get(self._epoch_key)
            pipe.exists(self._recovering_key)
            pipe.exists(self._ended_key(program_id))
            fields, epoch, recovering, ended = await pipe.execute()
        if held is None and not fields and not ended and (recovering or epoch != self._epoch):
            # the store restarted empty a moment ago: the program may be on its way back from the
            # replica that holds it (or this replica has not noticed yet): serve it meanwhile
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
        checking = self._checking.get(program_id)
        if moved and check and entry is not None and self._witness is not None and checking is None:
            since = float(fields.get("opened_at", "0"))
            checking = self._checking[program_id] = asyncio.get_running_loop().create_task(
                self._check(entry, since), name="autellix-takeover-check")
        return entry, checking

    def _trusted(self, program_id: str) -> bool:
        """Whether the local copy is the truth without a look at the store: it is in use here, or the
        store may not have it, or the store is out of reach."""
        return (not self.health.up or program_id in self._unwritten
                or time.monotonic() - self._used.get(program_id, -math.inf) <= self.revalidate_after)

    async def _first_contact(self) -> None:
        """The store's epoch before this replica first writes or reads a program, so that a store that
        restarts empty afterwards is told from the one this replica knew."""
        if self._epoch is None:
            self._epoch = await store_epoch(self.redis, self._epoch_key)
            self._epoch_checked = time.monotonic()

    async def _provisional(self, program_id: str) -> ProgramEntry | None:
        """The store is out of reach (or just restarted empty) and this replica does not hold the program:
        serve it on a copy of its own, written when the store has it (the module's docstring). The local
        copy if there is one; None if it ended here."""
        if (held := await self.local.load(program_id)) is not None:
            return held
        if await self.local.ended(program_id):
            return None
        entry = await self.local.open(program_id, time.monotonic())
        self._unwritten[program_id] = "provisional"
        self._others[program_id] = dict.fromkeys(ADDED, 0.0)  # unknown until the store answers
        self._opened[program_id] = ""
        self._used[program_id] = time.monotonic()
        self.health.provisional += 1
        log.info("program %r served here provisionally, until the store has it", program_id)
        self._keep_going()
        return entry

    async def _drop(self, program_id: str) -> None:
        """Forget the local copy only: the program may live on in the store (and elsewhere)."""
        await self.local.end(program_id, remember=False)
        self._untrack(program_id)

    def _untrack(self, program_id: str) -> None:
        self._dirty.discard(program_id)
        self._used.pop(program_id, None)
        self._others.pop(program_id, None)
        self._opened.pop(program_id, None)
        self._unwritten.pop(program_id, None)

    async def _check(self, entry: ProgramEntry, since: float) -> None:
        """The takeover's check: raise the program's service to the engines' sum if the store's is
        lower (``autellix.control.store``); on an error or a timeout keep the store's."""
        program_id = entry.program_id
        said: EngineService | None = None
        added = 0.0
        try:
            assert self._witness is not None
            said = await asyncio.wait_for(
                self._witness.program_service(program_id, since=since, timeout=self.check_timeout),
                self.check_timeout + CHECK_GRACE)
        except Exception as exc:  # the engines, or whoever asks them, failed: the store's value stays
            log.warning("program %r: no answer from its engines (%r); keeping the store's service", program_id, exc)
        finally:
            if self._checking.get(program_id) is asyncio.current_task():
                del self._checking[program_id]
        if said is not None and self.local.table.get(program_id) is entry and said.service > entry.service + 1e-9:
            added = said.service - entry.service
            log.info("program %r taken over: service %.3f s in the store, %.3f s on its engines; repaired",
                     program_id, entry.service, said.service)
            entry.service = said.service
            others = self._others.get(program_id)
            if others is not None:
                others["service"] += added  # not a call of ours: the next write raises the floor, adds nothing
            self._changed(program_id)
        outcome = ("failed" if said is None or said.failed else "repaired" if added
                   else "skipped" if said.asked == 0 else "confirmed")
        if self._observe is not None:
            self._observe(outcome, added)

    async def _revalidate(self, held: ProgramEntry, fields: dict[str, str]) -> tuple[ProgramEntry | None, bool]:
        """A local copy not used here for a while may be stale: the program may have been served
        elsewhere meanwhile (it was opened here and hashes elsewhere, or membership changed and
        changed back). Catch up with what the store has; a program ended elsewhere ends here too.
        Also says whether another replica wrote service since our last exchange (a move)."""
        program_id = held.program_id
        if not fields:
            if await self.redis.exists(self._ended_key(program_id)):
                await self.local.end(program_id, remember=True)
                self._untrack(program_id)
                return None, False
            return held, False  # the store lost it (restarted empty): this copy is all there is
        others = self._others.setdefault(program_id, dict.fromkeys(ADDED, 0.0))
        mine = _contribution(held, others)
        now_others = {name: _stored(fields, name) - self._credited(fields, name) for name in ADDED}
        moved = now_others["service"] > others["service"] + 1e-6
        for name in ADDED:  # the others' part as the store has it now, plus everything our calls added
            _set(held, name, now_others[name] + mine[name])
            others[name] = now_others[name]
        for name in MAXIMA:
            _set(held, name, max(getattr(held, name), _stored(fields, name)))
        held.engines |= set(json.loads(fields.get("engines", "[]")))
        for model, engine in json.loads(fields.get("pins", "{}")).items():
            if self.local.pinned(program_id, model) is None:
                self.local.pin(program_id, model, engine)
        if "owner" in fields and "owner_unknown" not in fields:  # a provisional copy's guess gives way
            held.owner, held.implicit = json.loads(fields["owner"]), bool(int(fields.get("implicit", "0")))
        self._used[program_id] = time.monotonic()
        return held, moved

    async def _take_over(self, program_id: str, fields: dict[str, str]) -> ProgramEntry:
        """Hold locally a program another replica served (after a move or a restart)."""
        try:
            entry = await self.local.open(program_id, time.monotonic(), owner=json.loads(fields["owner"]),
                                          implicit=bool(int(fields.get("implicit", "0"))))
        except DuplicateProgram:  # a concurrent load took it over first
            return self.local.entry(program_id)
        for name in COUNTERS:
            _set(entry, name, _stored(fields, name))
        # what the store credits to this replica (it served the program before, under this process)
        self._others[program_id] = {name: _stored(fields, name) - self._credited(fields, name) for name in ADDED}
        self._opened[program_id] = fields.get("opened_at", "")
        entry.engines = set(json.loads(fields.get("engines", "[]")))
        for model, engine in json.loads(fields.get("pins", "{}")).items():
            self.local.pin(program_id, model, engine)
        log.info("took over program %r (service %.3f s, %d calls)", program_id, entry.service, entry.calls_done)
        self._used[program_id] = time.monotonic()
        return entry

    def _credited(self, fields: dict[str, str], name: str) -> float:
        """This replica's contribution to a sum, as the store has it."""
        return float(fields.get(f"by:{self.replica_id}:{name}", "0"))

    async def ended(self, program_id: str) -> bool:
        if await self.local.ended(program_id):
            return True
        if not self.health.up:
            return False  # the store's ended ids are out of reach: only ends seen here count
        try:
            return bool(await self.redis.exists(self._ended_key(program_id)))
        except STORE_ERRORS as exc:
            self._unreachable("ended", exc)
            return False

    async def end(self, program_id: str, *, remember: bool = True) -> ProgramEntry | None:
        if program_id not in self.local:
            await self._load(program_id, check=False)  # ended here though served elsewhere
        why = self._unwritten.get(program_id)
        entry = await self.local.end(program_id, remember=remember)
        if entry is None:
            return None
        self._untrack(program_id)
        if why == "opened" and not remember:
            return entry  # never reached the store (a one-call program during an outage): nothing to undo
        if not self.health.up:
            self._unwritten_ends[program_id] = remember
            return entry
        try:
            await self._forget(program_id, remember)
        except STORE_ERRORS as exc:
            self._unreachable("end", exc)
            self._unwritten_ends[program_id] = remember
        return entry

    async def _forget(self, program_id: str, remember: bool) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._program_key(program_id))
            if remember:
                pipe.set(self._ended_key(program_id), "1", px=int(self.ended_ttl * 1000))
            await pipe.execute()

    async def expire(self, now: float) -> list[ProgramEntry]:
        """Drop local copies idle for ``idle_ttl``, and only those: the program may have moved to
        another replica, which keeps its key alive. A program nobody serves any more leaves the
        store when its key expires (``key_ttl`` after its last write)."""
        idle = [e for e in self.local.programs() if not e.active and now - e.last_activity > self.idle_ttl]
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
        dirty = {p for p in self._dirty if p not in self._unwritten}
        self._dirty -= dirty
        ttl_ms = int(self.key_ttl * 1000)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for program_id in dirty:
                    entry = self.local.table.get(program_id)
                    if entry is None:
                        continue
                    mine = _contribution(entry, self._others.setdefault(program_id, dict.fromkeys(ADDED, 0.0)))
                    added = [x for name in ADDED for x in (name, repr(mine[name]))]
                    maxima = [x for name in MAXIMA for x in (name, repr(float(getattr(entry, name))))]
                    maxima += [SERVICE_FLOOR, repr(float(entry.service))]  # our view: at least this much
                    replaced = ["pins", json.dumps(self.local.pins(program_id)),
                                "engines", json.dumps(sorted(entry.engines))]
                    await self._merge(keys=[self._program_key(program_id)],
                                      args=[ttl_ms, self._opened.get(program_id, ""), self.replica_id, len(ADDED),
                                            len(MAXIMA) + 1, *added, *maxima, *replaced],
                                      client=pipe)
                await pipe.execute()
        except BaseException:
            self._dirty |= dirty  # sent again whole: counted once whether or not the store applied it
            raise

    async def close(self) -> None:
        """Stop writing behind, write what is pending, disconnect (the replica's SIGTERM path)."""
        for check in list(self._checking.values()):
            check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await check
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
        try:
            if not self.health.up or self._unwritten or self._unwritten_ends:
                await self.ping()  # the store may be back: write back first
            await self.flush()
        except STORE_ERRORS:
            log.warning("program store out of reach at stop: the last state of %d programs is not written",
                        len(self._dirty) + len(self._unwritten))
        await self.redis.aclose()

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
                self._dirty.update(e.program_id for e in self.local.programs() if e.active)
            if not self.health.up or time.monotonic() - self._epoch_checked >= EPOCH_CHECK_S:
                with contextlib.suppress(*STORE_ERRORS):  # counted by ping; tried again next time
                    await self.ping()
            if self._dirty and self.health.up:
                try:
                    await self.flush()
                except STORE_ERRORS as exc:  # out of reach: keep serving from memory, write it later
                    self._unreachable("flush", exc)

    # ---- the hot path: local ------------------------------------------------------------
    def entry(self, program_id: str) -> ProgramEntry:
        return self.local.entry(program_id)

    def is_active(self, program_id: str, call_id: str) -> bool:
        return self.local.is_active(program_id, call_id)

    def priority(self, program_id: str) -> float:
        return self.local.priority(program_id)

    def view(self, program_id: str) -> ProgramView:
        return self.local.view(program_id)

    def call_arrived(self, program_id: str, call_id: str, now: float, *,
                     thread_id: str | None = None) -> ActiveCall:
        call = self.local.call_arrived(program_id, call_id, now, thread_id=thread_id)
        self._used[program_id] = time.monotonic()
        return call

    def call_routed(self, program_id: str, call_id: str, engine: str) -> None:
        self.local.call_routed(program_id, call_id, engine)

    def call_finished(self, program_id: str, call_id: str, now: float, *, model_time: float, wait: float = 0.0,
                      prompt_tokens: int = 0, completion_tokens: int = 0) -> ProgramEntry:
        entry = self.local.call_finished(program_id, call_id, now, model_time=model_time, wait=wait,
                                         prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        self._changed(program_id)
        return entry

    def call_aborted(self, program_id: str, call_id: str, now: float, *, wait: float = 0.0) -> ProgramEntry:
        entry = self.local.call_aborted(program_id, call_id, now, wait=wait)
        self._changed(program_id)
        return entry

    def pinned(self, program_id: str, model: str) -> str | None:
        return self.local.pinned(program_id, model)

    def pin(self, program_id: str, model: str, engine: str | None) -> None:
        self.local.pin(program_id, model, engine)
        self._changed(program_id)

    def pins(self, program_id: str) -> dict[str, str]:
        return self.local.pins(program_id)

    def drop_engine(self, engine: str) -> list[str]:
        freed = self.local.drop_engine(engine)
        for program_id in freed:
            self._changed(program_id)
        return freed

    def programs(self) -> Iterator[ProgramEntry]:
        return self.local.programs()

    def __len__(self) -> int:
        return len(self.local)

    def __contains__(self, program_id: object) -> bool:
        return program_id in self.local
