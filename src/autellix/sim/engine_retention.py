"""KV retention in the engine model: paused programs' prefixes held, offloaded to host memory, dropped, restored.

The plugin's default (the profile's ``kv_retention``, ``host_kv_blocks`` and
``swap_s_per_block``): when a program that has come back before has no call
left, its last call's cached blocks are pinned; an allocation that finds the
free list short gives pins up in the order ``autellix.core.kv_retention``
decides, offloading a prefix to host memory
(:class:`autellix.sim.kv_cache.HostCache`, transfers priced per block and added
to the step) or dropping it to the LRU free list; a returning call reuses it by
hash, from device or host. Every engine counts the prefix blocks a program's
call computes again (``recomputed_prefix_tokens``), retention on or off (the
stock schedulers never hold).
"""

from __future__ import annotations

import collections
import itertools
import math

from autellix.core.kv_retention import Retention, RetentionCosts, RetentionLedger
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.engine_request import Seq
from autellix.sim.kv_cache import BlockPool, HostCache

#: Every this many requests that leave, programs that went quiet give their holds up
#: (as the planner's table forgets them).
EXPIRE_EVERY = 256


class PrefixRetention:
    """One engine's held prefixes, its host copies and the transfers they cost; time is always passed in."""

    def __init__(self, profile: EngineProfile, pool: BlockPool, *, hold: bool, idle_ttl: float) -> None:
        self.pool = pool
        self.block_size = profile.block_size
        self.swap_s_per_block = profile.swap_s_per_block
        self.idle_ttl = idle_ttl
        swap = profile.swap_s_per_block if profile.host_kv_blocks else math.inf
        costs = RetentionCosts(recompute_s_per_block=profile.cost.per_prefill_token * profile.block_size,
                               swap_out_s_per_block=swap, swap_in_s_per_block=swap)
        self.ledger: RetentionLedger[int, int] = RetentionLedger(costs, hold=hold)
        self.host = HostCache(profile.host_kv_blocks) if hold and profile.host_kv_blocks else None
        #: Blocks of offloaded prefixes still in the prefix cache: block -> programs whose host copy it feeds.
        self._watched: dict[int, set[str]] = {}
        if self.host is not None:
            pool.on_evict = self._evicting
        self._pending_swap = 0.0  # transfers planned for the step being built
        self._left = 0
        self.offloaded_saved_blocks = 0
        self.swap_seconds = 0.0
        self.restored_tokens = 0

    # ---- a request's way through ----------------------------------------------------
    def arrived(self, seq: Seq, now: float) -> None:
        self.ledger.arrived(seq.program, now)

    def restorable(self, seq: Seq, hits: int) -> int:
        """Blocks after the ``hits`` prefix-cache blocks that the host cache holds for ``seq``'s program."""
        if self.host is None:
            return 0
        end = min((seq.num_tokens - 1) // self.block_size, len(seq.hashes))
        return self.host.restorable(seq.program, seq.hashes, hits, end)

    def restored(self, blocks: int) -> None:
        """``blocks`` came back from the host cache: their transfer is the step's."""
        self.restored_tokens += blocks * self.block_size
        self._pending_swap += blocks * self.swap_s_per_block

    def admitted(self, seq: Seq, hits: int, restored: int) -> None:
        """``seq`` took its prefix: count what of its program's last prefix it computes
        again, end its program's hold and host copy."""
        full = (seq.num_tokens - 1) // self.block_size
        self.ledger.admitted(seq.program, seq.hashes[:full], hits + restored)
        self.pool.release(self.ledger.resumed(seq.program))
        if self.host is not None:
            self.host.take(seq.program)

    def leaving(self, seq: Seq, now: float, *, aborted: bool) -> list[int]:
        """``seq`` leaves (before it lets go of its blocks): a finished call's cached full blocks
        become the prefix its program's next call starts with (a request of no program is its own
        and never comes back). The blocks of holds this ends, for the pool to release."""
        if aborted:
            return self.ledger.aborted(seq.program, now)
        full = min(seq.registered, len(seq.hashes)) if seq.req.program_id is not None else 0
        pin, unpin = self.ledger.finished(seq.program, now, seq.blocks[:full], seq.hashes[:full])
        self.pool.touch(pin)  # before the request lets go of them
        return unpin

    def ended(self, program: str) -> None:
        """``program``'s session ended (the gateway tells the engine): its hold and its host copy go."""
        self.pool.release(self.ledger.ended(program))
        if self.host is not None:
            self.host.take(program)

    def left(self, now: float) -> None:
        """A request left; every ``EXPIRE_EVERY``, programs that went quiet give their holds up."""
        self._left += 1
        if self._left % EXPIRE_EVERY == 0:
            for release in self.ledger.expire(now, self.idle_ttl):
                self.pool.release(release.blocks)

    # ---- a short free list ------------------------------------------------------------
    def yield_holds(self, short: int, now: float) -> bool:
        """Give up held prefixes until ``short`` more blocks could be free, in the
        ledger's order; offloaded ones are copied to the host cache first (their
        transfer is this step's). False when nothing is held."""
        host = self.host
        releases = self.ledger.shortage(short, now, host_free_blocks=host.free_blocks if host else 0)
        for release in releases:
            if release.how is Retention.OFFLOAD and host is not None:
                hashes = list(itertools.takewhile(lambda h: h is not None, self.pool.hashes_of(release.blocks)))
                if hashes and host.store(release.program, hashes):
                    # copied to the host only if, and when, the pool reuses them (``_evicting``)
                    for block in release.blocks[:len(hashes)]:
                        self._watched.setdefault(block, set()).add(release.program)
            self.pool.release(release.blocks)
        return bool(releases)

    def _evicting(self, block: int, block_hash: int) -> None:
        """The pool reuses a cached block: an offloaded prefix that has it keeps a copy (one
        transfer, paid in the step being built, or the next one after a decode run)."""
        assert self.host is not None
        for program in self._watched.pop(block, ()):
            if self.host.save(program, block_hash):
                self._pending_swap += self.swap_s_per_block
                self.offloaded_saved_blocks += 1

    def take_swap_seconds(self) -> float:
        """The transfers planned since the last step was priced, now the step's."""
        seconds, self._pending_swap = self._pending_swap, 0.0
        self.swap_seconds += seconds
        return seconds

    # ---- observation -----------------------------------------------------------------
    def held(self) -> list[int]:
        """Every block a hold references (a block once per hold)."""
        return list(self.ledger.all_held())

    def reclaimable_blocks(self) -> int:
        """Blocks only held prefixes reference: used, but any allocation takes them back."""
        held = collections.Counter(self.ledger.all_held())
        return sum(1 for block, holds in held.items() if self.pool.refs(block) == holds)

    def stats(self) -> dict[str, float]:
        bs = self.block_size
        return {
            "recomputed_prefix_tokens": float(self.ledger.recomputed_prefix_blocks * bs),
            "reused_prefix_tokens": float(self.ledger.reused_prefix_blocks * bs),
            "held_blocks": float(self.ledger.held_blocks),
            "kv_kept": float(self.ledger.kept),
            "kv_offloaded": float(self.ledger.offloaded),
            "kv_dropped": float(self.ledger.dropped),
            "kv_offloaded_blocks": float(self.ledger.offloaded_blocks),
            "kv_offloaded_saved_blocks": float(self.offloaded_saved_blocks),
            "restored_tokens": float(self.restored_tokens),
            "swap_seconds": self.swap_seconds,
        }
