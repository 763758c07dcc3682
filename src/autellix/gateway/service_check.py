"""The engines' word on a program taken over: the ``ServiceWitness`` of a shared store.

A replica that takes a program over from the shared store (``autellix.control.redis_store``)
asks every engine of its pool that runs Autellix's scheduler for its tally of the program
(``autellix.protocol.ProgramService``), all at once, and sums them: each call ran on one
engine and the gateway charged it the model time in that engine's record of it, so the
engines' tallies add up (a maximum would count only one engine's calls). A tally that
began before the program was opened (less ``clock_skew``) belongs to an earlier program
under the same id and counts for nothing. An engine that does not answer in time, or
answers an error, is counted as failed; what the others said still counts (any part of
the sum is still at most the program's service).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import aiohttp
from prometheus_client import CollectorRegistry, Counter

from autellix.backends import EngineBackend
from autellix.control.store import CHECK_OUTCOMES, EngineService
from autellix.protocol import ProgramService

if TYPE_CHECKING:
    from autellix.gateway.engines import EnginePool

#: Wall clocks of gateways and engines may differ by this much (NTP keeps them far closer).
CLOCK_SKEW_S = 1.0


class EngineServiceCheck:
    """Asks the pool's engines (healthy, running Autellix's scheduler) for their tally of a program."""

    def __init__(self, http: aiohttp.ClientSession, pool: EnginePool, backend: EngineBackend, *,
                 clock_skew: float = CLOCK_SKEW_S) -> None:
        self.http, self.pool, self.backend, self.clock_skew = http, pool, backend, clock_skew

    async def program_service(self, program_id: str, *, since: float, timeout: float) -> EngineService:
        path = self.backend.program_path(program_id)
        urls = [e.url for e in self.pool.engines.values() if e.feedback and e.healthy] if path else []
        if not urls:
            return EngineService(0.0, asked=0)
        assert path is not None
        said = await asyncio.gather(*(self._ask(url + path, since, timeout) for url in urls))
        return EngineService(sum(s for s in said if s is not None), asked=len(urls),
                             failed=sum(1 for s in said if s is None))

    async def _ask(self, url: str, since: float, timeout: float) -> float | None:
        """The engine's tally (0 if it has none, or one older than the program); None: no answer."""
        try:
            async with self.http.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                if r.status == 404:
                    return 0.0
                data = await r.json() if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        tally = ProgramService.from_dict(data) if isinstance(data, dict) else None
        if tally is None:
            return None
        return tally.service_s if tally.since >= since - self.clock_skew else 0.0


_OBSERVERS: weakref.WeakKeyDictionary[CollectorRegistry, Callable[[str, float], None]] = weakref.WeakKeyDictionary()


def takeover_metrics(registry: CollectorRegistry) -> Callable[[str, float], None]:
    """``autellix_takeover_checks_total{outcome}`` and ``autellix_takeover_repaired_seconds_total``
    on ``registry`` (once per registry); returns the store's ``observe``."""
    if registry in _OBSERVERS:
        return _OBSERVERS[registry]
    checks = Counter("autellix_takeover_checks", "Programs taken over from the shared store and checked against "
                     "their engines, by outcome (repaired, confirmed, failed: an engine did not answer in time, "
                     "skipped: no engine keeps tallies)", ["outcome"], registry=registry)
    for outcome in CHECK_OUTCOMES:
        checks.labels(outcome)
    repaired = Counter("autellix_takeover_repaired_seconds", "Service added to programs taken over, from their "
                       "engines' tallies (what the store lost with a replica's last write behind)", registry=registry)

    def observe(outcome: str, added: float) -> None:
        checks.labels(outcome).inc()
        if added > 0:
            repaired.inc(added)

    _OBSERVERS[registry] = observe
    return observe


__all__ = ["CLOCK_SKEW_S", "EngineServiceCheck", "takeover_metrics"]
