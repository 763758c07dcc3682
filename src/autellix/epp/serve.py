"""The endpoint picker's process: the gRPC server, the HTTP listener, the parts' lives, the stop on SIGTERM.

* gRPC (``config.port``): Envoy's ``ExternalProcessor`` service, one
  ``autellix.epp.exchange.Exchange`` per stream; and gRPC health
  (``grpc.health.v1``) for the services GIE names: ``liveness`` and the overall
  service while the process runs; ``readiness``, the ext_proc service and
  ``inference-extension`` while it takes calls (from its first look at the
  engines until SIGTERM).
* HTTP (``config.metrics_port``): ``/metrics`` (the gateway's registry, the
  picker's ``autellix_epp_*`` in it), ``/health`` and ``/ready``.
* With a shared store, its health in ``/metrics``, as the gateway's (the store
  looks at itself every second while the picker runs: ``autellix.control.store.shared``).
* SIGTERM or SIGINT: unready at once (the gateway's health checks move new
  calls elsewhere), the streams in flight get up to ``shutdown_grace`` to end,
  then the servers stop and the parts stop in reverse order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable

import grpc
import uvloop
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from autellix.epp.compose import PickerParts, build_picker
from autellix.epp.config import PickerConfig
from autellix.epp.contract import HEALTH_SERVICES, READY_SERVICES
from autellix.epp.exchange import Exchange, StreamGone
from autellix.epp.messages import ProcessingRequest
from autellix.epp.picker import error_answer
from autellix.gateway.lifecycle import freeze_startup_objects
from autellix.protocol import HEALTH_PATH, METRICS_PATH, READY_PATH

log = logging.getLogger("autellix.epp")

#: Seconds the picker waits, once unready, before it stops taking streams: the gateway's health check
#: must see it unready first (Envoy's health check in a GIE gateway's configuration: 1 s).
UNREADY_HOLD_S = 1.0
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class ExternalProcessor(external_processor_pb2_grpc.ExternalProcessorServicer):
    """Envoy's ext_proc service: one exchange per stream."""

    def __init__(self, parts: PickerParts) -> None:
        self.parts = parts
        self.open_streams = 0
        self.idle = asyncio.Event()
        self.idle.set()
        #: Exchanges whose stream ended while their bookkeeping went on (held: the loop keeps only weak ones).
        self._finishing: set[asyncio.Task[None]] = set()

    async def Process(self, request_iterator: AsyncIterator[ProcessingRequest],
                      context: grpc.aio.ServicerContext) -> None:
        exchange = Exchange(request_iterator, context.write, self.parts.picker, error_answer,
                            max_body_bytes=self.parts.gateway.config.max_body_bytes)
        task = asyncio.create_task(self._run(exchange))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            # Envoy ended the stream. Before the answer was out, the client left: the call is cut. After
            # it, Envoy is done with the request and the call's bookkeeping (its settlement, a one-call
            # program's end in the store) finishes on its own.
            if exchange.answered:
                self._finishing.add(task)
                task.add_done_callback(self._finishing.discard)
            else:
                task.cancel()
            raise

    async def _run(self, exchange: Exchange) -> None:
        self.open_streams += 1
        self.idle.clear()
        self.parts.metrics.streams.inc()
        try:
            await exchange.run()
        except StreamGone as exc:  # the client left: the call was charged as aborted on the way out
            log.debug("%s", exc)
        except Exception:
            log.exception("ext_proc stream failed")
            raise
        finally:
            self.parts.metrics.streams.dec()
            self.open_streams -= 1
            if not self.open_streams:
                self.idle.set()


