"""Engine drains across replicas: a drain sent to any gateway replica applies on all (the shared store), or here.

Without a shared store a drain is one gateway's state (``LocalDrains``). With
``autellix gateway --store``, one replica's drain would leave the others sending
the engine calls (the operator drains through one replica: its admin Service
picks any), so ``POST /admin/engines/drain`` (and ``undrain``) writes the mark to
the store first (``SharedDrains``), then applies it locally; every replica reads
the marks with each engine poll (every ``poll_interval``, 1 s) and applies them to
its pool. So a drain reaches every replica within a poll, and a restarted replica
starts with the drains in force.

In Redis: the hash ``{prefix}drained`` (engine URL -> when it was drained, Unix
seconds), expiring ``MARK_TTL_S`` after its last change. A mark goes with an
undrain, or when the engine leaves a replica's pool (it left discovery: its pod
is gone; a new pod that later gets its address starts undrained, as with one
gateway).

When the store is out of reach a drain still applies here at once, and its mark is
written when the store answers again (the other replicas apply it then); meanwhile
each replica keeps the drains it has. A store that restarted empty (its epoch,
``autellix.control.store.connection``, changed) gets back the drains in force on
every replica, each writing its own, instead of undraining them all.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from autellix.control.background import Repeating

if TYPE_CHECKING:  # redis: only with a shared store
    from autellix.control.store.connection import StoreConnection

log = logging.getLogger(__name__)

#: A forgotten mark (its engine gone while no replica ran) leaves after this long.
MARK_TTL_S = 86_400


class Drainable(Protocol):
    @property
    def draining(self) -> bool: ...


class DrainablePool(Protocol):
    """The engines a gateway routes to, as drains see them (the gateway's engine pool)."""

    @property
    def engines(self) -> Mapping[str, Drainable]: ...

    def set_draining(self, url: str, draining: bool) -> object: ...


class DrainSharing(Protocol):
    """Where engine drains go before they apply here: nowhere (one gateway) or every replica (a shared store)."""

    async def set(self, url: str, draining: bool) -> None:
        """Share a drain (or an undrain) of ``url``, before it is applied here."""
        ...

    def applied_to(self, pool: DrainablePool) -> Repeating | None:
        """What applies the other replicas' drains to ``pool`` while the gateway runs (None: nothing to)."""
        ...


class LocalDrains:
    """One gateway: a drain is this gateway's alone."""

    async def set(self, url: str, draining: bool) -> None:
        return None

    def applied_to(self, pool: DrainablePool) -> Repeating | None:
        return None


class SharedDrains:
    """Drains in the shared store, applied to this replica's pool every ``poll_interval``."""

    def __init__(self, connection: StoreConnection, *, poll_interval: float = 1.0) -> None:
        self.connection = connection
        self.redis, self.key = connection.redis, connection.keys.drained
        self.poll_interval = poll_interval
        self._known: set[str] = set()
        self._local_change = 0.0
        #: Drains applied here that the store has not taken yet: URL -> draining.
        self._unwritten: dict[str, bool] = {}
        #: The store's epoch at the last sync; None before the first.
        self._epoch: str | None = None

    async def set(self, url: str, draining: bool) -> None:
        """Share a drain (before it is applied here): every replica applies it on its next poll. With the
        store out of reach, the mark is written when it answers again."""
        from autellix.control.store.connection import STORE_ERRORS  # redis: this module serves LocalDrains too

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

    def applied_to(self, pool: DrainablePool) -> Repeating:
        """The poll that applies the shared marks to ``pool``: at the gateway's start, then every poll."""
        return Repeating("shared-drains", self.poll_interval, functools.partial(self._follow, pool), at_once=True)

    async def _follow(self, pool: DrainablePool) -> None:
        try:
            await self.sync(pool)
        except Exception as exc:  # the store away: keep the drains as they are, retry next poll
            log.warning("reading the shared drains failed: %r", exc)

    async def sync(self, pool: DrainablePool) -> None:
        """Apply the shared marks to ``pool``; drop the marks of engines that left it."""
        began = time.monotonic()
        epoch = await self.connection.epoch()
        if self._epoch is not None and epoch != self._epoch:  # the store restarted empty: give it our drains
            for url, engine in pool.engines.items():
                if engine.draining:
                    self._unwritten.setdefault(url, True)
            log.info("the store restarted empty: writing back this replica's %d drains", len(self._unwritten))
        await self._write_marks()
        self._epoch = epoch
        marks = await self.redis.hgetall(self.key)
        present = set(pool.engines)
        gone = (self._known - present) & marks.keys()
        self._known = present
        if gone:
            await self.redis.hdel(self.key, *gone)
        if self._local_change >= began:  # a drain sent here meanwhile: this read may predate it
            return
        for url in present:
            pool.set_draining(url, url in marks)


__all__ = ["MARK_TTL_S", "DrainSharing", "Drainable", "DrainablePool", "LocalDrains", "SharedDrains"]
