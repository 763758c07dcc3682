"""The shared store's connection: one Redis client and its pool, the keys it holds, its epoch, what "out of reach" is.

Programs, stored responses and engine drains (``autellix.control.store.shared``)
go over this one client. In Redis, under ``prefix``:

* ``program:{id}`` and ``ended:{id}``: a live program's hash and an ended id's
  marker (``autellix.control.store.redis_programs``);
* ``response:{id}``: where a stored response lives (``autellix.control.store.responses``);
* ``drained``: the engines drained on every replica (``autellix.control.store.drains``);
* ``tenants``: each tenant's model time served through each replica (``TENANT|REPLICA``), from
  which every replica reckons each tenant's share (``autellix.core.TenantShares``);
* ``epoch``: a random id set by the first replica that finds none. A store that
  restarted empty has none (or a new one): that is how a replica tells a store
  that lost everything from one that was only out of reach;
* ``recovering``: set for a while by a replica that noticed a new epoch
  (``autellix.control.store.outage``).
"""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from autellix.control.store.scripts import EPOCH

#: What counts as the store being out of reach (not a bug of ours): no connection, no answer in
#: time, a replica that cannot take writes (a failover under way).
STORE_ERRORS: tuple[type[BaseException], ...] = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                                                 redis.exceptions.ReadOnlyError, OSError)


class StoreKeys:
    """The store's keys under one prefix (the module's docstring)."""

    def __init__(self, prefix: str = "autellix:") -> None:
        self.prefix = prefix
        #: The keys there is one of.
        self.drained, self.epoch, self.recovering = (f"{prefix}{name}" for name in ("drained", "epoch", "recovering"))
        #: Each tenant's model time by replica: field ``TENANT|REPLICA`` (``-`` for no tenant), seconds.
        self.tenants = f"{prefix}tenants"

    def program(self, program_id: str) -> str:
        return f"{self.prefix}program:{program_id}"

    def ended(self, program_id: str) -> str:
        return f"{self.prefix}ended:{program_id}"

    def response(self, response_id: str) -> str:
        return f"{self.prefix}response:{response_id}"


def store_client(url: str) -> aioredis.Redis:
    """A client that gives up fast: a store out of reach must not hold calls up. Connect within 0.5 s,
    answer within 1 s, and one immediate retry on a connection error only (a pooled connection the store
    closed when it restarted), never on a timeout (that would double the wait)."""
    return aioredis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=0.5, socket_timeout=1.0,
                                   retry=Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)))


class StoreConnection:
    """One client (and its connection pool) to the store at ``url``, its keys under ``prefix``."""

    def __init__(self, url: str, *, prefix: str = "autellix:") -> None:
        self.redis = store_client(url)
        self.keys = StoreKeys(prefix)

    async def epoch(self) -> str:
        """The store's epoch, set to a new random id if it has none (it started empty). Raises what the
        store raised (``STORE_ERRORS`` when it is out of reach)."""
        return str(await self.redis.eval(EPOCH, 1, self.keys.epoch, uuid.uuid4().hex))

    def queue_end(self, pipe: Pipeline, program_id: str, *, remember: bool, ended_ttl: float) -> None:
        """Queue on ``pipe`` a program's end: its hash goes; ``remember``: its id is marked ended for
        ``ended_ttl`` seconds (late calls get 404 on every replica)."""
        pipe.delete(self.keys.program(program_id))
        if remember:
            pipe.set(self.keys.ended(program_id), "1", px=int(ended_ttl * 1000))

    async def close(self) -> None:
        await self.redis.aclose()


__all__ = ["STORE_ERRORS", "StoreConnection", "StoreKeys", "store_client"]
