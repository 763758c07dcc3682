"""The gateway's KV event feed against vLLM's own event publisher (ZeroMQ, msgpack): replay, live batches, restarts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from autellix.core import PrefixIndex
from autellix.gateway.kv_events import EventSource, KvEventFeed, apply_batch, block_hash

kv_events = pytest.importorskip("vllm.distributed.kv_events")
msgspec = pytest.importorskip("msgspec")

BLOCK = 16


def stored(hashes: list[int], **fields: object) -> object:
    return kv_events.BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=[0] * BLOCK * len(hashes),
                                 block_size=BLOCK, lora_id=None, medium=fields.pop("medium", "GPU"),
                                 lora_name=fields.pop("lora_name", None), **fields)


def batch(*events: object) -> object:
    return kv_events.KVEventBatch(ts=time.time(), events=list(events))


def decoded(*events: object) -> list[object]:
    """Events as vLLM encodes them and the feed decodes them."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(batch(*events)))[1]


def test_batches_in_vllms_encoding_apply_in_order():
    index = PrefixIndex()
    apply_batch(index, "e", decoded(stored([1, 2, 3]), kv_events.BlockRemoved(block_hashes=[3], medium="GPU")))
    assert index.cached_tokens([1, 2, 3], ["e"]) == {"e": 2 * BLOCK}
    # host copies, LoRA blocks and blocks with extra keys are not a device prefix of plain text
    apply_batch(index, "e", decoded(stored([3], medium="CPU"), stored([3], lora_name="adapter"),
                                    stored([3], extra_keys=[("salt",)])))
    assert index.held("e") == frozenset({1, 2})
    apply_batch(index, "e", decoded(kv_events.AllBlocksCleared()))
    assert index.held("e") == frozenset()


def test_digests_become_the_events_integers():
    digest = bytes(range(32))
    assert block_hash(digest) == int.from_bytes(digest, "big") & (2**64 - 1)
    assert block_hash(5) == 5
    with pytest.raises(ValueError):
        block_hash("5")


def test_sources_reach_wildcard_endpoints_at_the_engines_host_and_refuse_malformed_ones():
    source = EventSource.of("http://10.1.2.3:8000", {"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558",
                                                     "block_size": 16, "hash_algorithm": "sha256",
                                                     "hash_seed": None})
    assert (source.endpoint, source.replay_endpoint) == ("tcp://10.1.2.3:5557", "tcp://10.1.2.3:5558")
    ipc = EventSource.of("http://127.0.0.1:8000", {"endpoint": "ipc:///tmp/x.sock", "block_size": 16})
    assert ipc.endpoint == "ipc:///tmp/x.sock" and ipc.replay_endpoint is None
    for bad in ({"endpoint": "tcp://*:5557"}, {"endpoint": "tcp://*:port", "block_size": 16},
                {"block_size": 16}, {"endpoint": "ipc:///x", "block_size": "many"}):
        with pytest.raises(ValueError, match="malformed"):
            EventSource.of("http://e:1", bad)


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.mark.asyncio
async def test_feed_replays_what_was_published_before_it_then_follows_and_survives_a_restart(tmp_path):
    endpoint, replay = f"ipc://{tmp_path}/pub.sock", f"ipc://{tmp_path}/replay.sock"
    description = {"endpoint": endpoint, "replay_endpoint": replay, "block_size": BLOCK, "hash_algorithm": "sha256",
                   "hash_seed": None}
    publisher = kv_events.ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay)
    feed = KvEventFeed(PrefixIndex())
    await feed.start()
    try:
        publisher.publish(batch(stored([1, 2])))  # before anyone subscribed: only the replay has it
        await asyncio.sleep(0.2)
        feed.engine_described("http://engine", description)
        await until(lambda: feed.index.held("http://engine") == {1, 2})
        assert feed.hasher is not None and feed.hasher.block_size == BLOCK
        publisher.publish(batch(stored([3]), kv_events.BlockRemoved(block_hashes=[1], medium="GPU")))
        await until(lambda: feed.index.held("http://engine") == {2, 3})
        # the engine restarts behind the same sockets: its sequence starts again, its entry with it
        publisher.shutdown()
        publisher = kv_events.ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay)
        await asyncio.sleep(0.3)  # the subscriber reconnects
        publisher.publish(batch(stored([7])))
        await until(lambda: feed.index.held("http://engine") == {7})
        # an engine that names blocks otherwise is not followed; one that leaves is forgotten
        feed.engine_described("http://other", {**description, "block_size": 32})
        assert feed.following() == ["http://engine"]
        feed.engine_removed("http://engine")
        assert feed.following() == [] and feed.index.engines() == []
    finally:
        await feed.stop()
        publisher.shutdown()
