"""The emulator's KV cache events: an engine model's prefix cache published on the wire vLLM uses.

vLLM's ``ZmqEventPublisher`` sends each engine step's events as one
``KVEventBatch`` (msgpack: the time, the events as tagged maps, the
data-parallel rank) on a PUB socket, framed ``(topic, sequence number,
payload)``, and keeps the last batches for a ROUTER socket that replays them
from a sequence number, then sends ``END_SEQ``. :class:`KvEventPublisher` does
the same for one emulated engine: the engine model's block pool tells it each
block it names and each it evicts (``sim.kv_cache.BlockEvents``), and the
emulator publishes them once per step (``flush``). Block hashes are the low 64
bits of vLLM's own (``sim.kv_cache.vllm_block_hashes``), so a gateway's KV
event index follows an emulated engine exactly as it follows a real one.
pyzmq and msgspec are the ``kv-index`` extra's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

from autellix.control.background import cancel
from autellix.gateway.kv_events import DEVICE_MEDIUM, END_SEQ
from autellix.gateway.kv_events import block_hash as event_hash

log = logging.getLogger("autellix.sim.kv_events")

#: Batches kept for the replay (vLLM's ``buffer_steps`` default).
BUFFER_STEPS = 10_000


class KvEventPublisher:
    """One engine's stored and removed blocks, published a batch per step on ``endpoint``, replayed on
    ``replay_endpoint``; a ``sim.kv_cache.BlockEvents`` for its block pool."""

    def __init__(self, endpoint: str, replay_endpoint: str, *, block_size: int, topic: str = "",
                 buffer_steps: int = BUFFER_STEPS) -> None:
        self.endpoint, self.replay_endpoint, self.topic = endpoint, replay_endpoint, topic
        self.block_size = block_size
        self._pending: list[dict[str, Any]] = []
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._pub: Any = None
        self._replay_task: asyncio.Task[None] | None = None

    # ---- BlockEvents: what the pool tells, gathered into the step's batch ----------------------------
    def stored(self, block_hash: int) -> None:
        self._add("BlockStored", block_hash, {"parent_block_hash": None, "token_ids": [],
                                              "block_size": self.block_size, "lora_id": None, "lora_name": None})

    def removed(self, block_hash: int) -> None:
        self._add("BlockRemoved", block_hash, {})

    def _add(self, kind: str, block_hash: int, fields: dict[str, Any]) -> None:
        """One block onto the batch's last event when it is of the same kind, else a new event."""
        last = self._pending[-1] if self._pending else None
        if last is not None and last["type"] == kind:
            last["block_hashes"].append(event_hash(block_hash))
        else:
            self._pending.append({"type": kind, "block_hashes": [event_hash(block_hash)], "medium": DEVICE_MEDIUM,
                                  **fields})

    # ---- the sockets -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Bind both sockets and serve the replay (in the running event loop)."""
        import zmq
        import zmq.asyncio

        context = zmq.asyncio.Context.instance()
        self._pub = context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(self.endpoint)
        router = context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(self.replay_endpoint)
        self._replay_task = asyncio.create_task(self._serve_replay(router), name=f"kv-replay {self.endpoint}")

    async def stop(self) -> None:
        await cancel(self._replay_task)
        if self._pub is not None:
            self._pub.close(linger=0)
            self._pub = None

    def flush(self) -> None:
        """Publish the events gathered since the last flush as one batch (none: nothing is sent)."""
        if not self._pending or self._pub is None:
            return
        import msgspec

        payload = msgspec.msgpack.encode([time.time(), self._pending, 0])
        self._pending = []
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        # PUB never blocks: with no subscriber, or one past its high-water mark, the batch is dropped
        # (the replay still has it), as vLLM's publisher drops it
        self._pub.send_multipart((self.topic.encode(), seq.to_bytes(8, "big"), payload))

    async def _serve_replay(self, router: Any) -> None:
        try:
            while True:
                frames = await router.recv_multipart()
                if len(frames) != 3:
                    log.warning("malformed KV event replay request: %d frames", len(frames))
                    continue
                client, _, since = frames
                start = int.from_bytes(since, "big")
                for seq, payload in list(self._buffer):
                    if seq >= start:
                        await router.send_multipart((client, b"", self.topic.encode(), seq.to_bytes(8, "big"),
                                                     payload))
                await router.send_multipart((client, b"", b"", END_SEQ, b""))
        finally:
            with contextlib.suppress(Exception):
                router.close(linger=0)

    def description(self) -> dict[str, Any]:
        """The ``kv_events`` of the engine's info, as ``autellix.engine.kv_events.describe`` gives a real one's."""
        return {"endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint, "topic": self.topic,
                "block_size": self.block_size, "hash_algorithm": "sha256", "hash_seed": None}


__all__ = ["END_SEQ", "KvEventPublisher"]
