"""Run the gateway app until interrupted."""

from __future__ import annotations

import logging

from aiohttp import web

from autellix.gateway.app import GatewayConfig, create_app


def serve(config: GatewayConfig, host: str, port: int, *, print_fn=print) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    web.run_app(create_app(config), host=host, port=port, access_log=None, print=print_fn)
