"""One gateway replica on the shared program store, as a process.

``python -m autellix.mesh.replica --port P --engine URL [--engine URL ...] --store redis://HOST:PORT/0
[--tokenizer tokenizer.json]``; scheduling settings from ``AUTELLIX_*`` as everywhere.
The gateway as ``autellix gateway`` builds it (``create_app``), with a
:class:`~autellix.mesh.redis_store.RedisProgramStore` in place of the in-memory
store; ``autellix gateway`` has no store option yet. The store must answer before
the replica starts (a replica that cannot reach it would serve programs nobody
else can take over); on shutdown the store writes what is pending and disconnects.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import redis
from aiohttp import web

from autellix.core import SchedulerConfig, policy_by_name
from autellix.gateway.app import GatewayConfig, create_app
from autellix.mesh.redis_store import RedisProgramStore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--engine", action="append", required=True, help="engine base URL (repeatable)")
    parser.add_argument("--store", required=True, help="Redis URL of the shared program store")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json for exact prompt lengths")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    try:
        with redis.Redis.from_url(args.store, socket_connect_timeout=5) as probe:
            probe.ping()
    except redis.RedisError as exc:
        print(f"the program store {args.store} does not answer: {exc}", file=sys.stderr)
        return 2
    config = GatewayConfig(engines=args.engine, scheduler=SchedulerConfig.from_env(), tokenizer=args.tokenizer)
    store = RedisProgramStore(args.store, policy_by_name(config.scheduler.policy),
                              idle_ttl=config.scheduler.program_idle_ttl)
    app = create_app(config, store=store)

    async def close_store(_app: web.Application) -> None:
        await store.close()

    app.on_cleanup.append(close_store)  # after the gateway's own cleanup, which flushes
    # handler_cancellation: as `autellix gateway` (a client that hangs up aborts its call upstream)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None, handler_cancellation=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
