"""A program's hash in the shared store: its fields, the Lua scripts that change it atomically, their arguments.

Per program, ``{prefix}program:{id}`` is a hash with the owner, ``implicit``,
``opened_at``, the pins and engines (JSON), and the counters:

* the sums over the program's calls (``ADDED``): each replica sets what its own
  calls added in all (``by:{replica}:{name}``) and the script adds the difference to
  the sum, so two replicas serving one program at once add up, and a write sent
  twice counts once;
* the maxima (``MAXIMA``), merged as the larger value;
* ``service_floor`` (``SERVICE_FLOOR``): service a takeover's check found on the
  engines, merged by maximum with every writer's view of the service; a reader's
  service is the larger of it and the sum (``stored``).

The rules the scripts keep are ``autellix.control.store.redis_programs``' (its docstring).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Literal

from autellix.core import ProgramEntry

#: Sums over a program's calls: each replica adds what its calls added (so two replicas
#: that briefly serve one program at once add up). Attained service is a sum of model
#: times under every policy (``autellix.core.policies``); the program store checks it.
ADDED = ("service", "waiting", "calls_done", "calls_aborted", "prompt_tokens", "completion_tokens")
#: Maxima over the program's calls: merged as the larger value (a declared size only grows).
MAXIMA = ("critical_path", "declared_tokens")
COUNTERS = ADDED + MAXIMA
#: Service that a takeover's check found on the engines: merged by maximum with every writer's view
#: of the service; a reader's service is the larger of it and the sum.
SERVICE_FLOOR = "service_floor"

# KEYS: the program's hash, its ended marker. ARGV: ttl in ms, owner (JSON), implicit (0/1),
# opened_at. 0 if the program is live already; else creates it (an id reused after its end is
# live again).
OPEN = """
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
MERGE = """
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
EPOCH = """
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
WRITE_BACK = """
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


def stored(fields: Mapping[str, str], name: str) -> float:
    """A counter as the store has it: the service is the larger of its sum and its floor."""
    value = float(fields.get(name, "0"))
    return max(value, float(fields.get(SERVICE_FLOOR, "0"))) if name == "service" else value


def credited(fields: Mapping[str, str], replica_id: str, name: str) -> float:
    """A replica's contribution to a sum, as the store has it."""
    return float(fields.get(f"by:{replica_id}:{name}", "0"))


def contribution(entry: ProgramEntry, others: Mapping[str, float]) -> dict[str, float]:
    """What this replica's calls have added to each sum: the program's sums less the others' part."""
    return {name: float(getattr(entry, name)) - others[name] for name in ADDED}


def set_counter(entry: ProgramEntry, name: str, value: float) -> None:
    """Set a counter of ``entry`` from the store's text: the counts stay integers."""
    setattr(entry, name, round(value) if isinstance(getattr(entry, name), int) else value)


def open_args(*, ttl_ms: int, owner: str | None, implicit: bool, opened_at: str) -> list[object]:
    """``OPEN``'s ARGV."""
    return [ttl_ms, json.dumps(owner), int(implicit), opened_at]


def merge_args(entry: ProgramEntry, mine: Mapping[str, float], *, ttl_ms: int, opened_at: str, replica_id: str,
               pins: Mapping[str, str]) -> list[object]:
    """``MERGE``'s ARGV for a write behind: this replica's contribution to the sums, its maxima and its view of
    the service (at least this much: the floor), the pins and engines replaced."""
    added = [x for name in ADDED for x in (name, repr(mine[name]))]
    maxima = [x for name in MAXIMA for x in (name, repr(float(getattr(entry, name))))]
    maxima += [SERVICE_FLOOR, repr(float(entry.service))]
    replaced = ["pins", json.dumps(dict(pins)), "engines", json.dumps(sorted(entry.engines))]
    return [ttl_ms, opened_at, replica_id, len(ADDED), len(MAXIMA) + 1, *added, *maxima, *replaced]


def write_back_args(entry: ProgramEntry, mine: Mapping[str, float], *, ttl_ms: int, mode: Literal["add", "max"],
                    create: bool, owner_known: bool, opened_at: str, replica_id: str,
                    pins: Mapping[str, str]) -> list[object]:
    """``WRITE_BACK``'s ARGV: the program whole, as this replica holds it."""
    sums = [x for name in ADDED for x in (name, repr(float(getattr(entry, name))), repr(mine[name]))]
    maxima = [x for name in MAXIMA for x in (name, repr(float(getattr(entry, name))))]
    return [ttl_ms, mode, int(create), json.dumps(entry.owner), int(entry.implicit), opened_at, int(owner_known),
            json.dumps(dict(pins)), json.dumps(sorted(entry.engines)), replica_id, len(ADDED), *sums, *maxima,
            SERVICE_FLOOR, repr(float(entry.service))]


__all__ = ["ADDED", "COUNTERS", "EPOCH", "MAXIMA", "MERGE", "OPEN", "SERVICE_FLOOR", "WRITE_BACK", "contribution",
           "credited", "merge_args", "open_args", "set_counter", "stored", "write_back_args"]
