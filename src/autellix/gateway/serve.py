"""Run the gateway app until interrupted."""

from __future__ import annotations

import logging

from aiohttp import web

from autellix.gateway.app import GatewayConfig, create_app


def serve(config: GatewayConfig, host: str, port: int, *, print_fn=print) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # handler_cancellation: a client that hangs up cancels its call, which closes
    # the upstream connection, and vLLM aborts the request instead of finishing it
    web.run_app(create_app(config), host=host, port=port, access_log=None, print=print_fn,
                handler_cancellation=True)
