"""A gateway process's life: the store it runs on, when it is ready, how it stops, what it served.

``autellix gateway`` runs through :func:`run_gateway`:

* **Store**: ``--store redis://...`` runs the gateway on the shared
  :class:`~autellix.control.redis_store.RedisProgramStore` (replicas behind Envoy);
  without it the in-memory store, as before. With a store, engine drains live in
  it too (:class:`~autellix.control.shared_drains.SharedDrains`): a drain sent to any
  replica applies on all.
* **Ready** (``/ready`` 200) while at least one engine is healthy (the gateway's
  own rule) and the process is not stopping. The store is not part of it: a store
  out of reach is out of reach for every replica at once, and if that made them
  unready, Envoy would have no replica left to send a call to. A replica serves on
  from its local copies instead (``autellix.control.redis_store``, "When the store
  is out of reach"), and says so in ``/metrics``.
* **Store health** (with a store) in ``/metrics``: ``autellix_store_up`` (the last
  look at the store, every second, succeeded), ``autellix_store_errors_total{op}``
  (operations that could not reach it), ``autellix_store_outages_total``,
  ``autellix_store_provisional_programs_total`` (programs served here without being
  held, during an outage) and ``autellix_store_written_back_programs_total``.
* **SIGTERM** (or SIGINT): ``/ready`` turns 503 at once, so the health checks of
  Envoy (every 1 s, out after 2 failures) send new calls elsewhere; the process
  keeps listening and serving what still arrives meanwhile; once no call or
  stream is in flight, and (when something health-checked it in the last
  ``CHECKED_WITHIN_S``) ``UNREADY_HOLD_S`` has passed so that the checker saw
  the 503, it stops listening, writes the store's pending state (the gateway's
  cleanup flushes the write-behind) and exits. ``shutdown_grace`` bounds it all:
  calls still running then are cut. A second signal exits at once.
* **Per-replica counters** in ``/metrics``: ``autellix_replica_calls_total`` and
  ``autellix_replica_programs_total`` labelled with the replica's name (the pod
  name in a cluster): with Envoy hashing on the program key, the programs counted
  over all replicas add up to the programs run, each on one replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from autellix import protocol
from autellix.control.recent import RecentIds
from autellix.control.store import ProgramStore, redacted_url
from autellix.core import Policy
from autellix.gateway.errors import GatewayRunner
from autellix.protocol import (
    HEALTH_PATH,
    IMPLICIT_SESSION_HEADERS,
    METRICS_PATH,
    READY_PATH,
    SESSION_HEADER,
)

if TYPE_CHECKING:  # the store's module needs redis, which only a gateway with --store has
    from autellix.control.redis_store import RedisProgramStore, StoreHealth

log = logging.getLogger("autellix.gateway.lifecycle")

#: Seconds ``/ready`` stays 503 before the process stops listening, when a health checker is
#: watching: Envoy checks every 1 s and takes a replica out after 2 failures.
UNREADY_HOLD_S = 2.5
#: A ``/ready`` request within this many seconds means a health checker is watching.
CHECKED_WITHIN_S = 5.0
#: Seconds between two looks at the store, and how long one may take.
STORE_CHECK_INTERVAL_S = 1.0
#: Program keys remembered for the per-replica program counter: at most this many, each until it
#: has not been seen for ``Lifecycle.key_ttl`` seconds (the program idle TTL: by then its program
#: has expired, and a call with the key again starts a new one).
PROGRAM_KEYS_REMEMBERED = 100_000
#: Requests that are not calls: never counted in flight, never delay a stop.
PROBE_PATHS = frozenset({HEALTH_PATH, READY_PATH, METRICS_PATH})
CALL_PATHS = frozenset(protocol.CALL_PATHS)  # every call API (Chat, Completions, Responses, Messages)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def program_key(headers: Mapping[str, str]) -> str | None:
    """The key Envoy hashes a call on (``autellix.mesh.resources``): the session header, else the
    first agent session header present; None for a one-call program."""
    for name in (SESSION_HEADER, *IMPLICIT_SESSION_HEADERS):
        value = headers.get(name)
        if value:
            return value
    return None


@dataclass(frozen=True)
class StoreProbe:
    """The shared store as a gateway's life cycle watches it: a look at it (``ping``: when the store answers
    again, this replica's programs are written back first) and what it says of itself (``health``)."""

    ping: Callable[[], Awaitable[None]]
    health: StoreHealth

    async def __call__(self) -> None:
        await self.ping()


class StoreHealthCollector:
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


