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
* ``{prefix}ended:{id}``: the id ended or expired (late calls get 404), for ``ended_ttl``.

A write behind adds what the program's sums (service, waiting, calls, tokens)
grew by on this replica since its last exchange with the store, and merges its
critical path by maximum (a Lua script, atomic per program): when two replicas
briefly serve one program at once (calls Envoy retried elsewhere while a dead
replica was being ejected, membership flapping), their calls add up and neither
takes the other's back. A write behind never recreates a program that ended.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator

import redis.asyncio as aioredis

from autellix.control.store import EngineService, MemoryProgramStore, ServiceWitness
from autellix.core import ActiveCall, DuplicateProgram, Policy, ProgramEntry

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
# any), A, M, then A (name, increment) pairs added, M (name, value) pairs merged by maximum,
# then (name, value) pairs replaced. Nothing (0) if the program is gone (ended or expired
# meanwhile: a write behind never recreates it) or is another program under the same id.
_MERGE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local opened = redis.call('HGET', KEYS[1], 'opened_at')
if ARGV[2] ~= '' and opened and opened ~= ARGV[2] then return 0 end
local added, maxima = tonumber(ARGV[3]), tonumber(ARGV[4])
local i = 5
for _ = 1, added do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
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


def _stored(fields: dict[str, str], name: str) -> float:
    """A counter as the store has it: the service is the larger of its sum and its floor."""
    value = float(fields.get(name, "0"))
    return max(value, float(fields.get(SERVICE_FLOOR, "0"))) if name == "service" else value


def _sums(entry: ProgramEntry) -> dict[str, float]:
    return {name: float(getattr(entry, name)) for name in ADDED}


