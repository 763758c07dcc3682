"""The shared program store against a real Redis (Debian's redis-server, started here on a free port).

Two ``RedisProgramStore`` objects on one Redis stand for two gateway replicas:
a program served by one must be taken over by the other with its state.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
import redis
import redis.asyncio as aioredis

from autellix.child_processes import free_port
from autellix.control.redis_store import _MERGE, RedisProgramStore
from autellix.control.store import ProgramStore
from autellix.core import PLAS, DuplicateProgram

pytestmark = pytest.mark.skipif(not os.environ.get("CI") and shutil.which("redis-server") is None,
                                reason="needs Debian's redis-server (.ci/run installs it)")


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        server.terminate()
        server.wait(10)


@pytest_asyncio.fixture
async def replicas(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[tuple[RedisProgramStore, ...]]:
    """Two replicas' stores, under a key prefix of this test's own."""
    prefix = f"test:{request.node.name}:"
    stores = tuple(RedisProgramStore(redis_url, PLAS(), idle_ttl=600, prefix=prefix) for _ in range(2))
    try:
        yield stores
    finally:
        for store in stores:
            await store.close()


def finish_call(store: RedisProgramStore, program_id: str, call_id: str, model_time: float) -> None:
    now = time.monotonic()
    store.call_arrived(program_id, call_id, now)
    store.call_routed(program_id, call_id, "http://engine-a")
    store.call_finished(program_id, call_id, now + model_time, model_time=model_time, wait=0.25,
                        prompt_tokens=10, completion_tokens=5)


@pytest.mark.asyncio
async def test_another_replica_takes_a_program_over_with_its_state(replicas: tuple[RedisProgramStore, ...]) -> None:
    a, b = replicas
    assert isinstance(a, ProgramStore)
    await a.open("prog", time.monotonic(), owner="key-1")
    finish_call(a, "prog", "c1", 1.5)
    finish_call(a, "prog", "c2", 0.5)
    a.pin("prog", "tiny-llama", "http://engine-a")
    await a.flush()
    taken = await b.load("prog")
    assert taken is not None
    assert (taken.service, taken.waiting, taken.calls_done, taken.prompt_tokens, taken.completion_tokens) \
        == (2.0, 0.5, 2, 20, 10)
    assert taken.owner == "key-1" and taken.engines == {"http://engine-a"}
    assert b.pinned("prog", "tiny-llama") == "http://engine-a"
    assert b.priority("prog") == 2.0  # its calls on the new replica keep their place
    with pytest.raises(DuplicateProgram):
        await b.open("prog", time.monotonic())  # live on the cluster, not only on A


@pytest.mark.asyncio
async def test_state_is_written_behind_on_its_own(replicas: tuple[RedisProgramStore, ...], redis_url: str) -> None:
    a, b = replicas
    assert a.flush_interval == 0.5  # every half second: within the interface's 1 s
    with pytest.raises(ValueError, match="within 1 s"):
        RedisProgramStore(redis_url, PLAS(), flush_interval=2.0)
    await a.open("behind", time.monotonic())
    finish_call(a, "behind", "c1", 3.0)  # no flush: the store's own write-behind
    deadline = time.monotonic() + 10  # generous: 2 shared cores; the period is what bounds it
    seen = 0.0
    while time.monotonic() < deadline and seen != 3.0:
        fields = await b.redis.hgetall(b._program_key("behind"))
        seen = float(fields.get("service", 0))
        await asyncio.sleep(0.02)
    assert seen == 3.0


@pytest.mark.asyncio
async def test_two_replicas_serving_one_program_at_once_add_up(replicas: tuple[RedisProgramStore, ...]) -> None:
    a, b = replicas
    await a.open("flap", time.monotonic())
    finish_call(a, "flap", "c1", 1.0)
    await a.flush()
    assert await b.load("flap") is not None
    finish_call(b, "flap", "c2", 2.0)  # the program moved to B and went on there
    await b.flush()
    finish_call(a, "flap", "c3", 0.5)  # A still held it and served one more call (membership flapping)
    await a.flush()
    fields = await a.redis.hgetall(a._program_key("flap"))
    assert float(fields["service"]) == 3.5 and float(fields["calls_done"]) == 3  # every call, once
    assert float(fields["critical_path"]) == 3.0  # a maximum: B's chain c1 + c2, not A's c1 + c3, not a sum
    # A, unused for a while, catches up on its next load: the store's sums plus nothing new of its own.
    a._used["flap"] -= a.revalidate_after + 1
    caught_up = await a.load("flap")
    assert caught_up is not None and (caught_up.service, caught_up.calls_done) == (3.5, 3)
    finish_call(a, "flap", "c4", 0.25)
    await a.flush()  # and then adds only its own new call
    assert float((await a.redis.hgetall(a._program_key("flap")))["service"]) == 3.75


@pytest.mark.asyncio
async def test_a_failed_write_behind_is_added_by_the_next(replicas: tuple[RedisProgramStore, ...],
                                                         redis_url: str) -> None:
    a, _ = replicas
    await a.open("retry", time.monotonic())
    finish_call(a, "retry", "c1", 1.0)
    real = a.redis
    a.redis = aioredis.Redis.from_url("redis://127.0.0.1:1/0")  # nothing listens there
    a._merge = a.redis.register_script(_MERGE)
    with pytest.raises(redis.ConnectionError):
        await a.flush()
    await a.redis.aclose()
    a.redis, a._merge = real, real.register_script(_MERGE)
    finish_call(a, "retry", "c2", 1.0)
    await a.flush()
    assert float((await a.redis.hgetall(a._program_key("retry")))["service"]) == 2.0


@pytest.mark.asyncio
async def test_an_ended_program_is_ended_for_every_replica(replicas: tuple[RedisProgramStore, ...],
                                                           redis_url: str) -> None:
    a, b = replicas
    await a.open("done", time.monotonic())
    finish_call(a, "done", "c1", 1.0)
    await a.flush()
    assert await b.load("done") is not None
    finish_call(a, "done", "c2", 1.0)  # A still holds it too, with a write behind pending
    ended = await b.end("done")  # DELETE /v1/sessions/done reached B
    assert ended is not None and ended.service == 1.0
    await a.flush()  # A's pending write behind does not bring it back
    assert await a.redis.exists(a._program_key("done")) == 0
    fresh = RedisProgramStore(redis_url, PLAS(), prefix=a.prefix)  # a third replica, started later
    try:
        assert await fresh.load("done") is None
        assert await fresh.ended("done")  # late calls anywhere get a clear 404
    finally:
        await fresh.close()


@pytest.mark.asyncio
async def test_a_replicas_idle_expiry_drops_only_its_own_copy(replicas: tuple[RedisProgramStore, ...]) -> None:
    a, b = replicas
    await a.open("moved", time.monotonic())
    finish_call(a, "moved", "c1", 1.0)
    await a.flush()
    assert await b.load("moved") is not None  # the program moved to B and goes on there
    finish_call(b, "moved", "c2", 2.0)
    await b.flush()
    expired = await a.expire(time.monotonic() + a.idle_ttl + 1)  # A's copy idles out
    assert [e.program_id for e in expired] == ["moved"] and "moved" not in a
    assert not await b.ended("moved")
    back = await a.load("moved")  # and if it comes back to A, A takes it over with B's state
    assert back is not None and back.service == 3.0 and back.calls_done == 2


@pytest.mark.asyncio
async def test_an_id_reused_after_its_end_is_a_new_program_everywhere(replicas: tuple[RedisProgramStore, ...]) -> None:
    a, b = replicas
    await a.open("again", time.monotonic())
    finish_call(a, "again", "c1", 4.0)  # A's write behind still pending
    assert await b.end("again") is not None  # DELETE reached B
    await b.open("again", time.monotonic())  # and the id is opened again, a new program
    finish_call(b, "again", "c2", 1.0)
    await b.flush()
    await a.flush()  # A's pending write is for the earlier program: dropped, not added to this one
    fields = await a.redis.hgetall(a._program_key("again"))
    assert float(fields["service"]) == 1.0 and float(fields["calls_done"]) == 1
    a._used["again"] -= a.revalidate_after + 1  # A's copy, unused for a while, is of the earlier program
    taken = await a.load("again")
    assert taken is not None and (taken.service, taken.calls_done, taken.critical_path) == (1.0, 1, 1.0)  # replaced
