"""KV-cache blocks with prefix caching, as vLLM V1's block pool keeps them.

Capacity is a fixed number of blocks of ``block_size`` tokens. A full block is
named by a chained hash (its tokens and the hash of the block before it), so two
requests with the same prefix share the same blocks: Python's ``hash`` in the
simulator, vLLM's own (``vllm_block_hashes``) where the names leave the process
(the emulator's KV cache events). A freed block keeps its
hash and stays reusable until it is evicted: free blocks form one LRU queue,
allocation takes from its head, and a request's blocks are freed tail first so
that the shared prefix of a conversation is the last to go. A block can be
pinned (``touch``) by the engine itself, as it pins a paused program's prefix
(``autellix.core.kv_retention``), and unpinned (``release``) like a request's.

:class:`HostCache` is the host memory such a prefix is offloaded to: room for
its blocks is reserved when it is given up, and a block is copied there only
when the pool reuses it (``BlockPool.on_evict``): a prefix that survives in
the prefix cache costs no transfer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

from autellix.core import VllmBlockHasher

#: The hash a request's first block chains from.
ROOT_HASH = 0


def block_hashes(tokens: Sequence[int], block_size: int, start: int = 0,
                 parent: int = ROOT_HASH) -> list[int]:
    """Chained hashes of the full blocks of ``tokens`` from block ``start``
    (``parent`` is the hash of block ``start - 1``)."""
    out: list[int] = []
    prev = parent
    for begin in range(start * block_size, len(tokens) - block_size + 1, block_size):
        prev = hash((prev, tuple(tokens[begin:begin + block_size])))
        out.append(prev)
    return out


#: How an engine names its full blocks: ``block_hashes``' signature (tokens, block size, first block, parent).
BlockHashes = Callable[[Sequence[int], int, int, int], list[int]]


def vllm_block_hashes(hasher: VllmBlockHasher) -> BlockHashes:
    """Blocks named as vLLM names them (``core.VllmBlockHasher``), each hash the whole digest as an int (the
    next block's parent); the low 64 bits are what vLLM's KV events carry."""

    def hashes(tokens: Sequence[int], block_size: int, start: int = 0, parent: int = ROOT_HASH) -> list[int]:
        if block_size != hasher.block_size:
            raise ValueError(f"blocks of {block_size} tokens, hashed as blocks of {hasher.block_size}")
        digests = hasher.digests(tokens, start=start, parent=parent.to_bytes(32, "big") if start else None)
        return [int.from_bytes(digest, "big") for digest in digests]

    return hashes


class BlockEvents(Protocol):
    """What a pool tells of its prefix cache, as vLLM's KV cache events do (``BlockStored``, ``BlockRemoved``)."""

    def stored(self, block_hash: int) -> None: ...

    def removed(self, block_hash: int) -> None: ...


class BlockPool:
    """``num_blocks`` blocks: reference counts, the hash index and the LRU free queue."""

    def __init__(self, num_blocks: int, *, caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.caching = caching
        self._refs = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._by_hash: dict[int, int] = {}
        #: Blocks with no reference, oldest first (allocation and eviction take the head).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.evictions = 0
        #: Told (block, hash) when an allocation evicts a cached block, before it is reused.
        self.on_evict: Callable[[int, int], None] | None = None
        #: Told every hash the prefix cache gains and loses (the gateway's KV event index listens).
        self.events: BlockEvents | None = None

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def usage(self) -> float:
        return self.used_blocks / self.num_blocks

    # ---- prefix cache ----------------------------------------------------------
    def cached_prefix(self, hashes: Sequence[int]) -> list[int]:
        """Blocks holding the longest cached prefix of ``hashes`` (not yet referenced)."""
        if not self.caching:
            return []
        out = []
        for h in hashes:
            block = self._by_hash.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def free_among(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` sit in the free queue (taking them uses free capacity)."""
        return sum(1 for b in blocks if self._refs[b] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        """Reference cached blocks (a prefix hit)."""
        for block in blocks:
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1

    # ---- allocation ------------------------------------------------------------
    def allocate(self, count: int) -> list[int]:
        """``count`` fresh blocks from the head of the free queue, evicting their
        cached contents. The caller checks ``free_blocks`` first."""
        if count > len(self._free):
            raise MemoryError(f"asked for {count} blocks, {len(self._free)} free")
        out = []
        for _ in range(count):
            block, _ = self._free.popitem(last=False)
            old = self._hash[block]
            if old is not None:
                self._hash[block] = None
                if self._by_hash.get(old) == block:
                    del self._by_hash[old]
                self.evictions += 1
                if self.on_evict is not None:
                    self.on_evict(block, old)
                if self.events is not None:
                    self.events.removed(old)
            self._refs[block] = 1
            out.append(block)
        return out

    def register(self, block: int, block_hash: int) -> None:
        """A block became full: index it by its hash (unless an equal block already is)."""
        if self.caching and self._hash[block] is None and block_hash not in self._by_hash:
            self._hash[block] = block_hash
            self._by_hash[block_hash] = block
            if self.events is not None:
                self.events.stored(block_hash)

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference from each of a request's blocks; blocks nobody
        holds join the free queue tail first, keeping their hash."""
        for block in reversed(blocks):
            refs = self._refs[block] - 1
            if refs < 0:
                raise ValueError(f"block {block} released more often than referenced")
            self._refs[block] = refs
            if refs == 0:
                self._free[block] = None

    def refs(self, block: int) -> int:
        return self._refs[block]

    def hashes_of(self, blocks: Sequence[int]) -> list[int | None]:
        """Each block's hash (None: not cached)."""
        return [self._hash[b] for b in blocks]

    def check(self) -> None:
        """Internal consistency (tests call this after every step)."""
        assert all(r >= 0 for r in self._refs), "negative reference count"
        assert all((self._refs[b] == 0) == (b in self._free) for b in range(self.num_blocks)), "free queue mismatch"
        for h, b in self._by_hash.items():
            assert self._hash[b] == h, "hash index mismatch"


class HostCache:
    """Offloaded prefixes in host memory: per program, the hashes of its prefix's
    blocks in order, room reserved for all of them (at most ``capacity`` blocks
    in all; reserving past it evicts the least recently stored programs first, a
    prefix larger than the whole cache is refused). A block's copy is there once
    it is ``saved``: when the device block was about to be reused."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"host cache capacity must be >= 0 blocks, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[object, tuple[tuple[int, ...], set[int]]] = OrderedDict()
        self.used = 0
        self.evictions = 0

    @property
    def free_blocks(self) -> int:
        return self.capacity - self.used

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def store(self, key: object, hashes: Sequence[int]) -> bool:
        """Reserve room for ``key``'s prefix (replacing what it had). False when it cannot fit."""
        self.take(key)
        if len(hashes) > self.capacity:
            return False
        while self.used + len(hashes) > self.capacity:
            _, (old, _) = self._entries.popitem(last=False)
            self.used -= len(old)
            self.evictions += 1
        self._entries[key] = (tuple(hashes), set())
        self.used += len(hashes)
        return True

    def save(self, key: object, block_hash: int) -> bool:
        """The device copy of one of ``key``'s blocks is about to be reused: keep it. False if not ``key``'s."""
        entry = self._entries.get(key)
        if entry is None or block_hash not in entry[0]:
            return False
        entry[1].add(block_hash)
        return True

    def restorable(self, key: object, hashes: Sequence[int], start: int, end: int) -> int:
        """How many of ``hashes[start:end]`` in a row ``key`` has copies of."""
        entry = self._entries.get(key)
        if entry is None:
            return 0
        stored, saved = entry
        at = start
        while at < min(end, len(stored)) and hashes[at] == stored[at] and stored[at] in saved:
            at += 1
        return at - start

    def take(self, key: object) -> tuple[int, ...]:
        """Remove ``key``'s prefix; returns its hashes (empty when it had none)."""
        stored, _ = self._entries.pop(key, ((), set()))
        self.used -= len(stored)
        return stored
