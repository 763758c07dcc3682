"""The gateway's store shared by replicas through Redis: programs, stored responses and drains over one client.

``SharedStore`` is the ``GatewayStore`` (``autellix.control.store.base``) of
``autellix gateway --store redis://...`` (and ``autellix epp --store``): one Redis
client and its connection pool (``autellix.control.store.connection``) serve

* the programs (``autellix.control.store.redis_programs``): any replica can take one over;
* the stored responses' records (``autellix.control.store.responses``): a chain
  (``previous_response_id``) continues on any replica;
* the engine drains (``autellix.control.store.drains``): a drain sent to any replica applies on all.

Its health is the programs': whether the store answered the last look
(``ready``), what could not reach it, its outages and what the replica did about
them (``autellix.control.store.health``), and the takeover checks' outcomes
(``autellix.control.store.takeover``), all in ``collectors``. While it runs (``start``)
it looks at the store every second, so that a replica with no call in flight also
notices an outage, and writes its programs back soon after the store answers again
(``autellix.control.store.outage``). ``stop`` writes what is written behind, then closes
the connection.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence

from prometheus_client.registry import Collector

from autellix.control.background import Repeating
from autellix.control.store.connection import STORE_ERRORS, StoreConnection
from autellix.control.store.drains import SharedDrains
from autellix.control.store.health import StoreHealthCollector
from autellix.control.store.redis_programs import DAY_S, RedisProgramStore
from autellix.control.store.responses import RedisResponseRecords
from autellix.control.store.takeover import ServiceWitness
from autellix.core import Policy

log = logging.getLogger(__name__)

#: Seconds between two looks at the store, and how long one may take.
LOOK_INTERVAL_S = 1.0


class SharedStore:
    """Programs, stored responses and engine drains in the store at ``url``, under ``prefix``."""

    def __init__(self, url: str, policy: Policy, *, idle_ttl: float = math.inf, response_ttl: float = DAY_S,
                 poll_interval: float = 1.0, prefix: str = "autellix:") -> None:
        self.connection = StoreConnection(url, prefix=prefix)
        self.programs = RedisProgramStore(self.connection, policy, idle_ttl=idle_ttl)
        self.responses = RedisResponseRecords(self.connection, ttl=response_ttl)
        self.drains = SharedDrains(self.connection, poll_interval=poll_interval)
        self.health = self.programs.health
        self._collectors = (StoreHealthCollector(self.health), *self.programs.takeovers.counts.collectors())
        self._watch = Repeating("store-watch", LOOK_INTERVAL_S, self.ping, at_once=True)

    @property
    def ready(self) -> bool:
        return self.health.up

    async def ping(self) -> bool:
        """Look at the store (within ``LOOK_INTERVAL_S``): when it answers after an outage, or restarted empty,
        this replica's programs are written back first. Whether it answered; its health counts a failure."""
        try:
            await asyncio.wait_for(self.programs.ping(), LOOK_INTERVAL_S)
        except (*STORE_ERRORS, TimeoutError):  # out of reach: counted; the replica serves on from its copies
            return False
        except Exception as exc:  # not the store being away: say so, and look again next time
            log.warning("looking at the program store failed: %r", exc)
            return False
        return True

    def collectors(self) -> Sequence[Collector]:
        return self._collectors

    def check_takeovers(self, witness: ServiceWitness) -> None:
        self.programs.takeovers.check_with(witness)

    async def start(self) -> None:
        await self._watch.start()

    async def stop(self) -> None:
        await self._watch.stop()
        try:
            await self.programs.close()  # its last write behind, if the store answers
        finally:
            await self.connection.close()


__all__ = ["LOOK_INTERVAL_S", "SharedStore"]
