"""Swap, not recompute: a vLLM KV connector that keeps a preempted request's KV
blocks in a bounded host pool and loads them back when it resumes.

Loaded through vLLM's KV transfer configuration (no vLLM source is changed)::

    --kv-transfer-config '{"kv_connector": "AutellixSwapConnector",
        "kv_connector_module_path": "autellix.engine.kv.connector",
        "kv_role": "kv_both", "kv_connector_extra_config": {"host_pool_blocks": 4096}}'

(:func:`kv_transfer_args` builds it.) vLLM's connector interface has no
preemption hook on the scheduler side, so Autellix's scheduler
(``AutellixScheduler._preempt_request``, which both its own preemptions and
vLLM's KV-pressure preemptions go through) calls :meth:`swap_out` with the
request's blocks just before vLLM frees them. The same pool keeps paused
programs' prefixes that KV retention gives up under memory pressure
(:meth:`offload_prefix`, ``autellix.engine.kv.retention``: rows reserved at
once, each block copied only when vLLM reuses it) until the program's next
call takes them (:meth:`adopt_prefix`). Then, per step:

* scheduler side: when the step's metadata is built, its swapped-out requests
  get one contiguous run of rows in the :class:`HostBlockPool` (evicting the
  least recently swapped-out requests; a request larger than the pool is
  refused: recompute, counted as a fallback). When a request is scheduled
  again, vLLM first reuses what its prefix cache still holds and asks
  :meth:`get_num_new_matched_tokens` for the rest: the pool covers it, the
  blocks are loaded instead of recomputed.
* worker side: :meth:`handle_preemptions` runs before the step's model runner
  touches any block (vLLM calls it before zeroing or reusing freed blocks) and
  gathers every swapped-out block of the step in one batch
  (``KVBlockMover.save``); :meth:`start_load_kv` scatters the step's restores
  back before the forward pass.

Metrics go through vLLM's connector stats (``get_kv_connector_stats``) to its
log line and its Prometheus endpoint: ``vllm:autellix_kv_swap_*``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from autellix.engine.kv.pool import HostBlockPool
from autellix.engine.kv.swap import KVBlockMover

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger("autellix.engine.kv.connector")

CONNECTOR = "AutellixSwapConnector"
MODULE = "autellix.engine.kv.connector"
#: Host pool size when none is configured, in KV blocks (all layers of one block per row).
DEFAULT_HOST_POOL_BLOCKS = 1024


def kv_transfer_args(host_pool_blocks: int = DEFAULT_HOST_POOL_BLOCKS) -> list[str]:
    """vLLM arguments that load the swap connector with a host pool of that many blocks."""
    if not isinstance(host_pool_blocks, int) or host_pool_blocks < 0:
        raise ValueError(f"host_pool_blocks must be an integer >= 0, got {host_pool_blocks!r}")
    config = {"kv_connector": CONNECTOR, "kv_connector_module_path": MODULE, "kv_role": "kv_both",
              "kv_connector_extra_config": {"host_pool_blocks": host_pool_blocks}}
    return ["--kv-transfer-config", json.dumps(config)]


def host_pool_blocks(extra: dict[str, Any]) -> int:
    value = extra.get("host_pool_blocks", DEFAULT_HOST_POOL_BLOCKS)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"kv_connector_extra_config.host_pool_blocks must be an integer >= 0, got {value!r}")
    return value


# ---- what the scheduler side tells the worker side each step ------------------------
@dataclass(frozen=True)
class SwapJob:
    request_id: str
    device_blocks: tuple[int, ...]
    host_rows: tuple[int, ...]


@dataclass
class _LazyPrefix:
    """An offloaded prefix whose blocks are saved as they are reused: under ``key`` (the
    program's, then its next call's) while ``alive`` (its host rows are still its own)."""

    key: str
    alive: bool = True


@dataclass
class SwapMetadata(KVConnectorMetadata):
    saves: list[SwapJob] = field(default_factory=list)
    loads: list[SwapJob] = field(default_factory=list)


# ---- metrics ----------------------------------------------------------------------------
#: Counters summed across workers and steps. out_* / in_*: what the worker moved
#: (device->host, host->device); the rest: scheduler-side decisions.
STAT_KEYS = (
    "out_bytes", "out_blocks", "out_transfers", "out_batches", "out_seconds",
    "in_bytes", "in_blocks", "in_transfers", "in_batches", "in_seconds",
    "swapped_out", "restored", "restored_tokens", "prefix_cache_covered",
    "fallback_no_space", "fallback_evicted", "resumes", "recomputed_tokens",
    "prefixes_out", "prefixes_adopted", "prefix_blocks_saved",
)


@dataclass
class KVSwapStats(KVConnectorStats):
    def reset(self) -> None:
        self.data = {}

    def add(self, key: str, value: float) -> None:
        if value:
            self.data[key] = self.data.get(key, 0) + value

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key, value in other.data.items():
            self.add(key, value)
        return self

    def reduce(self) -> dict[str, int | float]:
        return {key: round(self.data[key], 6) for key in STAT_KEYS if key in self.data}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KVSwapPromMetrics(KVConnectorPromMetrics):
    """``vllm:autellix_kv_swap_*`` counters on vLLM's own Prometheus endpoint."""

    def __init__(self, vllm_config: VllmConfig, metric_types: dict[type[PromMetric], type[PromMetricT]],
                 labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        counter = self._counter_cls
        moved = {
            "bytes": counter(name="vllm:autellix_kv_swap_bytes", documentation="KV bytes moved by swapping",
                             labelnames=[*labelnames, "direction"]),
            "blocks": counter(name="vllm:autellix_kv_swap_blocks", documentation="KV blocks moved by swapping",
                              labelnames=[*labelnames, "direction"]),
            "transfers": counter(name="vllm:autellix_kv_swap_transfers",
                                 documentation="Host<->device transfers issued by swapping",
                                 labelnames=[*labelnames, "direction"]),
            "seconds": counter(name="vllm:autellix_kv_swap_seconds", documentation="Time spent swapping KV",
                               labelnames=[*labelnames, "direction"]),
        }
        fallbacks = counter(name="vllm:autellix_kv_swap_fallbacks",
                            documentation="Preempted requests recomputed because the host pool could not keep them",
                            labelnames=[*labelnames, "reason"])
        plain = {
            "swapped_out": ("vllm:autellix_kv_swap_requests_out", "Preempted requests swapped out to the host pool"),
            "restored": ("vllm:autellix_kv_swap_requests_in", "Resumed requests whose KV came back from the pool"),
            "restored_tokens": ("vllm:autellix_kv_swap_restored_tokens", "Tokens loaded instead of recomputed"),
            "recomputed_tokens": ("vllm:autellix_kv_swap_recomputed_tokens",
                                  "Already computed tokens computed again after preemption"),
            "resumes": ("vllm:autellix_kv_swap_resumes", "Preempted requests scheduled again"),
            "prefixes_out": ("vllm:autellix_kv_swap_prefixes_out",
                             "Paused programs' prefixes offloaded to the host pool under memory pressure"),
            "prefixes_adopted": ("vllm:autellix_kv_swap_prefixes_adopted",
                                 "Offloaded prefixes handed to their program's next call"),
            "prefix_blocks_saved": ("vllm:autellix_kv_swap_prefix_blocks_saved",
                                    "Blocks of offloaded prefixes copied to the host pool as vLLM reused them"),
        }
        plain_metrics = {key: counter(name=name, documentation=doc, labelnames=labelnames)
                         for key, (name, doc) in plain.items()}
        self._bound: dict[tuple[int, str], Any] = {}
        for idx, values in per_engine_labelvalues.items():
            for direction in ("out", "in"):
                for name, metric in moved.items():
                    self._bound[(idx, f"{direction}_{name}")] = metric.labels(*values, direction)
            self._bound[(idx, "fallback_no_space")] = fallbacks.labels(*values, "no_space")
            self._bound[(idx, "fallback_evicted")] = fallbacks.labels(*values, "evicted")
            for key, metric in plain_metrics.items():
                self._bound[(idx, key)] = metric.labels(*values)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, value in transfer_stats_data.items():
            bound = self._bound.get((engine_idx, key))
            if bound is not None and value:
                bound.inc(value)


# ---- the connector ----------------------------------------------------------------------
class AutellixSwapConnector(KVConnectorBase_V1):
    _cache_hit_source = CacheHitSource.HOST

    @property
    def requires_kv_delivery(self) -> bool:
        # a best-effort cache: a lost swap is a recompute, never an error
        return False

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        groups = kv_cache_config.kv_cache_groups
        if len(groups) != 1:
            raise ValueError(f"{CONNECTOR} supports models with one KV cache group, this one has {len(groups)}")
        self.block_size = groups[0].kv_cache_spec.block_size
        self.num_blocks = kv_cache_config.num_blocks
        self.capacity = host_pool_blocks(self._kv_transfer_config.kv_connector_extra_config)
        self.stats = KVSwapStats()  # since the last get_kv_connector_stats
        self.totals = KVSwapStats()  # since start (in-process readers: tests, benchmarks)
        # scheduler side
        self.pool = HostBlockPool(self.capacity)
        self._outgoing: dict[str, tuple[tuple[int, ...], int]] = {}  # preempted this step: blocks, tokens
        self._saves: list[SwapJob] = []
        self._loads: list[SwapJob] = []
        self._evicted: set[str] = set()
        # offloaded prefixes, saved block by block as vLLM reuses their blocks
        self._lazy_owners: dict[str, _LazyPrefix] = {}
        self._lazy_blocks: dict[int, list[tuple[_LazyPrefix, int]]] = {}
        # worker side
        self.mover: KVBlockMover | None = None
        log.info("%s (%s): host pool of %d blocks", CONNECTOR, role.name.lower(), self.capacity)

    def _count(self, key: str, value: float) -> None:
        self.stats.add(key, value)
        self.totals.add(key, value)

    # ---- scheduler side: called by AutellixScheduler ------------------------------------
    def swap_out(self, request: Request, block_ids: tuple[list[int], ...]) -> bool:
        """The request is about to be preempted and its blocks freed: keep them.
        Host rows are placed when the step's metadata is built, all of the
        step's swap-outs as one run (one host transfer). Returns whether the
        request was taken (it has computed tokens in blocks)."""
        computed = request.num_computed_tokens
        if computed <= 0:
            return False
        blocks = math.ceil(computed / self.block_size)
        device = block_ids[0][:blocks]
        if len(device) < blocks:  # fewer blocks than computed tokens: nothing sound to keep
            return False
        self._evicted.discard(request.request_id)
        self._release(request.request_id)  # a stale entry (never restored): replace it
        self._outgoing[request.request_id] = (tuple(device), computed)
        return True

    def _place_outgoing(self) -> None:
        """Host rows for this step's swap-outs: one run if it fits (evicting the
        least recently swapped out), else each request on its own."""
        if not self._outgoing:
            return
        wanted = [(request_id, len(device), tokens) for request_id, (device, tokens) in self._outgoing.items()]
        entries, evicted = self.pool.reserve_run(wanted)
        if entries is None:
            entries = []
            for request_id, blocks, tokens in wanted:
                entry, more = self.pool.reserve(request_id, blocks, tokens)
                evicted += more
                if entry is None:
                    self._count("fallback_no_space", 1)
                else:
                    entries.append(entry)
        self._lost(evicted)
        for entry in entries:
            self._saves.append(SwapJob(entry.request_id, self._outgoing[entry.request_id][0], tuple(entry.rows())))
            self._count("swapped_out", 1)
        self._outgoing.clear()

    def count_resumed(self, resumes: int, recomputed_tokens: int) -> None:
        """From the scheduler's ResumeAccounting: the step's resumed requests."""
        self._count("resumes", resumes)
        self._count("recomputed_tokens", recomputed_tokens)

    def free_rows(self) -> int:
        return self.capacity - self.pool.used

    # ---- scheduler side: paused programs' prefixes (``autellix.engine.kv.retention``) ----------
    def offload_prefix(self, key: str, block_ids: Sequence[int], tokens: int) -> bool:
        """A paused program's held prefix is given up: reserve host rows for its blocks
        under ``key``. Nothing is copied yet: the scheduler releases the blocks with
        :meth:`block_reused` as vLLM's reuse watcher, and a block is saved to its row
        in the step that reuses it (before that step's model runner writes it), so a
        prefix that survives in the prefix cache costs no transfer."""
        if not block_ids or tokens <= 0:
            return False
        self._release(key)
        entry, evicted = self.pool.reserve(key, len(block_ids), tokens)
        self._lost(evicted)
        if entry is None:
            self._count("fallback_no_space", 1)
            return False
        owner = _LazyPrefix(key)
        self._lazy_owners[key] = owner
        for row, block in zip(entry.rows(), block_ids, strict=True):
            self._lazy_blocks.setdefault(block, []).append((owner, row))
        self._count("prefixes_out", 1)
        return True

    def block_reused(self, block: KVCacheBlock) -> None:
        """vLLM hands a released block out again (``BlockPool.unpin_blocks``' watcher): the
        offloaded prefixes it belongs to keep a copy, saved in this step's batch."""
        for owner, row in self._lazy_blocks.pop(block.block_id, ()):
            if owner.alive:
                self._saves.append(SwapJob(owner.key, (block.block_id,), (row,)))
                self._count("prefix_blocks_saved", 1)

    def adopt_prefix(self, key: str, request_id: str, tokens: int) -> bool:
        """The program's next call starts with the first ``tokens`` of the prefix under
        ``key``: the rows become the call's (blocks still to be saved go to them too), and
        vLLM loads what its prefix cache no longer holds, as for a resumed call."""
        entry = self.pool.get(key)
        if entry is None or request_id in self.pool or request_id in self._outgoing:
            return False
        self.pool.rekey(key, request_id, min(tokens, entry.tokens))
        owner = self._lazy_owners.pop(key)
        owner.key = request_id
        self._lazy_owners[request_id] = owner
        self._count("prefixes_adopted", 1)
        return True

    def forget_prefix(self, key: str) -> None:
        self._release(key)

    def _release(self, key: str) -> None:
        """Drop ``key``'s rows (and its blocks' pending saves)."""
        self.pool.release(key)
        owner = self._lazy_owners.pop(key, None)
        if owner is not None:
            owner.alive = False

    def _lost(self, keys: Iterable[str]) -> None:
        """Entries the pool evicted to make room: a preempted call recomputes; a prefix is gone."""
        for key in keys:
            owner = self._lazy_owners.pop(key, None)
            if owner is None:
                self._evicted.add(key)
            else:
                owner.alive = False

    # ---- scheduler side: vLLM's interface ------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        entry = self.pool.get(request.request_id)
        if entry is None:
            return 0, False
        # vLLM must compute at least the last token itself
        usable = min(entry.tokens, request.num_tokens - 1)
        return max(0, usable - num_computed_tokens), False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        request_id = request.request_id
        # preempted and admitted again within one step: it runs on, nothing to keep
        self._outgoing.pop(request_id, None)
        if request_id in self._evicted:
            self._evicted.discard(request_id)
            self._count("fallback_evicted", 1)
        entry = self.pool.get(request_id)
        if entry is None:
            return
        self._release(request_id)
        if num_external_tokens <= 0:
            self._count("prefix_cache_covered", 1)
            return
        # A load is offered only past a block-aligned local hit (vLLM drops a
        # partial local tail when a longer external hit exists), so the local
        # hit ends where get_num_new_matched_tokens started counting.
        end = min(entry.tokens, request.num_tokens - 1)
        local = end - num_external_tokens
        if local % self.block_size:
            raise RuntimeError(f"request {request_id}: local prefix hit {local} is not block-aligned")
        first, last = local // self.block_size, math.ceil(end / self.block_size)
        device = blocks.get_block_ids()[0][first:last]
        self._loads.append(SwapJob(request_id, tuple(device), tuple(entry.rows(first, last))))
        self._count("restored", 1)
        self._count("restored_tokens", num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        self._place_outgoing()
        meta = SwapMetadata(saves=self._saves, loads=self._loads)
        self._saves, self._loads = [], []
        self.pool.end_step()  # after placing: rows this step's loads read stay untouched
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        # finished or aborted while swapped out: its rows are free again
        self._release(request.request_id)
        self._outgoing.pop(request.request_id, None)
        self._evicted.discard(request.request_id)
        return False, None
    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self.mover is not None:
            for direction, counters in self.mover.collect().items():
                for name in ("bytes", "blocks", "transfers", "batches", "seconds"):
                    self._count(f"{direction}_{name}", getattr(counters, name))
        if self.stats.is_empty():
            return None
        out, self.stats = self.stats, KVSwapStats()
        return out

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return KVSwapStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: VllmConfig, metric_types: dict[type[PromMetric], type[PromMetricT]],
                           labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]
                           ) -> KVConnectorPromMetrics | None:
        return KVSwapPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def reset_cache(self) -> bool | None:
        # the swapped-out requests recompute when they resume, as after an eviction
        for key in self.pool.release_all():
            self._lost((key,))
        self._lazy_blocks.clear()
        return True

    # ---- worker side ----------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        tensors = list(kv_caches.values())
        kernel = load_kernel() if tensors and tensors[0].is_cuda else None
        self.mover = KVBlockMover.create(tensors, self.num_blocks, self.capacity, kernel=kernel)
        log.info("%s: %d layers, %d bytes per block row, host pool %.1f MiB, %s path", CONNECTOR, len(tensors),
                 self.mover.row_bytes, self.mover.row_bytes * self.capacity / 2**20,
                 "CUDA kernel" if self.mover.kernel is not None else "torch")

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        # before this step's model runner zeroes or reuses the freed blocks
        if not isinstance(kv_connector_metadata, SwapMetadata) or not kv_connector_metadata.saves:
            return
        assert self.mover is not None
        device, rows = _flatten(kv_connector_metadata.saves)
        self.mover.save(device, rows)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._connector_metadata
        if not isinstance(meta, SwapMetadata) or not meta.loads:
            return
        assert self.mover is not None
        device, rows = _flatten(meta.loads)
        self.mover.load(rows, device)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        return


def _flatten(jobs: Iterable[SwapJob]) -> tuple[list[int], list[int]]:
    device: list[int] = []
    rows: list[int] = []
    for job in jobs:
        device.extend(job.device_blocks)
        rows.extend(job.host_rows)
    return device, rows


def load_kernel() -> object | None:
    """The compiled CUDA gather/scatter (``csrc/``), or None: the torch path then."""
    try:
        from autellix.engine.kv.kernel import load
    except ImportError:
        return None
    try:
        return load()
    except Exception as error:  # a missing toolkit must not stop the engine: torch path
        log.warning("KV swap kernel unavailable (%s); using the torch path", error)
        return None
