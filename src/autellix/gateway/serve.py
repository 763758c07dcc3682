"""Run the gateway process until interrupted: the app from the composition root, served on its port."""

from __future__ import annotations

import logging
import os
import socket

from autellix.gateway.compose import SERVER_LIMITS, create_app
from autellix.gateway.config import GatewayConfig
from autellix.gateway.heap import heap_trim_every
from autellix.gateway.lifecycle import LIFECYCLE_KEY, run_gateway
from autellix.gateway.parts import GATEWAY_KEY


class ExposedError(RuntimeError):
    """The gateway would serve beyond loopback with no key asked (tenants' or admin's)."""


def serve(config: GatewayConfig, host: str, port: int, *, print_fn=print, shutdown_grace: float = 30.0,
          replica: str | None = None) -> None:
    """The tenants' port on ``host:port``; the admin listener (``config.admin_port``) starts with it.
    Raises ``ExposedError`` before listening when either would be open to anyone beyond loopback,
    and ``autellix.control.keys.KeysError`` when a key source is empty or broken (fail closed)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    trim_every = heap_trim_every(os.environ)  # a bad value is refused before anything is opened
    app = create_app(config, replica=replica or f"{socket.gethostname()}:{port}", shutdown_grace=shutdown_grace,
                     heap_trim_every=trim_every)
    problem = app[GATEWAY_KEY].exposure_error(host)
    if problem is not None:
        raise ExposedError(problem)
    run_gateway(app, app[LIFECYCLE_KEY], host, port, print_fn=print_fn, server_kwargs=SERVER_LIMITS)
