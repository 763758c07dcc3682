"""The engines' word on a program taken over: the ``ServiceWitness`` of a shared store.

A replica that takes a program over from the shared store (``autellix.control.store.takeover``)
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
from typing import TYPE_CHECKING

import aiohttp

from autellix.backends import EngineBackend
from autellix.control.store.takeover import EngineService
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


__all__ = ["CLOCK_SKEW_S", "EngineServiceCheck"]
