"""Where each stored Responses API response lives: its engine, its program and its tenant.

An engine keeps the responses it generated (vLLM's response store, in memory,
per engine), so a call that continues one (``previous_response_id``) must go
to the engine that stored it; and the responses of one chain belong to one
program. The gateway records each stored response here when its engine
answers, before the answer reaches the client, so the next call of the chain
finds it on any replica.

* ``MemoryResponseRecords``: one gateway (and the simulator); bounded in count
  and by age.
* ``RedisResponseRecords``: replicas behind Envoy share the records through
  the shared store's connection (``autellix.control.store.connection``;
  ``{prefix}response:{id}``, a JSON value expiring after ``ttl``): a
  chain survives the loss of the replica that served its last call. It keeps a
  local copy of what this replica wrote or read, so a store outage costs the
  chains this replica served nothing; a write that fails is retried with the
  next write and counted (``failures``), never an error to the client.
"""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # redis: only with a shared store
    from autellix.control.store.connection import StoreConnection

log = logging.getLogger(__name__)

#: Records one gateway keeps in memory (about 200 bytes each).
MEMORY_RECORDS = 100_000


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response_id: str
    #: The engine (base URL) whose response store holds it.
    engine: str
    #: The program of its chain, and the tenant that owns it (None: auth off).
    program_id: str
    owner: str | None
    model: str
    #: When it was recorded (Unix seconds).
    created: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> StoredResponse | None:
        try:
            data = json.loads(raw)
            owner = data["owner"]
            return cls(response_id=str(data["response_id"]), engine=str(data["engine"]),
                       program_id=str(data["program_id"]), owner=None if owner is None else str(owner),
                       model=str(data["model"]), created=float(data["created"]))
        except (KeyError, TypeError, ValueError):
            return None


class ResponseRecords(Protocol):
    """Stored responses by id: recorded when their engine answers, read when a call continues one."""

    async def put(self, record: StoredResponse) -> None: ...

    async def get(self, response_id: str, now: float) -> StoredResponse | None:
        """The record, if it is younger than the store's ``ttl`` (Unix seconds ``now``)."""
        ...

    async def forget(self, response_id: str) -> bool:
        """Drop the record; whether there was one."""
        ...


class MemoryResponseRecords:
    """Records in this process: the newest ``capacity``, each for ``ttl`` seconds."""

    def __init__(self, *, ttl: float = math.inf, capacity: int = MEMORY_RECORDS) -> None:
        self.ttl, self.capacity = ttl, capacity
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    async def put(self, record: StoredResponse) -> None:
        self._records[record.response_id] = record
        self._records.move_to_end(record.response_id)
        while len(self._records) > self.capacity:
            self._records.popitem(last=False)

    async def get(self, response_id: str, now: float) -> StoredResponse | None:
        record = self._records.get(response_id)
        if record is not None and now - record.created > self.ttl:
            del self._records[response_id]
            return None
        return record

    async def forget(self, response_id: str) -> bool:
        return self._records.pop(response_id, None) is not None


class RedisResponseRecords:
    """Records in Redis for every replica, with a local copy of what this replica wrote or read."""

    def __init__(self, connection: StoreConnection, *, ttl: float, capacity: int = MEMORY_RECORDS) -> None:
        self.redis, self.keys = connection.redis, connection.keys
        self.ttl = ttl
        self.local = MemoryResponseRecords(ttl=ttl, capacity=capacity)
        #: Records not yet in Redis (it was unreachable when they were made), written with the next put.
        self._pending: OrderedDict[str, StoredResponse] = OrderedDict()
        #: Reads and writes that failed (the store unreachable): what the local copy answered instead.
        self.failures = 0

    async def put(self, record: StoredResponse) -> None:
        await self.local.put(record)
        self._pending[record.response_id] = record
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for pending in self._pending.values():
                    pipe.set(self.keys.response(pending.response_id), pending.to_json(),
                             px=max(1, int(self.ttl * 1000)))
                await pipe.execute()
            self._pending.clear()
        except Exception as exc:  # any store failure: the local copy serves this replica meanwhile
            self.failures += 1
            while len(self._pending) > self.local.capacity:
                self._pending.popitem(last=False)
            log.warning("response store unreachable, %d records kept to write later: %r", len(self._pending), exc)

    async def get(self, response_id: str, now: float) -> StoredResponse | None:
        record = await self.local.get(response_id, now)
        if record is not None:
            return record
        try:
            raw = await self.redis.get(self.keys.response(response_id))
        except Exception as exc:
            self.failures += 1
            log.warning("response store unreachable reading %s: %r", response_id, exc)
            return None
        record = StoredResponse.from_json(raw) if raw is not None else None
        if record is None or now - record.created > self.ttl:
            return None
        await self.local.put(record)
        return record

    async def forget(self, response_id: str) -> bool:
        known = await self.local.forget(response_id)
        self._pending.pop(response_id, None)
        try:
            known = bool(await self.redis.delete(self.keys.response(response_id))) or known
        except Exception as exc:
            self.failures += 1
            log.warning("response store unreachable forgetting %s: %r", response_id, exc)
        return known


__all__ = ["MEMORY_RECORDS", "MemoryResponseRecords", "RedisResponseRecords", "ResponseRecords", "StoredResponse"]