class Lifecycle:
    """Readiness beyond the engines, the drain on SIGTERM, the store's health, and the per-replica counters
    of one gateway."""

    def __init__(self, *, replica: str, shutdown_grace: float = 30.0, store_ping: StoreProbe | None = None,
                 key_ttl: float = 600.0) -> None:
        self.replica = replica
        self.shutdown_grace = shutdown_grace
        #: The shared store's probe (``open_store``), looked at every second; None without a store.
        self.store_ping = store_ping
        self.stopping = False
        self.inflight = 0
        self._last_checked = -float("inf")
        self._idle = asyncio.Event()
        self._idle.set()
        self._programs = RecentIds(PROGRAM_KEYS_REMEMBERED, key_ttl)
        self._calls: Counter | None = None
        self._program_count: Counter | None = None
        self._calls_here: Any = None  # prometheus_client's labelled children, set by install()
        self._programs_here: Any = None
        self._store_task: asyncio.Task[None] | None = None

    # ---- readiness -------------------------------------------------------------
    def not_ready(self) -> str | None:
        """Why ``/ready`` must answer 503 whatever the engines; None if nothing here stands in the way."""
        return "stopping" if self.stopping else None

    async def _watch_store(self) -> None:
        """Look at the store every second, so that a replica with no call in flight also writes its programs
        back soon after the store answers again (the store logs and counts what it finds)."""
        assert self.store_ping is not None
        while True:
            with contextlib.suppress(Exception):  # out of reach: the store counted it; serve on, look again
                await asyncio.wait_for(self.store_ping(), STORE_CHECK_INTERVAL_S)
            await asyncio.sleep(STORE_CHECK_INTERVAL_S)

    # ---- in the app --------------------------------------------------------------
    def install(self, app: web.Application, registry: CollectorRegistry) -> None:
        """The counting middleware (outermost: it sees every call until its last byte), the counters
        and the store's health in ``registry`` (the gateway's own), and the store watch on the app's life."""
        self._calls = Counter("autellix_replica_calls", "Calls (every call API) served by this replica",
                              ["replica"], registry=registry)
        self._program_count = Counter(
            "autellix_replica_programs",
            "Programs (distinct program keys, plus one per keyless call) whose calls this replica served",
            ["replica"], registry=registry)
        # the labelled children, looked up once (the hot path)
        self._calls_here = self._calls.labels(self.replica)
        self._programs_here = self._program_count.labels(self.replica)
        if self.store_ping is not None:
            registry.register(StoreHealthCollector(self.store_ping.health))
        app[LIFECYCLE_KEY] = self
        app.middlewares.insert(0, self._middleware)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)

    async def _start(self, _app: web.Application) -> None:
        if self.store_ping is not None:
            self._store_task = asyncio.create_task(self._watch_store(), name="store-watch")

    async def _stop(self, _app: web.Application) -> None:
        if self._store_task is not None:
            self._store_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._store_task

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PROBE_PATHS:
            if request.path == READY_PATH:
                self._last_checked = time.monotonic()
            return await handler(request)
        if request.method == "POST" and request.path in CALL_PATHS:
            self._count_call(program_key(request.headers))
        self.inflight += 1
        self._idle.clear()
        try:
            return await handler(request)  # a stream's handler returns after its last chunk
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

    def _count_call(self, key: str | None) -> None:
        self._calls_here.inc()
        # a keyless call is a program of its own; a key counts once while it is remembered
        if key is None or self._programs.add(key, time.monotonic()):
            self._programs_here.inc()

    # ---- stopping ------------------------------------------------------------------
    async def drain(self) -> None:
        """Not ready at once; back when calls in flight are done (and a watching checker saw the 503),
        or after the grace period."""
        self.stopping = True
        began = time.monotonic()
        watched = began - self._last_checked < CHECKED_WITHIN_S
        hold = min(UNREADY_HOLD_S, self.shutdown_grace) if watched else 0.0
        log.info("stopping: not ready; %d calls in flight, up to %.0fs to finish", self.inflight,
                 self.shutdown_grace)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled(began + hold), self.shutdown_grace)
        if self.inflight:
            log.warning("grace period over: %d calls in flight are cut", self.inflight)

    async def _settled(self, not_before: float) -> None:
        while True:
            await self._idle.wait()
            if (left := not_before - time.monotonic()) <= 0:
                if self.inflight == 0:
                    return
                continue
            await asyncio.sleep(min(left, 0.05))


#: Where the app keeps its :class:`Lifecycle` (``/ready`` asks it).
LIFECYCLE_KEY: web.AppKey[Lifecycle] = web.AppKey("lifecycle", Lifecycle)


def freeze_startup_objects() -> None:
    """Take what start-up made (modules, the app and its routes, the pool) out of the garbage collector's view.

    Why: the call path leaves garbage in reference cycles, so full collections come every few
    hundred calls, and each walks every tracked object; without this nearly all of those are
    start-up's, which never die, and the walks cost the gateway about a tenth of its throughput
    (``docs/results/2026-12-05-gateway-garbage-collection.md``). Garbage is collected first so
    that none of it is kept for good."""
    gc.collect()
    gc.freeze()


async def _serve(app: web.Application, lifecycle: Lifecycle, host: str, port: int,
                 print_fn: Callable[[str], None], server_kwargs: dict[str, int]) -> None:
    # handler_cancellation: a client that hangs up cancels its call, which closes
    # the upstream connection, and vLLM aborts the request instead of finishing it
    runner = GatewayRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0,
                           **server_kwargs)  # type: ignore[arg-type]
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        freeze_startup_objects()
        print_fn(f"======== Running on http://{host}:{port} ========")
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        stop.clear()
        drain = asyncio.create_task(lifecycle.drain())
        again = asyncio.create_task(stop.wait())  # a second signal: exit now
        await asyncio.wait({drain, again}, return_when=asyncio.FIRST_COMPLETED)
        for task in (drain, again):
            task.cancel()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    finally:
        await runner.cleanup()  # stops listening; the gateway's cleanup flushes the store


def run_gateway(app: web.Application, lifecycle: Lifecycle, host: str, port: int, *,
                print_fn: Callable[[str], None] = print, server_kwargs: dict[str, int] | None = None) -> None:
    """Serve ``app`` until SIGTERM/SIGINT, then stop as the module says."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(app, lifecycle, host, port, print_fn, server_kwargs or {}))


def open_store(url: str, policy: Policy, idle_ttl: float) -> tuple[ProgramStore, StoreProbe,
                                                                   Callable[[], Awaitable[None]]]:
    """The shared store at ``url`` (``redis://`` or ``rediss://``): the store, its probe (for ``Lifecycle``),
    its close."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"--store: expected a redis:// URL, got {redacted_url(url)!r}")
    from autellix.control.redis_store import RedisProgramStore

    store: RedisProgramStore = RedisProgramStore(url, policy, idle_ttl=idle_ttl)
    return store, StoreProbe(store.ping, store.health), store.close
