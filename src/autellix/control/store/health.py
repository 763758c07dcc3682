"""The shared store's health: whether it answers, what could not reach it, its outages, and that as metrics.

A replica's ``/metrics`` (and the picker's) read it at each scrape:

* ``autellix_store_up``: 1 while the last look at the store succeeded;
* ``autellix_store_errors_total{op}``: operations that could not reach it, by operation;
* ``autellix_store_outages_total``: times it went out of reach;
* ``autellix_store_provisional_programs_total``: programs served here without being
  held, during an outage (``autellix.control.store.outage``);
* ``autellix_store_written_back_programs_total``: programs written back when it answered again.

The store is not part of a replica's readiness: a store out of reach is out of
reach for every replica at once, and if that made them unready, Envoy would
have no replica left to send a call to. A replica serves on from its local
copies instead, and says so here.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

#: Operations counted in ``StoreHealth.errors``.
OPERATIONS = ("open", "load", "ended", "end", "flush", "check", "write_back")


@dataclass
class StoreHealth:
    """What a shared store says of itself: whether it answered last, its failed operations, its outages,
    and what the replica did about them."""

    up: bool = True
    #: Operations that failed because the store was out of reach, by operation (``OPERATIONS``).
    errors: collections.Counter[str] = field(default_factory=lambda: collections.Counter(dict.fromkeys(OPERATIONS, 0)))
    outages: int = 0
    #: Programs this replica served without holding them, while the store was out of reach.
    provisional: int = 0
    #: Programs written back to the store after an outage.
    written_back: int = 0

    def unreachable(self, operation: str, exc: BaseException) -> None:
        """``operation`` could not reach the store: counted; the first failure of an outage begins it."""
        self.errors[operation] += 1
        if self.up:
            self.up = False
            self.outages += 1
            log.warning("program store out of reach (%s: %r): serving from local copies until it answers",
                        operation, exc)

    def answered(self) -> None:
        """A look at the store succeeded (after what the replica owed it was written back): the outage is over."""
        if not self.up:
            log.info("program store answers again; this replica's programs are written back")
            self.up = True


class StoreHealthCollector(Collector):
    """The store's health as Prometheus metrics, read at each scrape."""

    def __init__(self, health: StoreHealth) -> None:
        self.health = health

    def collect(self) -> Iterator[Metric]:
        health = self.health
        yield GaugeMetricFamily("autellix_store_up", "1 while the shared program store answers, else 0",
                                value=int(health.up))
        errors = CounterMetricFamily("autellix_store_errors", "Store operations that could not reach the store",
                                     labels=["op"])
        for operation, count in sorted(health.errors.items()):
            errors.add_metric([operation], count)
        yield errors
        yield CounterMetricFamily("autellix_store_outages", "Times the store went out of reach",
                                  value=health.outages)
        yield CounterMetricFamily("autellix_store_provisional_programs",
                                  "Programs served here without being held, while the store was out of reach",
                                  value=health.provisional)
        yield CounterMetricFamily("autellix_store_written_back_programs",
                                  "Programs written back to the store when it answered again",
                                  value=health.written_back)


__all__ = ["OPERATIONS", "StoreHealth", "StoreHealthCollector"]
