"""The gateway's periodic upkeep: idle programs expire, changed key files reload."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from autellix.control import ProgramStore, Sessions
from autellix.control.background import Repeating
from autellix.control.keys import KeyRing
from autellix.control.limits import TenantLimiter

log = logging.getLogger("autellix.gateway")


class Periodic(Repeating, ABC):
    """A task that runs ``tick`` every ``interval`` seconds while the gateway runs (a failed tick is logged)."""

    name = "periodic"

    def __init__(self, interval: float) -> None:
        super().__init__(self.name, interval, self.tick)

    @abstractmethod
    async def tick(self) -> None: ...


class SessionExpiry(Periodic):
    """Programs idle past the store's TTL leave the table; their tenants' session counts and standing follow."""

    name = "session-expiry"

    def __init__(self, store: ProgramStore, sessions: Sessions, limiter: TenantLimiter) -> None:
        super().__init__(min(30.0, store.idle_ttl / 4))
        self.store, self.sessions, self.limiter = store, sessions, limiter

    async def tick(self) -> None:
        now = time.monotonic()
        for entry in await self.store.expire(now):
            self.limiter.session_closed(entry.owner, entry.program_id, now)
            self.sessions.program_left(entry, now)
            log.info("program %s expired after %.0fs idle", entry.program_id, self.store.idle_ttl)


class KeyReload(Periodic):
    """Key files changed (a Secret rotated): reload; a broken change keeps the old keys."""

    name = "keys-reload"

    def __init__(self, rings: dict[str, KeyRing], interval: float,
                 on_change: Callable[[], None] | None = None) -> None:
        super().__init__(interval)
        self.rings = rings
        #: Called after a ring's keys or weights changed (the tenants' weights are applied there).
        self.on_change = on_change

    async def tick(self) -> None:
        for name, ring in self.rings.items():
            if ring.refresh():
                log.info("%s keys reloaded: %d keys", name, len(ring))
                if self.on_change is not None:
                    self.on_change()
            elif ring.last_error:
                log.error("%s keys not reloaded, the previous ones stay: %s", name, ring.last_error)


__all__ = ["KeyReload", "Periodic", "SessionExpiry"]
