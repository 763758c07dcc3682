"""The engine pool's health checks, against a real aiohttp engine stand-in."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from autellix.gateway import engines as engines_module
from autellix.gateway.engines import SLOW_PROBES_TO_UNHEALTHY, EnginePool, StaticDiscovery


def stand_in(slow: asyncio.Event) -> web.Application:
    async def health(_: web.Request) -> web.Response:
        if slow.is_set():
            await asyncio.sleep(1.0)
        return web.Response()

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    return app


@pytest.mark.asyncio
async def test_slow_health_answers_drop_an_engine_only_after_a_run_of_them() -> None:
    slow = asyncio.Event()
    async with TestServer(stand_in(slow)) as server, aiohttp.ClientSession() as http:
        url = str(server.make_url("")).rstrip("/")
        pool = EnginePool(StaticDiscovery([url]), http)
        pool.probe_timeout = 0.2
        await pool.refresh()
        assert pool.engines[url].healthy
        slow.set()
        for _ in range(SLOW_PROBES_TO_UNHEALTHY - 1):
            await pool.refresh()
            assert pool.engines[url].healthy, "a slow answer alone must not drop the engine"
        await pool.refresh()
        assert not pool.engines[url].healthy
        slow.clear()
        await pool.refresh()
        assert pool.engines[url].healthy and pool.engines[url].slow_probes == 0


@pytest.mark.asyncio
async def test_a_refused_connection_drops_the_engine_at_once() -> None:
    async with aiohttp.ClientSession() as http:
        server = TestServer(stand_in(asyncio.Event()))
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        pool = EnginePool(StaticDiscovery([url]), http)
        await pool.refresh()
        assert pool.engines[url].healthy
        await server.close()
        await pool.refresh()
        assert not pool.engines[url].healthy


@pytest.mark.asyncio
async def test_an_engine_that_hung_stays_out_though_healthy_longer_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines_module, "HUNG_BACKOFF", 0.2)
    async with TestServer(stand_in(asyncio.Event())) as server, aiohttp.ClientSession() as http:
        url = str(server.make_url("")).rstrip("/")
        pool = EnginePool(StaticDiscovery([url]), http)
        await pool.refresh()
        assert url in pool.loads()
        pool.mark_hung(url)
        await pool.refresh()  # its health checks still pass ...
        assert pool.engines[url].healthy
        assert url not in pool.loads()  # ... but it takes no new call
        assert 0 < pool.describe()[0]["hung_backoff_s"] <= 0.2
        await asyncio.sleep(0.25)
        assert url in pool.loads()
        pool.mark_hung(url)  # a second hang in a row: twice as long
        assert pool.describe()[0]["hung_backoff_s"] > 0.2
        pool.mark_answered(url)  # it answered a call: the next hang starts over
        assert pool.engines[url].hangs == 0
