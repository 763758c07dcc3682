"""A gateway process's life: the store it runs on, when it is ready, how it stops, what it served.

``autellix gateway`` runs through :func:`run_gateway`:

* **Store**: ``--store redis://...`` runs the gateway on the shared
  :class:`~autellix.control.redis_store.RedisProgramStore` (replicas behind Envoy);
  without it the in-memory store, as before. With a store, engine drains live in
  it too (:class:`~autellix.control.shared_drains.SharedDrains`): a drain sent to any
  replica applies on all.
* **Ready** (``/ready`` 200) only while at least one engine is healthy (the
  gateway's own rule), the store answers (pinged every second) and the process is
  not stopping. A store that does not answer at start does not stop the process
  (in a cluster Redis may start after it); it stays unready until the store answers.
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
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from autellix.control.recent import RecentIds
from autellix.control.store import ProgramStore
from autellix.core import Policy
from autellix.gateway.errors import GatewayRunner
from autellix.protocol import (
    CHAT_COMPLETIONS_PATH,
    COMPLETIONS_PATH,
    HEALTH_PATH,
    IMPLICIT_SESSION_HEADERS,
    METRICS_PATH,
    READY_PATH,
    SESSION_HEADER,
)

log = logging.getLogger("autellix.gateway.lifecycle")

#: Seconds ``/ready`` stays 503 before the process stops listening, when a health checker is
#: watching: Envoy checks every 1 s and takes a replica out after 2 failures.
UNREADY_HOLD_S = 2.5
#: A ``/ready`` request within this many seconds means a health checker is watching.
CHECKED_WITHIN_S = 5.0
#: Seconds between two pings of the store, and how long one may take.
STORE_CHECK_INTERVAL_S = 1.0
#: Program keys remembered for the per-replica program counter: at most this many, each until it
#: has not been seen for ``Lifecycle.key_ttl`` seconds (the program idle TTL: by then its program
#: has expired, and a call with the key again starts a new one).
PROGRAM_KEYS_REMEMBERED = 100_000
#: Requests that are not calls: never counted in flight, never delay a stop.
PROBE_PATHS = frozenset({HEALTH_PATH, READY_PATH, METRICS_PATH})
CALL_PATHS = frozenset({CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def program_key(headers: Mapping[str, str]) -> str | None:
    """The key Envoy hashes a call on (``autellix.mesh.resources``): the session header, else the
    first agent session header present; None for a one-call program."""
    for name in (SESSION_HEADER, *IMPLICIT_SESSION_HEADERS):
        value = headers.get(name)
        if value:
            return value
    return None


class Lifecycle:
    """Readiness beyond the engines, the drain on SIGTERM, and the per-replica counters of one gateway."""

    def __init__(self, *, replica: str, shutdown_grace: float = 30.0,
                 store_ping: Callable[[], Awaitable[object]] | None = None, key_ttl: float = 600.0) -> None:
        self.replica = replica
        self.shutdown_grace = shutdown_grace
        self.store_ping = store_ping
        #: The store answered its last ping (always, without a store).
        self.store_ok = store_ping is None
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
        if self.stopping:
            return "stopping"
        if not self.store_ok:
            return "store_unreachable"
        return None

    async def _watch_store(self) -> None:
        assert self.store_ping is not None
        while True:
            try:
                await asyncio.wait_for(self.store_ping(), STORE_CHECK_INTERVAL_S)
                ok = True
            except Exception as exc:  # any failure to answer is "unreachable"
                ok = False
                if self.store_ok:
                    log.warning("program store unreachable: %r", exc)
            if ok and not self.store_ok:
                log.info("program store reachable")
            self.store_ok = ok
            await asyncio.sleep(STORE_CHECK_INTERVAL_S)

    # ---- in the app --------------------------------------------------------------
    def install(self, app: web.Application, registry: CollectorRegistry) -> None:
        """The counting middleware (outermost: it sees every call until its last byte), the counters
        in ``registry`` (the gateway's own), and the store watch on the app's life."""
        self._calls = Counter("autellix_replica_calls", "Calls (chat, completions) served by this replica",
                              ["replica"], registry=registry)
        self._program_count = Counter(
            "autellix_replica_programs",
            "Programs (distinct program keys, plus one per keyless call) whose calls this replica served",
            ["replica"], registry=registry)
        # the labelled children, looked up once (the hot path)
        self._calls_here = self._calls.labels(self.replica)
        self._programs_here = self._program_count.labels(self.replica)
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


def open_store(url: str, policy: Policy, idle_ttl: float) -> tuple[ProgramStore, Callable[[], Awaitable[object]],
                                                                   Callable[[], Awaitable[None]]]:
    """The shared store at ``url`` (``redis://`` or ``rediss://``): the store, its ping, its close."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"--store: expected a redis:// URL, got {url!r}")
    from autellix.control.redis_store import RedisProgramStore

    store = RedisProgramStore(url, policy, idle_ttl=idle_ttl)
    return store, store.redis.ping, store.close
