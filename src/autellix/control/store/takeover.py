"""The takeover's check: a program taken over from another replica gets back the service its engines counted.

Engines running Autellix's scheduler keep a tally of each program's calls that
finished on them (``autellix.protocol.ProgramService``): the same model time the
gateway charged for each call, and each call ran on one engine, so the tallies of
all engines add up to the program's service (a lower bound: an engine that
restarted or never answered adds nothing). A shared store that takes a program
over (``autellix.control.store.redis_programs``) asks a ``ServiceWitness`` (the gateway's
engine pool) for that sum, at most ``timeout`` seconds, and raises the program's
service to it when the store's is lower; never lowers it. What the store lost
with a dead replica's last write behind, the engines still count. On an error or a
timeout the store's value stays and the check counts as ``failed``. Programs a
replica holds are never checked; calls of a program under check wait for it.

Every check's outcome is counted (``TakeoverCounts``): on ``/metrics``,
``autellix_takeover_checks_total{outcome}`` and ``autellix_takeover_repaired_seconds_total``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Counter
from prometheus_client.registry import Collector

from autellix.control.background import cancel

log = logging.getLogger(__name__)

#: How a takeover's check ended (a metric's label): the store's service was raised to the
#: engines' sum, or it was at least that already; an engine did not answer in time (what the
#: others said still counts); no engine keeps tallies to ask.
CHECK_OUTCOMES = ("repaired", "confirmed", "failed", "skipped")
#: How long a takeover waits for the engines' tallies, at most (plus ``CHECK_GRACE``).
CHECK_TIMEOUT = 0.15
CHECK_GRACE = 0.05


@dataclass(frozen=True, slots=True)
class EngineService:
    """What the engines asked said of one program: the sum of their tallies (each counted
    only if it began after the program was opened), how many were asked, how many failed."""

    service: float
    asked: int
    failed: int = 0


class ServiceWitness(Protocol):
    """Who can say how much service the engines gave a program (the gateway's engine pool)."""

    async def program_service(self, program_id: str, *, since: float, timeout: float) -> EngineService:
        """The sum of the engines' tallies of ``program_id`` begun at ``since`` (Unix seconds: when
        the program was opened) or later, answered within about ``timeout`` seconds."""
        ...


#: What a check does with the engines' answer: the seconds of service it added to the program (0: none).
Repair = Callable[[EngineService], float]


class TakeoverCounts:
    """The checks' outcomes as Prometheus counters, for the registry of the gateway that owns the store."""

    def __init__(self) -> None:
        # registry=None: the store's own, registered by the gateway that serves it (``collectors``)
        self.checks = Counter("autellix_takeover_checks", "Programs taken over from the shared store and checked "
                              "against their engines, by outcome (repaired, confirmed, failed: an engine did not "
                              "answer in time, skipped: no engine keeps tallies)", ["outcome"], registry=None)
        for outcome in CHECK_OUTCOMES:
            self.checks.labels(outcome)
        self.repaired = Counter("autellix_takeover_repaired_seconds", "Service added to programs taken over, from "
                                "their engines' tallies (what the store lost with a replica's last write behind)",
                                registry=None)

    def observe(self, outcome: str, added: float) -> None:
        self.checks.labels(outcome).inc()
        if added > 0:
            self.repaired.inc(added)

    def collectors(self) -> Sequence[Collector]:
        return (self.checks, self.repaired)


class TakeoverChecks:
    """A store's checks of the programs it takes over: off until given a witness (``check_with``); at most
    one running per program, which the program's calls wait for."""

    def __init__(self, counts: TakeoverCounts | None = None) -> None:
        self.counts = counts if counts is not None else TakeoverCounts()
        self.witness: ServiceWitness | None = None
        self.timeout = CHECK_TIMEOUT
        self._running: dict[str, asyncio.Task[None]] = {}

    def check_with(self, witness: ServiceWitness, *, timeout: float = CHECK_TIMEOUT) -> None:
        """Check every program taken over from now on against ``witness`` (the engines), waiting at most
        ``timeout`` seconds for it."""
        self.witness, self.timeout = witness, timeout

    @property
    def enabled(self) -> bool:
        return self.witness is not None

    def running(self, program_id: str) -> asyncio.Task[None] | None:
        """The check of ``program_id`` under way, if one is."""
        return self._running.get(program_id)

    def start(self, program_id: str, since: float, repair: Repair) -> asyncio.Task[None]:
        """Check ``program_id`` (opened at ``since``, Unix seconds) now; ``repair`` applies what the engines said."""
        task = self._running[program_id] = asyncio.get_running_loop().create_task(
            self._check(program_id, since, repair), name="autellix-takeover-check")
        return task

    async def cancel_all(self) -> None:
        for task in list(self._running.values()):
            await cancel(task)

    async def _check(self, program_id: str, since: float, repair: Repair) -> None:
        """Raise the program's service to the engines' sum if the store's is lower; on an error or a
        timeout keep the store's."""
        said: EngineService | None = None
        try:
            assert self.witness is not None
            said = await asyncio.wait_for(self.witness.program_service(program_id, since=since, timeout=self.timeout),
                                          self.timeout + CHECK_GRACE)
        except Exception as exc:  # the engines, or whoever asks them, failed: the store's value stays
            log.warning("program %r: no answer from its engines (%r); keeping the store's service", program_id, exc)
        finally:
            if self._running.get(program_id) is asyncio.current_task():
                del self._running[program_id]
        added = repair(said) if said is not None else 0.0
        outcome = ("failed" if said is None or said.failed else "repaired" if added
                   else "skipped" if said.asked == 0 else "confirmed")
        self.counts.observe(outcome, added)


__all__ = ["CHECK_GRACE", "CHECK_OUTCOMES", "CHECK_TIMEOUT", "EngineService", "Repair", "ServiceWitness",
           "TakeoverChecks", "TakeoverCounts"]
