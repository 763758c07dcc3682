"""The KV blocks of the engine model's requests: prefix-cache hits, allocation, and full blocks named for sharing.

KV capacity is the profile's ``kv_blocks`` blocks of ``block_size`` tokens
(:class:`autellix.sim.kv_cache.BlockPool`); with prefix caching, full blocks
are shared by chained hash and freed blocks stay cached until evicted LRU, as
in vLLM V1. A free list too short for an allocation first takes back the
prefixes that KV retention holds (:class:`autellix.sim.engine_retention.PrefixRetention`).
"""

from __future__ import annotations

from autellix.sim.engine_request import Seq
from autellix.sim.engine_retention import PrefixRetention
from autellix.sim.kv_cache import ROOT_HASH, BlockHashes, BlockPool, block_hashes


class RequestBlocks:
    """Blocks for requests' tokens from one engine's pool; time is always passed in."""

    def __init__(self, pool: BlockPool, block_size: int, *, prefix_caching: bool,
                 retention: PrefixRetention, hashes: BlockHashes = block_hashes) -> None:
        self.pool = pool
        self.hashes = hashes
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.retention = retention
        #: Prompt tokens looked up in the prefix cache and found there (vLLM's prefix-cache counters).
        self.queried_tokens = 0
        self.hit_tokens = 0

    def _ensure_hashes(self, seq: Seq, blocks: int) -> None:
        have = len(seq.hashes)
        if blocks > have:
            bs = self.block_size
            end = min(blocks * bs, seq.known)
            seq.hashes += self.hashes(seq.tokens[:end], bs, have, seq.hashes[-1] if seq.hashes else ROOT_HASH)

    def prefix_hits(self, seq: Seq) -> list[int]:
        """The cached blocks ``seq``'s tokens start with (none without prefix caching)."""
        if not self.prefix_caching:
            return []
        # at least one token is computed, so the step yields logits (vLLM's rule)
        blocks = (seq.num_tokens - 1) // self.block_size
        self._ensure_hashes(seq, blocks)
        return self.pool.cached_prefix(seq.hashes[:blocks])

    def looked_up(self, seq: Seq, hits: int) -> None:
        """``seq`` was admitted with ``hits`` blocks found in the prefix cache: the cache's counters."""
        self.queried_tokens += seq.num_tokens
        self.hit_tokens += hits * self.block_size

    def allocate(self, seq: Seq, new_tokens: int, now: float, hits: list[int] | None = None,
                 restore: int = 0) -> bool:
        """Blocks for ``new_tokens`` more of ``seq`` after its prefix ``hits`` and
        ``restore`` blocks loaded from the host cache; a short free list first
        takes back held prefixes (``PrefixRetention.yield_holds``). False when it cannot fit."""
        bs = self.block_size
        hits = hits or []
        have = len(seq.blocks) + len(hits)
        need = -(-(seq.computed + (len(hits) + restore) * bs + new_tokens) // bs) - have
        # a yielded hold may be the one ``hits`` point into: count again after each
        while (short := need + self.pool.free_among(hits) - self.pool.free_blocks) > 0:
            if not self.retention.yield_holds(short, now):
                return False
        if hits:
            self.pool.touch(hits)
            seq.blocks += hits
            seq.registered = len(seq.blocks)
            seq.computed += len(hits) * bs
        if need > 0:
            seq.blocks += self.pool.allocate(need)
        if restore:
            first = len(hits)
            for i in range(first, first + restore):
                self.pool.register(seq.blocks[i], seq.hashes[i])
            seq.registered = first + restore
            seq.computed += restore * bs
            self.retention.restored(restore)
        return True

    def grow(self, seq: Seq, tokens: int) -> None:
        """Blocks for ``seq``'s first ``tokens`` tokens, from the free list (a decode run checked they are free)."""
        need = -(-tokens // self.block_size) - len(seq.blocks)
        if need > 0:
            seq.blocks += self.pool.allocate(need)

    def register_full_blocks(self, seq: Seq, upto: int | None = None) -> None:
        """Name ``seq``'s full blocks in the prefix cache, up to its computed tokens
        or ``upto`` (the tokens scheduled this step: vLLM V1 caches a block when it
        allocates it, so a call scheduled later in the same step shares it)."""
        if not self.prefix_caching:
            return
        full = min(seq.computed if upto is None else upto, seq.known) // self.block_size
        if full > seq.registered:
            self._ensure_hashes(seq, full)
            for i in range(seq.registered, min(full, len(seq.hashes))):
                self.pool.register(seq.blocks[i], seq.hashes[i])
            seq.registered = full
