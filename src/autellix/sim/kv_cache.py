"""KV-cache blocks with prefix caching, as vLLM V1's block pool keeps them.

Capacity is a fixed number of blocks of ``block_size`` tokens. A full block is
named by a chained hash (its tokens and the hash of the block before it), so two
requests with the same prefix share the same blocks. A freed block keeps its
hash and stays reusable until it is evicted: free blocks form one LRU queue,
allocation takes from its head, and a request's blocks are freed tail first so
that the shared prefix of a conversation is the last to go.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

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
            self._refs[block] = 1
            out.append(block)
        return out

    def register(self, block: int, block_hash: int) -> None:
        """A block became full: index it by its hash (unless an equal block already is)."""
        if self.caching and self._hash[block] is None and block_hash not in self._by_hash:
            self._hash[block] = block_hash
            self._by_hash[block_hash] = block

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

    def check(self) -> None:
        """Internal consistency (tests call this after every step)."""
        assert all(r >= 0 for r in self._refs), "negative reference count"
        assert all((self._refs[b] == 0) == (b in self._free) for b in range(self.num_blocks)), "free queue mismatch"
        for h, b in self._by_hash.items():
            assert self._hash[b] == h, "hash index mismatch"
