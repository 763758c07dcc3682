"""The gateway's KV event index: one subscription to each engine's KV cache events, applied to ``core.PrefixIndex``.

An engine that runs Autellix's scheduler says in its info (``GET
/autellix/v1/info``'s ``kv_events``) where vLLM publishes its KV cache events
and how it names blocks. The engine pool hands that description here when the
engine turns healthy (``engine_described``) and says when an engine leaves
(``engine_removed``). Per engine a task subscribes to the publisher (a TCP
endpoint bound to every address is reached at the engine's own host), asks the
replay socket for every batch the engine still buffers, from sequence 0, so
that an index started late (a new replica, a restarted gateway) learns what the
engine already holds, then follows the live batches in order:

* ``BlockStored`` (device blocks, plain text: no LoRA, no extra keys) adds the
  blocks to the engine's entry, ``BlockRemoved`` takes them off,
  ``AllBlocksCleared`` empties it;
* a sequence number that goes back means the engine restarted: its entry is
  emptied before the batch is applied (a new engine holds nothing); one that
  skips ahead means batches were lost (the publisher's high-water mark): the
  entry is emptied and rebuilt from the replay.

Prompts are hashed as the engines hash them (``core.VllmBlockHasher``): the
feed keeps the block size, hash algorithm and seed the first engine described,
and an engine that names blocks otherwise is not followed (a warning says so).
pyzmq and msgspec (vLLM's own libraries, the ``kv-index`` extra) are needed;
without them the feed says so once and routing goes without the index.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autellix.control.background import cancel
from autellix.core import PrefixIndex, VllmBlockHasher

log = logging.getLogger("autellix.gateway.kv_events")

#: vLLM's replay protocol: the batches from a sequence number, then this sequence number.
END_SEQ = (-1).to_bytes(8, "big", signed=True)
#: Seconds to wait for a replay before following the live batches alone.
REPLAY_TIMEOUT = 5.0
#: Seconds between tries to reach a publisher that went away (zmq reconnects by itself; this is the replay's).
RETRY_INTERVAL = 1.0
#: vLLM's name for device memory: what a call on this engine finds without a transfer.
DEVICE_MEDIUM = "GPU"
#: Device memory as events name it (older engines name no medium).
DEVICE_MEDIA = (None, DEVICE_MEDIUM)
_LOW_64 = (1 << 64) - 1


@dataclass(frozen=True)
class EventSource:
    """Where one engine publishes its KV events, and how it names blocks."""

    endpoint: str
    replay_endpoint: str | None
    topic: str
    block_size: int
    hash_algorithm: str
    hash_seed: str | None

    @classmethod
    def of(cls, engine_url: str, description: Mapping[str, Any]) -> EventSource:
        """From an engine's info (``ValueError`` when it is malformed); wildcard TCP hosts become the engine's."""
        try:
            block_size = int(description["block_size"])
            endpoint = _reachable(engine_url, str(description["endpoint"]))
            replay = description.get("replay_endpoint")
            return cls(endpoint, _reachable(engine_url, str(replay)) if replay else None,
                       str(description.get("topic") or ""), block_size,
                       str(description.get("hash_algorithm") or "sha256"),
                       None if description.get("hash_seed") is None else str(description["hash_seed"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed kv_events description from {engine_url}: {description!r}") from exc

    def hasher(self) -> VllmBlockHasher:
        return VllmBlockHasher(self.block_size, algorithm=self.hash_algorithm, seed=self.hash_seed)


def _reachable(engine_url: str, endpoint: str) -> str:
    """``tcp://*:5557`` (bound to every address) as ``tcp://<the engine's host>:5557``; others unchanged."""
    scheme, _, rest = endpoint.partition("://")
    if scheme != "tcp":
        return endpoint
    host, _, port = rest.rpartition(":")
    if host in ("*", "0.0.0.0", "[::]", "::"):
        engine_host = urllib.parse.urlsplit(engine_url).hostname or "127.0.0.1"
        host = f"[{engine_host}]" if ":" in engine_host else engine_host
    return f"tcp://{host}:{int(port)}"


def block_hash(value: Any) -> int:
    """An event's block hash as the index keys it: the int vLLM sends, or the low 64 bits of a digest."""
    if isinstance(value, int):
        return value & _LOW_64
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(value, "big") & _LOW_64
    raise ValueError(f"not a block hash: {value!r}")


def apply_batch(index: PrefixIndex, engine: str, events: list[Any]) -> None:
    """One decoded ``KVEventBatch``'s events, in order, onto ``engine``'s entry."""
    for event in events:
        if not isinstance(event, Mapping):
            continue
        kind = event.get("type")
        if kind == "BlockStored":
            if event.get("medium") in DEVICE_MEDIA and not event.get("lora_name") and not event.get("lora_id") \
                    and not any(event.get("extra_keys") or ()):
                index.stored(engine, [block_hash(h) for h in event["block_hashes"]], int(event["block_size"]))
        elif kind == "BlockRemoved":
            if event.get("medium") in DEVICE_MEDIA:
                index.removed(engine, [block_hash(h) for h in event["block_hashes"]])
        elif kind == "AllBlocksCleared":
            index.cleared(engine)


