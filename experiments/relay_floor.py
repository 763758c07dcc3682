"""The gateway's floor: the same server, event loop and call leg relaying each call, and nothing else.

``experiments/gateway_overhead.py --floor`` runs it beside the gateway: aiohttp's server on uvloop, each
call's body read whole and posted to the engine by the gateway's own client
(``autellix.gateway.engine_calls.EngineCalls``), the answer read whole and written back. No validation,
no program, no admission, no routing, no settlement, no metrics: the part of a call's cost that is the
framework's and the sockets', against which the gateway's own work per call is measured.

Run: ``python experiments/relay_floor.py --port 8200 --engine http://127.0.0.1:8100``.
"""

from __future__ import annotations

import argparse

import uvloop
from aiohttp import web

from autellix.gateway.engine_calls import EngineCalls

CALL_PATHS = ("/v1/chat/completions", "/v1/completions")
JSON_HEADERS = {"Content-Type": "application/json"}


def create_app(engine: str) -> web.Application:
    calls = EngineCalls()

    async def relay(request: web.Request) -> web.Response:
        answer = await calls.post(engine + request.path, await request.read(), JSON_HEADERS)
        try:
            body = await answer.read()
        finally:
            answer.release()
        return web.Response(status=answer.status, body=body, headers=JSON_HEADERS)

    async def ready(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def close_calls(_: web.Application) -> None:
        await calls.close()

    app = web.Application()
    for path in CALL_PATHS:
        app.router.add_post(path, relay)
    app.router.add_get("/ready", ready)
    app.on_cleanup.append(close_calls)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--engine", required=True, help="the engine's base URL")
    args = parser.parse_args()
    web.run_app(create_app(args.engine.rstrip("/")), host="127.0.0.1", port=args.port,
                loop=uvloop.new_event_loop(), access_log=None, print=None)


if __name__ == "__main__":
    main()
