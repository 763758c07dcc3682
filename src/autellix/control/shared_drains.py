"""Engine drains kept in the shared store, so a drain sent to any gateway replica applies on all.

Without it a drain is one gateway's state: the operator drains an engine through
one replica (its admin Service picks any) while the others keep sending it calls.
With ``autellix gateway --store``, ``POST /admin/engines/drain`` (and ``undrain``)
writes the mark to Redis first, then applies it locally; every replica reads the
marks with each engine poll (every ``poll_interval``, 1 s) and applies them to its
pool. So a drain reaches every replica within a poll, and a restarted replica starts
with the drains in force.

In Redis: the hash ``{prefix}drained`` (engine URL -> when it was drained, Unix
seconds), expiring ``MARK_TTL_S`` after its last change. A mark goes with an
undrain, or when the engine leaves a replica's pool (it left discovery: its pod
is gone; a new pod that later gets its address starts undrained, as with one
gateway).

When the store is out of reach a drain still applies here at once, and its mark is
written when the store answers again (the other replicas apply it then); meanwhile
each replica keeps the drains it has. A store that restarted empty (its epoch,
``autellix.control.redis_store.store_epoch``, changed) gets back the drains in force
on every replica, each writing its own, instead of undraining them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Protocol

from autellix.control.redis_store import STORE_ERRORS, store_client, store_epoch

log = logging.getLogger(__name__)

#: A forgotten mark (its engine gone while no replica ran) leaves after this long.
MARK_TTL_S = 86_400


class Drainable(Protocol):
    @property
    def draining(self) -> bool: ...


class DrainablePool(Protocol):
    @property
    def engines(self) -> Mapping[str, Drainable]: ...

    def set_draining(self, url: str, draining: bool) -> object: ...


class SharedDrains:
    def __init__(self, url: str, *, prefix: str = "autellix:", poll_interval: float = 1.0) -> None:
        self.redis = store_client(url)
        self.key = f"{prefix}drained"
        self.epoch_key = f"{prefix}epoch"
        self.poll_interval = poll_interval
        self.pool: DrainablePool | None = None
        self._known: set[str] = set()
        self._local_change = 0.0
        #: Drains applied here that the store has not taken yet: URL -> draining.
        self._unwritten: dict[str, bool] = {}
        #: The store's epoch at the last sync; None before the first.
        self._epoch: str | None = None
        self._task: asyncio.Task[None] | None = None

    async def set(self, url: str, draining: bool) -> None:
        """Share a drain (before it is applied here): every replica applies it on its next poll. With the
        store out of reach, the mark is written when it answers again."""
        self._local_change = time.monotonic()
        self._unwritten[url] = draining
        try:
            await self._write_marks()
        except STORE_ERRORS as exc:
            log.warning("engine %s %s here; the store is out of reach (%r): the other replicas follow when it "
                        "answers", url, "drained" if draining else "undrained", exc)
            return
        log.info("engine %s %s on every replica", url, "drained" if draining else "undrained")

    async def _write_marks(self) -> None:
        marks, self._unwritten = self._unwritten, {}
        if not marks:
            return
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                for url, draining in marks.items():
                    if draining:
                        pipe.hset(self.key, url, str(time.time()))
                    else:
                        pipe.hdel(self.key, url)
                pipe.expire(self.key, MARK_TTL_S)
                await pipe.execute()
        except BaseException:
            self._unwritten = {**marks, **self._unwritten}  # a newer change for a URL wins
            raise

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
        epoch = await store_epoch(self.redis, self.epoch_key)
        if self._epoch is not None and epoch != self._epoch:  # the store restarted empty: give it our drains
            for url, engine in self.pool.engines.items():
                if engine.draining:
                    self._unwritten.setdefault(url, True)
            log.info("the store restarted empty: writing back this replica's %d drains", len(self._unwritten))
        await self._write_marks()
        self._epoch = epoch
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