class KvEventFeed:
    """Follows every described engine's KV events into ``index``; a gateway service (start, stop)."""

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index
        self._sources: dict[str, EventSource] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: How prompts are hashed: the first described engine's naming.
        self.hasher: VllmBlockHasher | None = None
        self._naming: tuple[int, str, str | None] | None = None
        self._running = False
        try:
            import msgspec  # noqa: F401
            import zmq.asyncio  # noqa: F401
        except ImportError:
            self.available = False
            log.warning("KV event index off: pyzmq and msgspec are not installed (the kv-index extra)")
        else:
            self.available = True

    async def start(self) -> None:
        self._running = True

    async def stop(self) -> None:
        self._running = False
        for url in list(self._tasks):
            await cancel(self._tasks.pop(url))

    def following(self) -> list[str]:
        return sorted(self._tasks)

    def engine_described(self, url: str, description: Mapping[str, Any] | None) -> None:
        """``url`` turned healthy with this ``kv_events`` description (None: it publishes none)."""
        if not self.available or not self._running:
            return
        if description is None:
            self._drop(url)
            return
        try:
            source = EventSource.of(url, description)
            hasher = source.hasher()
        except ValueError as exc:
            log.warning("not following %s's KV events: %s", url, exc)
            self._drop(url)
            return
        naming = (source.block_size, source.hash_algorithm, source.hash_seed)
        if self._naming is None:
            self._naming, self.hasher = naming, hasher
        elif naming != self._naming:
            log.warning("not following %s's KV events: it names blocks by %s, the others by %s", url, naming,
                        self._naming)
            self._drop(url)
            return
        # an engine turning healthy again may be a new process behind the same address: start afresh
        self._drop(url)
        self._sources[url] = source
        self._tasks[url] = asyncio.create_task(self._follow(url, source), name=f"kv-events {url}")

    def engine_removed(self, url: str) -> None:
        self._drop(url)

    def _drop(self, url: str) -> None:
        task = self._tasks.pop(url, None)
        if task is not None:
            task.cancel()
        self._sources.pop(url, None)
        if url in self.index.engines():
            self.index.forget(url)

    async def _follow(self, url: str, source: EventSource) -> None:
        import msgspec
        import zmq
        import zmq.asyncio

        decode = msgspec.msgpack.Decoder().decode
        context = zmq.asyncio.Context.instance()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt_string(zmq.SUBSCRIBE, source.topic)
        sub.connect(source.endpoint)
        self.index.cleared(url)
        last: int | None = None
        try:
            last = await self._replay(url, source, decode, context, since=0)
            while True:
                _, seq_bytes, payload = await sub.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big")
                if last is not None and seq <= last and seq != 0:
                    continue  # already applied from the replay
                if last is not None and seq == 0 and last > 0:
                    log.info("engine %s restarted its KV events: its index entry starts empty", url)
                    self.index.cleared(url)
                elif last is not None and seq > last + 1:
                    log.warning("lost KV events %d-%d of %s: rebuilding its entry from the replay", last + 1,
                                seq - 1, url)
                    self.index.cleared(url)
                    last = await self._replay(url, source, decode, context, since=0)
                    if last is not None and seq <= last:
                        continue
                apply_batch(self.index, url, _events(decode(payload)))
                last = seq
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("following %s's KV events failed: its entry is dropped", url)
            self.index.cleared(url)
        finally:
            sub.close(linger=0)

    async def _replay(self, url: str, source: EventSource, decode: Any, context: Any, *, since: int) -> int | None:
        """Apply every batch ``url`` still buffers from ``since``; the last sequence applied (None: none)."""
        if source.replay_endpoint is None:
            return None
        import zmq

        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(source.replay_endpoint)
        last: int | None = None
        try:
            await dealer.send_multipart((b"", since.to_bytes(8, "big")))
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT)
                seq_bytes, payload = frames[-2], frames[-1]
                if seq_bytes == END_SEQ:
                    return last
                apply_batch(self.index, url, _events(decode(payload)))
                last = int.from_bytes(seq_bytes, "big")
        except TimeoutError:
            log.warning("no KV event replay from %s in %.0f s: following its live events only", url, REPLAY_TIMEOUT)
            return last
        finally:
            dealer.close(linger=0)


def _events(batch: Any) -> list[Any]:
    """A ``KVEventBatch`` (an array: timestamp, events, data-parallel rank) decoded generically."""
    if isinstance(batch, list | tuple) and len(batch) >= 2 and isinstance(batch[1], list):
        return batch[1]
    raise ValueError(f"not a KV event batch: {type(batch).__name__}")


__all__ = ["DEVICE_MEDIUM", "END_SEQ", "EventSource", "KvEventFeed", "apply_batch", "block_hash"]
