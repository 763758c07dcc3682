"""A gateway process's life: when it is ready, how it starts and how it stops.

``autellix gateway`` runs through :func:`run_gateway`, on uvloop's event loop (libuv's:
about 7% more calls a second than asyncio's own on the benchmark, ``docs/bench-gateway.md``):

* **Start**: the app's parts start in order (``autellix.gateway.parts.Gateway``:
  the store first, the admin listener last), then the process listens, and what
  start-up made is taken out of the garbage collector's view
  (:func:`freeze_startup_objects`).
* **Ready** (``/ready`` 200) while at least one engine is healthy (the gateway's
  own rule) and the process is not stopping. The store is not part of it: a store
  out of reach is out of reach for every replica at once, and if that made them
  unready, Envoy would have no replica left to send a call to. A replica serves on
  from its local copies instead (``autellix.control.store.outage``), and says so in
  ``/metrics`` (``autellix.control.store.health``).
* **SIGTERM** (or SIGINT): ``/ready`` turns 503 at once, so the health checks of
  Envoy (every 1 s, out after 2 failures) send new calls elsewhere; the process
  keeps listening and serving what still arrives meanwhile; once no call or
  stream is in flight, and (when something health-checked it in the last
  ``CHECKED_WITHIN_S``) ``UNREADY_HOLD_S`` has passed so that the checker saw
  the 503, it stops listening, the parts stop in reverse order (the store's last:
  its pending state written) and it exits. ``shutdown_grace`` bounds it all:
  calls still running then are cut. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Awaitable, Callable

import uvloop
from aiohttp import web

from autellix.gateway.errors import GatewayRunner
from autellix.protocol import HEALTH_PATH, METRICS_PATH, READY_PATH

log = logging.getLogger("autellix.gateway.lifecycle")

#: Seconds ``/ready`` stays 503 before the process stops listening, when a health checker is
#: watching: Envoy checks every 1 s and takes a replica out after 2 failures.
UNREADY_HOLD_S = 2.5
#: A ``/ready`` request within this many seconds means a health checker is watching.
CHECKED_WITHIN_S = 5.0
#: Requests that are not calls: never counted in flight, never delay a stop.
PROBE_PATHS = frozenset({HEALTH_PATH, READY_PATH, METRICS_PATH})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Lifecycle:
    """Readiness beyond the engines and the drain on SIGTERM of one gateway; ``on_request`` hears every request
    that is not a probe (the per-replica counters, ``autellix.gateway.metrics.ReplicaCounters``)."""

    def __init__(self, *, shutdown_grace: float = 30.0,
                 on_request: Callable[[web.Request], None] | None = None) -> None:
        self.shutdown_grace = shutdown_grace
        self.on_request = on_request
        self.stopping = False
        self.inflight = 0
        self._last_checked = -float("inf")
        self._idle = asyncio.Event()
        self._idle.set()

    # ---- readiness -------------------------------------------------------------
    def not_ready(self) -> str | None:
        """Why ``/ready`` must answer 503 whatever the engines; None if nothing here stands in the way."""
        return "stopping" if self.stopping else None

    # ---- in the app --------------------------------------------------------------
    def install(self, app: web.Application) -> None:
        """The middleware that counts requests in flight (outermost: it sees every call until its last byte)."""
        app[LIFECYCLE_KEY] = self
        app.middlewares.insert(0, self._middleware)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PROBE_PATHS:
            if request.path == READY_PATH:
                self._last_checked = time.monotonic()
            return await handler(request)
        if self.on_request is not None:
            self.on_request(request)
        self.inflight += 1
        self._idle.clear()
        try:
            return await handler(request)  # a stream's handler returns after its last chunk
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

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
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(app, lifecycle, host, port, print_fn, server_kwargs or {}))


__all__ = ["CHECKED_WITHIN_S", "LIFECYCLE_KEY", "PROBE_PATHS", "UNREADY_HOLD_S", "Lifecycle", "freeze_startup_objects",
           "run_gateway"]
