"""The scheduler plugin's KV retention across tool pauses: vLLM's blocks under ``autellix.core.kv_retention``.

vLLM 0.32 frees a finished request's blocks into its LRU free list
(``BlockPool.free_blocks``), where they stay findable by hash until an
allocation takes them from the list's head. A program that pauses for a tool
and comes back finds its prefix only if nothing allocated past it meanwhile;
under memory pressure the earliest paused go first, whoever returns next.

The least invasive way to protect a prefix is vLLM's own reference count:
when a program's last call leaves (``AutellixScheduler._free_request``, before
vLLM frees the request), :class:`PrefixRetention` takes one reference on the
call's full cached blocks (``BlockPool.touch``), so they leave the free list
and no allocation can take them; the hash index keeps pointing at them, so
the program's next call finds them through the ordinary prefix-cache lookup.
When that call is admitted the reference is dropped (``free_blocks``, tail
first, as vLLM frees a request). Nothing of vLLM is patched but one method:
:class:`RetainingKVCacheManager` is vLLM's ``KVCacheManager`` whose
``allocate_slots``, when the free list is short, gives held prefixes back (in
the ledger's order: offloaded through the swap connector's host pool when that
is cheaper, else dropped to the free list's tail) and tries again, so a held
prefix never costs a running call a preemption or a waiting call its turn.
An offloaded prefix goes back to the free list's tail with the connector as
vLLM's reuse watcher (``BlockPool.unpin_blocks``): each block is copied to the
host pool in the step that reuses it, so a prefix that survives costs no
transfer; the program's next call takes the host rows
(``AutellixSwapConnector.adopt_prefix``) when its prompt starts with them.

A program's prefix is held from its second pause on (it has come back once);
a request without a program (no gateway, no session) is never held. The
decision, the prediction of when a program returns and the accounting of
what its calls compute again are the core's (``RetentionLedger``), the same
code the simulator runs. ``AUTELLIX_KV_RETENTION=off`` turns holding off; the
accounting stays.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Hashable, Sequence
from types import MethodType
from typing import Any, Protocol

from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import BlockHash, KVCacheBlock, get_block_hash
from vllm.v1.request import Request

from autellix.core.kv_retention import Release, Retention, RetentionCosts, RetentionLedger, common_prefix

ENV_RETENTION = "AUTELLIX_KV_RETENTION"
#: Prefill seconds per token the decision prices a recompute at when the
#: engine has not measured its own yet (an A100 running Llama-3.1-8B: 0.1 ms).
DEFAULT_PREFILL_S_PER_TOKEN = 1.0e-4
#: Host transfer seconds per KV block, each way, priced when a swap path exists:
#: a fraction of the recompute (the CPU engine's copies measure 1-3 GB/s, its
#: prefill far slower per byte; PCIe moves an 8B model's block in ~0.1 ms).
SWAP_SHARE_OF_RECOMPUTE = 0.05


def retention_enabled() -> bool:
    """``AUTELLIX_KV_RETENTION``: on unless ``off``, ``0`` or ``false``."""
    return os.environ.get(ENV_RETENTION, "on").strip().lower() not in ("off", "0", "false", "no")


class HostSwap(Protocol):
    """What retention and preemption need of a host pool (``AutellixSwapConnector``; ``NoHostSwap`` without one)."""

    capacity: int

    def swap_out(self, request: Request, block_ids: tuple[list[int], ...]) -> bool: ...

    def count_resumed(self, resumes: int, recomputed_tokens: int) -> None: ...

    def free_rows(self) -> int: ...

    def offload_prefix(self, key: str, block_ids: Sequence[int], tokens: int) -> bool: ...

    def adopt_prefix(self, key: str, request_id: str, tokens: int) -> bool: ...

    def forget_prefix(self, key: str) -> None: ...

    def block_reused(self, block: KVCacheBlock) -> None: ...


class NoHostSwap:
    """No swap connector loaded: nothing is swapped, prefixes are only dropped."""

    capacity = 0

    def swap_out(self, request: Request, block_ids: tuple[list[int], ...]) -> bool:
        return False

    def count_resumed(self, resumes: int, recomputed_tokens: int) -> None:
        return None

    def free_rows(self) -> int:
        return 0

    def offload_prefix(self, key: str, block_ids: Sequence[int], tokens: int) -> bool:
        return False

    def adopt_prefix(self, key: str, request_id: str, tokens: int) -> bool:
        return False

    def forget_prefix(self, key: str) -> None:
        return None

    def block_reused(self, block: KVCacheBlock) -> None:
        return None


def _prefix_key(program: Hashable) -> str:
    return f"program:{program}"


class PrefixRetention:
    """One engine's held prefixes: vLLM blocks pinned and unpinned as the ledger says."""

    def __init__(self, manager: KVCacheManager, block_size: int, swap: HostSwap, *, hold: bool,
                 prefill_s_per_token: float = DEFAULT_PREFILL_S_PER_TOKEN) -> None:
        self.manager = manager
        self.pool = manager.block_pool
        self.block_size = block_size
        self.swap = swap
        recompute = prefill_s_per_token * block_size
        transfer = recompute * SWAP_SHARE_OF_RECOMPUTE if swap.capacity else math.inf
        self.ledger: RetentionLedger[KVCacheBlock, BlockHash] = RetentionLedger(
            RetentionCosts(recompute_s_per_block=recompute, swap_out_s_per_block=transfer,
                           swap_in_s_per_block=transfer), hold=hold)
        #: Programs whose prefix sits in the host pool: its block hashes.
        self._offloaded: dict[Hashable, tuple[BlockHash, ...]] = {}
        #: Programs back with a call not admitted yet: that call (an offloaded prefix goes straight to it).
        self._waiting: dict[Hashable, Request] = {}
        self.adopted_tokens = 0
        #: Told when the ledger starts or stops holding any prefix (``RetainingKVCacheManager``).
        self.on_holding: Callable[[bool], None] | None = None
        self._holding = False

    def _held_changed(self) -> None:
        holding = self.ledger.held_blocks > 0
        if holding != self._holding:
            self._holding = holding
            if self.on_holding is not None:
                self.on_holding(holding)

    # ---- calls ------------------------------------------------------------------------------
    def arrived(self, program: Hashable, request: Request, now: float, *, named: bool) -> None:
        """A call arrived (``add_request``): hand it its program's offloaded prefix, if its prompt starts with it."""
        self.ledger.arrived(program, now)
        if named:
            self._waiting[program] = request
        self._hand_over(program, request)

    def _hand_over(self, program: Hashable, request: Request) -> None:
        """The program's offloaded prefix, if any, becomes ``request``'s as far as its prompt starts with it."""
        hashes = self._offloaded.pop(program, None)
        if hashes is None:
            return
        key = _prefix_key(program)
        common = common_prefix(request.block_hashes, hashes)
        if common and self.swap.adopt_prefix(key, request.request_id, common * self.block_size):
            self.adopted_tokens += common * self.block_size
        else:
            self.swap.forget_prefix(key)

    def admitted(self, program: Hashable, request: Request, computed_tokens: int) -> None:
        """A call was scheduled for the first time with ``computed_tokens`` of its prompt found
        (prefix cache and host pool): count what it computes again, end its program's hold."""
        full = (request.num_prompt_tokens - 1) // self.block_size
        if self._waiting.get(program) is request:
            del self._waiting[program]
        self.ledger.admitted(program, request.block_hashes[:full], computed_tokens // self.block_size)
        self._unpin(self.ledger.resumed(program))
        self._held_changed()

    def finished(self, program: Hashable, request: Request, now: float, *, named: bool,
                 expect_return: bool = False) -> None:
        """A call is about to leave (its blocks not yet freed): hold its program's prefix if the ledger says so
        (``expect_return``: the call offered tools, so its program may be back from its first pause)."""
        blocks = self._cached_blocks(request) if named else []
        pin, unpin = self.ledger.finished(program, now, blocks, request.block_hashes[:len(blocks)],
                                          expect_return=expect_return)
        if pin:
            self.pool.touch(pin)
        self._unpin(unpin)
        self._held_changed()

    def aborted(self, program: Hashable, request: Request, now: float) -> None:
        if self._waiting.get(program) is request:
            del self._waiting[program]
        self._unpin(self.ledger.aborted(program, now))
        self._held_changed()

    def ended(self, program: Hashable) -> None:
        """The program's session ended: its hold, and its copy in the host pool, go."""
        self._unpin(self.ledger.ended(program))
        if self._offloaded.pop(program, None) is not None:
            self.swap.forget_prefix(_prefix_key(program))
        self._held_changed()

    def expire(self, now: float, idle_s: float) -> None:
        for release in self.ledger.expire(now, idle_s):
            self._unpin(release.blocks)
        for program in [p for p in self._offloaded if p not in self.ledger.predictor]:
            del self._offloaded[program]
            self.swap.forget_prefix(_prefix_key(program))
        self._held_changed()

    # ---- memory pressure ------------------------------------------------------------------------
    def give_back(self, shortfall: int, now: float) -> bool:
        """An allocation lacks about ``shortfall`` blocks: give held prefixes back, cheapest
        first. False when nothing is held any more."""
        releases = self.ledger.shortage(max(shortfall, 1), now, host_free_blocks=self.swap.free_rows())
        for release in releases:
            self._release(release)
        self._held_changed()
        return bool(releases)

    def release_all(self) -> None:
        for release in self.ledger.release_all():
            self._unpin(release.blocks)
        self._held_changed()

    def _release(self, release: Release[KVCacheBlock]) -> None:
        blocks = release.blocks
        if release.how is Retention.OFFLOAD:
            # the hashes while the blocks still carry them (unpinned, they may be reused at once)
            hashes = []
            for block in blocks:
                if block.block_hash is None:
                    break
                hashes.append(get_block_hash(block.block_hash))
            if hashes and self.swap.offload_prefix(_prefix_key(release.program),
                                                   [b.block_id for b in blocks[:len(hashes)]],
                                                   len(hashes) * self.block_size):
                self._offloaded[release.program] = tuple(hashes)
                # back to the free list's tail, tail first; a block is copied to the host
                # pool when an allocation takes it (the connector's watcher)
                self.pool.unpin_blocks(reversed(blocks), self.swap.block_reused)
                waiting = self._waiting.get(release.program)
                if waiting is not None:  # it is back already: its call takes the prefix now
                    self._hand_over(release.program, waiting)
                return
        self._unpin(blocks)

    # ---- vLLM's blocks ----------------------------------------------------------------------------
    def _cached_blocks(self, request: Request) -> list[KVCacheBlock]:
        """The request's leading blocks that are in the prefix cache (full and hashed)."""
        out = []
        for block in self.manager.get_blocks(request.request_id).blocks[0]:
            if block.is_null or block.block_hash is None:
                break
            out.append(block)
        return out[:len(request.block_hashes)]

    def _unpin(self, blocks: Sequence[KVCacheBlock]) -> None:
        if blocks:
            self.pool.free_blocks(reversed(blocks))  # tail first, as vLLM frees a request

    def stats(self) -> dict[str, float]:
        return self.ledger.stats() | {"adopted_tokens": float(self.adopted_tokens),
                                      "block_size": float(self.block_size)}


#: vLLM's own ``allocate_slots``, called directly (not through ``super()``): it runs for every
#: running request every step.
_ALLOCATE_SLOTS = KVCacheManager.allocate_slots


class RetainingKVCacheManager(KVCacheManager):
    """vLLM's KV cache manager whose allocations take held prefixes back when blocks run short.

    vLLM's scheduler builds its ``KVCacheManager`` itself, with no factory to
    hand it a subclass; ``AutellixScheduler`` turns the freshly built manager
    into this class (``adopt``), which changes nothing but ``allocate_slots``.
    While no prefix is held there is nothing to give back, and the manager's
    ``allocate_slots`` is vLLM's own, bound to it (no wrapper's call in each
    running request's allocation every step); the wrapper is put back when the
    ledger takes its first hold (``PrefixRetention.on_holding``)."""

    retention: PrefixRetention
    clock: Callable[[], float]

    @classmethod
    def adopt(cls, manager: KVCacheManager, retention: PrefixRetention,
              clock: Callable[[], float]) -> RetainingKVCacheManager:
        manager.__class__ = cls
        assert isinstance(manager, RetainingKVCacheManager)
        manager.retention = retention
        manager.clock = clock
        retention.on_holding = manager._holding
        manager._holding(retention.ledger.held_blocks > 0)
        return manager

    def _holding(self, holding: bool) -> None:
        if holding:
            self.__dict__.pop("allocate_slots", None)  # the class's: gives held prefixes back when short
        else:
            self.allocate_slots = MethodType(_ALLOCATE_SLOTS, self)  # type: ignore[method-assign]

    def allocate_slots(self, request: Request, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        blocks = _ALLOCATE_SLOTS(self, request, num_new_tokens, *args, **kwargs)
        while blocks is None:
            wanted = -(-(request.num_computed_tokens + num_new_tokens) // self.retention.block_size)
            shortfall = wanted - len(self.get_blocks(request.request_id).blocks[0]) \
                - self.block_pool.get_num_free_blocks()
            if not self.retention.give_back(shortfall, self.clock()):
                return None
            blocks = _ALLOCATE_SLOTS(self, request, num_new_tokens, *args, **kwargs)
        return blocks