class PickerServer:
    """The picker's parts, its gRPC server and its HTTP listener, started and stopped together."""

    def __init__(self, config: PickerConfig) -> None:
        self.config = config
        self.parts = build_picker(config)
        self.ext_proc = ExternalProcessor(self.parts)
        self.health = health.aio.HealthServicer()
        self._grpc: grpc.aio.Server | None = None
        self._http: web.AppRunner | None = None
        self.port: int | None = None
        self.metrics_url: str | None = None

    @property
    def ready(self) -> bool:
        return self.parts.ready.is_set()

    async def _set_health(self, ready: bool) -> None:
        if ready:
            self.parts.ready.set()
        else:
            self.parts.ready.clear()
        for service in HEALTH_SERVICES:
            await self.health.set(service, SERVING if ready or service not in READY_SERVICES else NOT_SERVING)

    async def start(self) -> None:
        await self._set_health(False)
        await self.parts.gateway.start()  # the engine pool's first look at the engines is in before this returns
        server = grpc.aio.server()
        external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(self.ext_proc, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        self.port = server.add_insecure_port(f"{self.config.host}:{self.config.port}")
        if not self.port:
            raise OSError(f"cannot listen on {self.config.host}:{self.config.port}")
        await server.start()
        self._grpc = server
        if self.config.metrics_port is not None:
            self._http = web.AppRunner(self._http_app(), access_log=None)
            await self._http.setup()
            site = web.TCPSite(self._http, self.config.host, self.config.metrics_port)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.metrics_url = f"http://{self.config.host}:{port}"
        await self._set_health(True)

    async def stop(self, grace: float | None = None) -> None:
        """Unready, the streams in flight finished (up to ``grace``, default the config's), then everything off."""
        grace = self.config.shutdown_grace if grace is None else grace
        await self._set_health(False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        if grace > 0:
            await asyncio.sleep(min(UNREADY_HOLD_S, grace))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ext_proc.idle.wait(), max(0.0, deadline - loop.time()))
        if self._grpc is not None:
            await self._grpc.stop(max(0.0, deadline - loop.time()))
        if self._http is not None:
            await self._http.cleanup()
        await self.parts.gateway.stop()

    # ---- HTTP -----------------------------------------------------------------------------
    def _http_app(self) -> web.Application:
        registry = self.parts.gateway.metrics.registry

        async def metrics(_request: web.Request) -> web.Response:
            return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def healthy(_request: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        async def ready(_request: web.Request) -> web.Response:
            engines = len(self.parts.gateway.pool.loads())
            return web.json_response({"ready": self.ready, "engines": engines}, status=200 if self.ready else 503)

        app = web.Application()
        app.router.add_get(METRICS_PATH, metrics)
        app.router.add_get(HEALTH_PATH, healthy)
        app.router.add_get(READY_PATH, ready)
        return app


async def run_picker(config: PickerConfig, *, print_fn: Callable[..., None] = print) -> None:
    """Serve until SIGTERM or SIGINT; a second signal exits at once."""
    server = PickerServer(config)
    problem = server.parts.gateway.exposure_error(config.host)
    if problem is not None:
        raise ExposedError(problem)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await server.start()
    freeze_startup_objects()
    try:
        print_fn(f"autellix epp: ext_proc on {config.host}:{server.port}"
                 + (f", metrics on {server.metrics_url}" if server.metrics_url else "")
                 + (f", admin on {server.parts.gateway.admin_url}" if server.parts.gateway.admin_url else ""),
                 flush=True)
        await stop.wait()
        for signum in (signal.SIGTERM, signal.SIGINT):  # a second signal: out at once
            loop.remove_signal_handler(signum)
        log.info("stopping: unready; %d streams in flight, up to %.0f s to finish", server.ext_proc.open_streams,
                 config.shutdown_grace)
    finally:
        await server.stop()


class ExposedError(RuntimeError):
    """The picker would serve beyond loopback without the keys that serving asks for."""


def serve(config: PickerConfig) -> None:
    """Run the picker on uvloop's event loop: about 12% less CPU a call than asyncio's own loop
    (``docs/results/2026-12-07-the-call-legs-own-client.md``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run_picker(config))


__all__ = ["ExposedError", "ExternalProcessor", "PickerServer", "run_picker", "serve"]
