"""Engine drains kept in the shared store, so a drain sent to any gateway replica applies on all.

Without it a drain is one gateway's state: the operator drains an engine through
one replica (its admin Service picks any) while the others keep sending it calls.
With ``autellix gateway --store``, ``POST /admin/engines/drain`` (and ``undrain``)
writes the mark to Redis first (the call fails if it cannot), then applies it
locally; every replica reads the marks with each engine poll (every
``poll_interval``, 1 s) and applies them to its pool. So a drain reaches every
replica within a poll, and a restarted replica starts with the drains in force.

In Redis: the hash ``{prefix}drained`` (engine URL -> when it was drained, Unix
seconds), expiring ``MARK_TTL_S`` after its last change. A mark goes with an
undrain, or when the engine leaves a replica's pool (it left discovery: its pod
is gone; a new pod that later gets its address starts undrained, as with one
gateway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

import redis.asyncio as aioredis

log = logging.getLogger(__name__)

#: A forgotten mark (its engine gone while no replica ran) leaves after this long.
MARK_TTL_S = 86_400


class DrainablePool(Protocol):
    engines: dict[str, object]

    def set_draining(self, url: str, draining: bool) -> object: ...


class SharedDrains:
    def __init__(self, url: str, *, prefix: str = "autellix:", poll_interval: float = 1.0) -> None:
        self.redis = aioredis.Redis.from_url(url, decode_responses=True)
        self.key = f"{prefix}drained"
        self.poll_interval = poll_interval
        self.pool: DrainablePool | None = None
        self._known: set[str] = set()
        self._local_change = 0.0
        self._task: asyncio.Task[None] | None = None

    async def set(self, url: str, draining: bool) -> None:
        """Share a drain (before it is applied here): every replica applies it on its next poll."""
        self._local_change = time.monotonic()
        async with self.redis.pipeline(transaction=True) as pipe:
            if draining:
                pipe.hset(self.key, url, str(time.time()))
            else:
                pipe.hdel(self.key, url)
            pipe.expire(self.key, MARK_TTL_S)
            await pipe.execute()
        log.info("engine %s %s on every replica", url, "drained" if draining else "undrained")

    def start(self, pool: DrainablePool) -> None:
        self.pool = pool
        self._task = asyncio.create_task(self._loop(), name="shared-drains")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.redis.aclose()

    async def _loop(self) -> None:
        while True:
            try:
                await self.sync()
            except Exception as exc:  # the store away: keep the drains as they are, retry next poll
                log.warning("reading the shared drains failed: %r", exc)
            await asyncio.sleep(self.poll_interval)

    async def sync(self) -> None:
        """Apply the shared marks to this replica's pool; drop the marks of engines that left it."""
        assert self.pool is not None
        began = time.monotonic()
        marks = await self.redis.hgetall(self.key)
        present = set(self.pool.engines)
        gone = (self._known - present) & marks.keys()
        self._known = present
        if gone:
            await self.redis.hdel(self.key, *gone)
        if self._local_change >= began:  # a drain sent here meanwhile: this read may predate it
            return
        for url in present:
            self.pool.set_draining(url, url in marks)