def _set(entry: ProgramEntry, name: str, value: float) -> None:
    setattr(entry, name, round(value) if isinstance(getattr(entry, name), int) else value)


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
        self.redis = aioredis.Redis.from_url(url, decode_responses=True)
        self._open = self.redis.register_script(_OPEN)
        self._merge = self.redis.register_script(_MERGE)
        #: A local copy unused here for longer is checked against the store on its next load.
        self.revalidate_after = revalidate_after
        self._used: dict[str, float] = {}
        #: Per program held here: the sums as of the last exchange with the store (what we
        #: wrote or read); a flush adds what grew since.
        self._synced: dict[str, dict[str, float]] = {}
        self._exchange = asyncio.Lock()
        self._dirty: set[str] = set()
        self._flusher: asyncio.Task[None] | None = None
        #: Per program held here: its ``opened_at`` in the store (which incarnation of the id).
        self._opened: dict[str, str] = {}
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

    # ---- sessions: written through ---------------------------------------------------
    async def open(self, program_id: str, now: float, *, owner: str | None = None,
                   implicit: bool = False) -> ProgramEntry:
        if program_id in self.local:
            raise DuplicateProgram(program_id)
        # One round trip, atomic: of two replicas opening one id, one wins.
        opened_at = repr(time.time())
        claimed = await self._open(keys=[self._program_key(program_id), self._ended_key(program_id)],
                                   args=[int(self.key_ttl * 1000), json.dumps(owner), int(implicit), opened_at])
        if not claimed:
            raise DuplicateProgram(program_id)
        self._used[program_id] = time.monotonic()
        self._opened[program_id] = opened_at
        entry = await self.local.open(program_id, now, owner=owner, implicit=implicit)
        self._synced[program_id] = _sums(entry)
        return entry

    async def load(self, program_id: str) -> ProgramEntry | None:
        return await self._load(program_id, check=True)

    async def _load(self, program_id: str, *, check: bool) -> ProgramEntry | None:
        checking = self._checking.get(program_id)
        if checking is not None:  # taken over a moment ago: its calls wait for the engines' word
            await asyncio.shield(checking)
        held = await self.local.load(program_id)
        if held is not None and time.monotonic() - self._used.get(program_id, -math.inf) <= self.revalidate_after:
            return held  # in use here: this replica serves it, the local copy is the truth
        # One exchange with the store at a time: a flush in flight and a catch-up must not both
        # decide what this replica's calls have added.
        async with self._exchange:
            held = await self.local.load(program_id)
            fields = await self.redis.hgetall(self._program_key(program_id))
            if held is not None and fields and fields.get("opened_at", "") != self._opened.get(program_id, ""):
                await self._drop(program_id)  # a copy of an earlier program under this id: take the new one over
                held = None
            if held is not None:
                entry, moved = await self._revalidate(held, fields)
            elif not fields or "owner" not in fields:
                return None
            else:
                entry, moved = await self._take_over(program_id, fields), True
            checking = self._checking.get(program_id)
            if moved and check and entry is not None and self._witness is not None and checking is None:
                since = float(fields.get("opened_at", "0"))
                checking = self._checking[program_id] = asyncio.get_running_loop().create_task(
                    self._check(entry, since), name="autellix-takeover-check")
        if checking is None:
            return entry
        await asyncio.shield(checking)  # a client that leaves meanwhile does not cut the check short
        return await self.local.load(program_id)  # None if it ended meanwhile

    async def _drop(self, program_id: str) -> None:
        """Forget the local copy only: the program may live on in the store (and elsewhere)."""
        await self.local.end(program_id, remember=False)
        self._untrack(program_id)

    def _untrack(self, program_id: str) -> None:
        self._dirty.discard(program_id)
        self._used.pop(program_id, None)
        self._synced.pop(program_id, None)
        self._opened.pop(program_id, None)

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
            synced = self._synced.get(program_id)
            if synced is not None:
                synced["service"] += added  # not a call of ours: the next write raises the floor, adds nothing
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
        synced = self._synced.setdefault(program_id, _sums(held))
        moved = _stored(fields, "service") > synced["service"] + 1e-6
        for name in ADDED:  # the store's sum, plus what our calls added since we last wrote
            stored = _stored(fields, name)
            _set(held, name, stored + getattr(held, name) - synced[name])
            synced[name] = stored
        for name in MAXIMA:
            _set(held, name, max(getattr(held, name), _stored(fields, name)))
        held.engines |= set(json.loads(fields.get("engines", "[]")))
        for model, engine in json.loads(fields.get("pins", "{}")).items():
            if self.local.pinned(program_id, model) is None:
                self.local.pin(program_id, model, engine)
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
        self._synced[program_id] = _sums(entry)
        self._opened[program_id] = fields.get("opened_at", "")
        entry.engines = set(json.loads(fields.get("engines", "[]")))
        for model, engine in json.loads(fields.get("pins", "{}")).items():
            self.local.pin(program_id, model, engine)
        log.info("took over program %r (service %.3f s, %d calls)", program_id, entry.service, entry.calls_done)
        self._used[program_id] = time.monotonic()
        return entry

    async def ended(self, program_id: str) -> bool:
        return await self.local.ended(program_id) or bool(await self.redis.exists(self._ended_key(program_id)))

    async def end(self, program_id: str, *, remember: bool = True) -> ProgramEntry | None:
        if program_id not in self.local:
            await self._load(program_id, check=False)  # ended here though served elsewhere
        entry = await self.local.end(program_id, remember=remember)
        if entry is None:
            return None
        self._untrack(program_id)
        await self._forget(program_id, remember)
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
        dirty, self._dirty = self._dirty, set()
        ttl_ms = int(self.key_ttl * 1000)
        written: dict[str, dict[str, float]] = {}
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for program_id in dirty:
                    entry = self.local.table.get(program_id)
                    if entry is None:
                        continue
                    now_sums = _sums(entry)
                    synced = self._synced.setdefault(program_id, dict.fromkeys(ADDED, 0.0))
                    added = [x for name in ADDED for x in (name, repr(now_sums[name] - synced[name]))]
                    maxima = [x for name in MAXIMA for x in (name, repr(float(getattr(entry, name))))]
                    maxima += [SERVICE_FLOOR, repr(float(entry.service))]  # our view: at least this much
                    replaced = ["pins", json.dumps(self.local.pins(program_id)),
                                "engines", json.dumps(sorted(entry.engines))]
                    await self._merge(keys=[self._program_key(program_id)],
                                      args=[ttl_ms, self._opened.get(program_id, ""), len(ADDED), len(MAXIMA) + 1,
                                            *added, *maxima, *replaced],
                                      client=pipe)
                    written[program_id] = now_sums
                await pipe.execute()
        except BaseException:
            self._dirty |= dirty
            raise
        for program_id, sums in written.items():
            if program_id in self._synced:
                self._synced[program_id] = sums

    async def close(self) -> None:
        """Stop writing behind, write what is pending, disconnect (the replica's SIGTERM path)."""
        for check in list(self._checking.values()):
            check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await check
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        await self.flush()
        await self.redis.aclose()

    def _changed(self, program_id: str) -> None:
        self._dirty.add(program_id)
        self._used[program_id] = time.monotonic()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._write_behind())

    async def _write_behind(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            if time.monotonic() - self._refreshed > self.key_ttl / 4:
                self._refreshed = time.monotonic()
                self._dirty.update(e.program_id for e in self.local.programs() if e.active)
            if not self._dirty:
                continue
            try:
                await self.flush()
            except Exception:  # Redis away: keep serving from memory, retry with the next flush
                log.warning("writing program state behind to Redis failed", exc_info=True)

    # ---- the hot path: local ------------------------------------------------------------
    def entry(self, program_id: str) -> ProgramEntry:
        return self.local.entry(program_id)

    def is_active(self, program_id: str, call_id: str) -> bool:
        return self.local.is_active(program_id, call_id)

    def priority(self, program_id: str) -> float:
        return self.local.priority(program_id)

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
