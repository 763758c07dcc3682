"""Run the gateway app until interrupted."""

from __future__ import annotations

import logging
import os
import socket

from aiohttp import web

from autellix.core import policy_by_name
from autellix.gateway.app import GATEWAY_KEY, SERVER_LIMITS, GatewayConfig, create_app
from autellix.gateway.heap import heap_trim_every, install_heap_trim
from autellix.gateway.lifecycle import Lifecycle, open_store, run_gateway


class ExposedError(RuntimeError):
    """The gateway would serve beyond loopback with no key asked (tenants' or admin's)."""


def serve(config: GatewayConfig, host: str, port: int, *, print_fn=print, store_url: str | None = None,
          shutdown_grace: float = 30.0, replica: str | None = None) -> None:
    """The tenants' port on ``host:port``; the admin listener (``config.admin_port``) starts with it.
    Raises ``ExposedError`` before listening when either would be open to anyone beyond loopback,
    and ``autellix.control.keys.KeysError`` when a key source is empty or broken (fail closed)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    trim_every = heap_trim_every(os.environ)  # a bad value is refused before anything is opened
    # store, readiness, SIGTERM and the per-replica counters: autellix.gateway.lifecycle
    store = ping = close_store = None
    if store_url is not None:
        store, ping, close_store = open_store(store_url, policy_by_name(config.scheduler.policy),
                                              config.scheduler.program_idle_ttl)
    app = create_app(config, store=store)
    gateway = app[GATEWAY_KEY]
    problem = gateway.exposure_error(host)
    if problem is not None:
        raise ExposedError(problem)
    lifecycle = Lifecycle(replica=replica or f"{socket.gethostname()}:{port}", shutdown_grace=shutdown_grace,
                          store_ping=ping, key_ttl=config.scheduler.program_idle_ttl)
    lifecycle.install(app, gateway.metrics.registry)
    install_heap_trim(app, trim_every)
    if store_url is not None:
        from autellix.control.shared_drains import SharedDrains  # redis: only with a store

        gateway.shared_drains = SharedDrains(store_url, poll_interval=config.poll_interval)

        async def start_drains(_app: web.Application) -> None:  # after the gateway's start: its pool exists
            gateway.shared_drains.start(gateway.pool)

        async def close_shared(_app: web.Application) -> None:  # after the gateway's cleanup, which flushes
            await gateway.shared_drains.stop()
            assert close_store is not None
            await close_store()

        app.on_startup.append(start_drains)
        app.on_cleanup.append(close_shared)
    run_gateway(app, lifecycle, host, port, print_fn=print_fn, server_kwargs=SERVER_LIMITS)
