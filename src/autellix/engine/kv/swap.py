"""Batched KV-block gather/scatter: one request's (or many requests') KV blocks,
across all layers, moved to and from a host pool in one batch.

vLLM keeps one paged KV tensor per attention layer. Seen through
:func:`block_views`, each is ``(outer, num_blocks, inner)``: ``outer`` is what
sits in front of the block dimension (1 for the CPU backend's and the offloading
connector's block-first layout, 2 for FlashAttention's ``(2, blocks, ...)``),
``inner`` is one block of one layer. A host *row* holds one block of every layer:
``(layers, outer, inner)``, so the blocks of a swap are one contiguous slice of
host memory.

This module is the semantics, in pure torch, and the path used without CUDA
(the CPU engine): :func:`gather_blocks` / :func:`scatter_blocks`. The CUDA
kernel in ``csrc/kv_swap.cu`` does the same in one launch into a device staging
buffer, which then goes to pinned host memory in one copy per contiguous host
run (one per step). :func:`gather_blocks_per_block` is the per-block
reference the tests check both against (and the pattern a per-block swap
issues: one copy per block per layer per ``outer``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch


def block_views(kv_caches: Sequence[torch.Tensor], num_blocks: int) -> list[torch.Tensor]:
    """Views ``(outer, num_blocks, inner)`` of per-layer paged KV tensors.

    The block dimension is the first of size ``num_blocks`` among the first two
    (vLLM's layouts put it there). Every layer must have the same shape and
    dtype, and be contiguous, so a view (not a copy) is returned: writes
    through it land in the cache.
    """
    if not kv_caches:
        raise ValueError("no KV cache tensors")
    first = kv_caches[0]
    for t in kv_caches:
        if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
            raise ValueError(f"KV layers differ: {tuple(t.shape)} {t.dtype} vs {tuple(first.shape)} {first.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"KV layer of shape {tuple(t.shape)} is not contiguous")
    dims = [d for d in range(min(2, first.dim())) if first.shape[d] == num_blocks]
    if not dims:
        raise ValueError(f"no block dimension of size {num_blocks} in KV shape {tuple(first.shape)}")
    d = dims[0]
    outer = 1
    for size in first.shape[:d]:
        outer *= size
    inner = first.numel() // (outer * num_blocks)
    return [t.view(outer, num_blocks, inner) for t in kv_caches]


def row_shape(views: Sequence[torch.Tensor]) -> tuple[int, int, int]:
    """Shape of one host row: one block of every layer."""
    outer, _, inner = views[0].shape
    return (len(views), outer, inner)


def _check_ids(views: Sequence[torch.Tensor], block_ids: torch.Tensor, *, unique: bool) -> torch.Tensor:
    if block_ids.dim() != 1:
        raise ValueError(f"block ids must be 1-D, got shape {tuple(block_ids.shape)}")
    if block_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"block ids must be integers, got {block_ids.dtype}")
    num_blocks = views[0].shape[1]
    if block_ids.numel():
        lo, hi = int(block_ids.min()), int(block_ids.max())
        if lo < 0 or hi >= num_blocks:
            raise ValueError(f"block id out of range [0, {num_blocks}): min {lo}, max {hi}")
        if unique and torch.unique(block_ids).numel() != block_ids.numel():
            raise ValueError("scatter block ids must be distinct")
    return block_ids.to(device=views[0].device, dtype=torch.int64)


def gather_blocks(views: Sequence[torch.Tensor], block_ids: torch.Tensor,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """The KV of ``block_ids`` across all layers as rows ``(n, layers, outer, inner)``:
    row i is block ``block_ids[i]``. Written into ``out`` when given (e.g. a run
    of host-pool rows), else into a new contiguous tensor."""
    ids = _check_ids(views, block_ids, unique=False)
    shape = (ids.numel(), *row_shape(views))
    if out is None:
        out = torch.empty(shape, dtype=views[0].dtype, device=views[0].device)
    elif tuple(out.shape) != shape or out.dtype != views[0].dtype or out.device != views[0].device:
        raise ValueError(f"out is {tuple(out.shape)} {out.dtype} on {out.device}, expected {shape} {views[0].dtype}")
    for layer, v in enumerate(views):
        for o in range(v.shape[0]):
            # one pass, straight into the (strided) destination
            torch.index_select(v[o], 0, ids, out=out[:, layer, o])
    return out


def scatter_blocks(views: Sequence[torch.Tensor], block_ids: torch.Tensor, rows: torch.Tensor) -> None:
    """Write ``rows`` (as :func:`gather_blocks` returns them) back into blocks
    ``block_ids`` of every layer. Checks everything before writing anything."""
    ids = _check_ids(views, block_ids, unique=True)
    expected = (ids.numel(), *row_shape(views))
    if tuple(rows.shape) != expected:
        raise ValueError(f"rows have shape {tuple(rows.shape)}, expected {expected}")
    if rows.dtype != views[0].dtype:
        raise ValueError(f"rows are {rows.dtype}, KV cache is {views[0].dtype}")
    rows = rows.to(views[0].device)
    for layer, v in enumerate(views):
        for o in range(v.shape[0]):
            v[o].index_copy_(0, ids, rows[:, layer, o])


def gather_blocks_per_block(views: Sequence[torch.Tensor], block_ids: Sequence[int]) -> torch.Tensor:
    """Reference: one copy per block, per layer, per ``outer`` slice."""
    out = torch.empty((len(block_ids), *row_shape(views)), dtype=views[0].dtype, device=views[0].device)
    for i, b in enumerate(block_ids):
        for layer, v in enumerate(views):
            for o in range(v.shape[0]):
                out[i, layer, o].copy_(v[o, b])
    return out


def contiguous_runs(rows: Sequence[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive values: ``(position in rows, first row, length)``.
    A swap batch goes to host memory in one transfer per run."""
    runs: list[tuple[int, int, int]] = []
    for i, r in enumerate(rows):
        if runs and runs[-1][1] + runs[-1][2] == r:
            pos, first, length = runs[-1]
            runs[-1] = (pos, first, length + 1)
        else:
            runs.append((i, r, 1))
    return runs


@dataclass
class MoveCounters:
    """What one direction of swapping moved (worker side)."""

    bytes: int = 0
    blocks: int = 0
    transfers: int = 0
    batches: int = 0
    seconds: float = 0.0

    def add(self, other: MoveCounters) -> None:
        self.bytes += other.bytes
        self.blocks += other.blocks
        self.transfers += other.transfers
        self.batches += other.batches
        self.seconds += other.seconds


@dataclass
class _PendingTiming:
    direction: str
    start: object
    end: object


@dataclass
class KVBlockMover:
    """Moves KV blocks between the paged device cache and a host pool of rows.

    ``save(device blocks, host rows)`` and ``load(host rows, device blocks)``
    each move one batch: on CUDA one gather/scatter kernel launch plus one
    host<->device copy per contiguous run of host rows; elsewhere the torch
    reference (the device is host memory already). The host pool is pinned
    when the cache is on CUDA.
    """

    views: list[torch.Tensor]
    host: torch.Tensor
    kernel: object | None = None  # the compiled csrc extension, on CUDA
    #: device staging bound (rows): a larger swap goes in pieces, one transfer each
    staging_rows: int = 1024
    counters: dict[str, MoveCounters] = field(default_factory=lambda: {"out": MoveCounters(), "in": MoveCounters()})
    _pending: list[_PendingTiming] = field(default_factory=list)
    _ptrs: torch.Tensor | None = None
    _staging_buffer: torch.Tensor | None = None

    @classmethod
    def create(cls, kv_caches: Sequence[torch.Tensor], num_blocks: int, host_rows: int,
               kernel: object | None = None, staging_bytes: int = 256 << 20) -> KVBlockMover:
        if host_rows < 0:
            raise ValueError(f"host pool size must be >= 0 blocks, got {host_rows}")
        if staging_bytes <= 0:
            raise ValueError(f"staging buffer must be > 0 bytes, got {staging_bytes}")
        views = block_views(kv_caches, num_blocks)
        on_cuda = views[0].device.type == "cuda"
        host = torch.empty((host_rows, *row_shape(views)), dtype=views[0].dtype, pin_memory=on_cuda and host_rows > 0)
        row_bytes = views[0][:, 0].numel() * len(views) * views[0].element_size()
        return cls(views=views, host=host, kernel=kernel if on_cuda else None,
                   staging_rows=max(1, staging_bytes // row_bytes))

    @property
    def row_bytes(self) -> int:
        return self.host[0].numel() * self.host.element_size() if self.host.shape[0] else 0

    def _validated(self, block_ids: Sequence[int], host_rows: Sequence[int], *, unique: bool) -> torch.Tensor | None:
        """The block ids as a tensor after every check (None: nothing to move)."""
        if len(block_ids) != len(host_rows):
            raise ValueError(f"{len(block_ids)} blocks but {len(host_rows)} host rows")
        if not block_ids:
            return None
        cap = self.host.shape[0]
        bad = [r for r in host_rows if not 0 <= r < cap]
        if bad:
            raise ValueError(f"host rows out of range [0, {cap}): {bad[:5]}")
        ids = torch.tensor(block_ids, dtype=torch.int64)
        _check_ids(self.views, ids, unique=unique)
        return ids

    def save(self, block_ids: Sequence[int], host_rows: Sequence[int]) -> None:
        """Copy device blocks ``block_ids`` into host rows ``host_rows`` (same order)."""
        self._move("out", block_ids, host_rows, self._save_piece)

    def load(self, host_rows: Sequence[int], block_ids: Sequence[int]) -> None:
        """Copy host rows ``host_rows`` into device blocks ``block_ids`` (same order)."""
        self._move("in", block_ids, host_rows, self._load_piece)

    def _move(self, direction: str, block_ids: Sequence[int], host_rows: Sequence[int],
              piece: Callable[[torch.Tensor, list[tuple[int, int, int]]], None]) -> None:
        """One batch either way, timed and counted: ``piece`` moves each piece of at most
        ``staging_rows`` blocks, one transfer per contiguous run of its host rows."""
        # Loads take unique ids only: two host rows scattered into one block would race.
        ids = self._validated(block_ids, host_rows, unique=direction == "in")
        if ids is None:
            return
        timer = self._start()
        transfers = 0
        for lo, hi in self._chunks(len(block_ids)):
            runs = contiguous_runs(host_rows[lo:hi])
            piece(ids[lo:hi], runs)
            transfers += len(runs)
        self._stop(direction, timer, len(block_ids), transfers)

    def _save_piece(self, ids: torch.Tensor, runs: list[tuple[int, int, int]]) -> None:
        if self.views[0].device.type == "cpu":  # the cache is host memory already: gather in place
            for pos, first, length in runs:
                gather_blocks(self.views, ids[pos:pos + length], out=self.host[first:first + length])
            return
        staging = self._gather(ids)
        for pos, first, length in runs:
            self.host[first:first + length].copy_(staging[pos:pos + length], non_blocking=True)

    def _load_piece(self, ids: torch.Tensor, runs: list[tuple[int, int, int]]) -> None:
        if self.views[0].device.type == "cpu":
            for pos, first, length in runs:
                scatter_blocks(self.views, ids[pos:pos + length], self.host[first:first + length])
            return
        staging = self._staging(ids.numel())
        for pos, first, length in runs:
            staging[pos:pos + length].copy_(self.host[first:first + length], non_blocking=True)
        self._scatter(ids, staging)

    def _chunks(self, n: int) -> list[tuple[int, int]]:
        """A batch in pieces of at most ``staging_rows`` (one piece unless the
        batch is larger than the staging buffer)."""
        step = max(1, self.staging_rows)
        return [(lo, min(n, lo + step)) for lo in range(0, n, step)]

    def _staging(self, n: int) -> torch.Tensor:
        """Device staging rows, reused: the copies that read or fill it are
        ordered on the same stream as the kernels."""
        v = self.views[0]
        if self._staging_buffer is None or self._staging_buffer.shape[0] < n:
            self._staging_buffer = torch.empty((min(self.staging_rows, max(n, 1)), *row_shape(self.views)),
                                               dtype=v.dtype, device=v.device)
        return self._staging_buffer[:n]

    def _gather(self, ids: torch.Tensor) -> torch.Tensor:
        if self.kernel is None:
            return gather_blocks(self.views, ids)
        v = self.views[0]
        out = self._staging(ids.numel())
        stream = torch.cuda.current_stream(v.device).cuda_stream
        self.kernel.gather_kv_blocks(self._layer_ptrs(), ids.to(v.device, non_blocking=True), out,  # type: ignore[attr-defined]
                                     v.shape[1], self._base_alignment(), stream)
        return out

    def _scatter(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        if self.kernel is None:
            scatter_blocks(self.views, ids, rows)
            return
        v = self.views[0]
        stream = torch.cuda.current_stream(v.device).cuda_stream
        self.kernel.scatter_kv_blocks(self._layer_ptrs(), ids.to(v.device, non_blocking=True), rows,  # type: ignore[attr-defined]
                                      v.shape[1], self._base_alignment(), stream)

    # ---- CUDA path ------------------------------------------------------------------
    def _layer_ptrs(self) -> torch.Tensor:
        if self._ptrs is None:
            self._ptrs = torch.tensor([v.data_ptr() for v in self.views], dtype=torch.int64,
                                      device=self.views[0].device)
        return self._ptrs

    def _base_alignment(self) -> int:
        """Largest power of two (up to 16) dividing every layer's base address."""
        bits = 16
        for v in self.views:
            bits |= v.data_ptr()
        return bits & -bits

    # ---- timing -----------------------------------------------------------------------
    def _start(self) -> object:
        if self.views[0].device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            return start
        return time.perf_counter()

    def _stop(self, direction: str, start: object, blocks: int, transfers: int) -> None:
        c = self.counters[direction]
        c.blocks += blocks
        c.bytes += blocks * self.row_bytes
        c.transfers += transfers
        c.batches += 1
        if isinstance(start, float):
            c.seconds += time.perf_counter() - start
        else:  # resolved later without stalling the step (collect)
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append(_PendingTiming(direction, start, end))

    def collect(self) -> dict[str, MoveCounters]:
        """Counters since the last call (then reset). Swap time of GPU batches
        whose copies have not finished yet is carried to a later call."""
        still: list[_PendingTiming] = []
        for p in self._pending:
            if p.end.query():  # type: ignore[attr-defined]
                self.counters[p.direction].seconds += p.start.elapsed_time(p.end) / 1e3  # type: ignore[attr-defined]
            else:
                still.append(p)
        self._pending = still
        out = self.counters
        self.counters = {"out": MoveCounters(), "in": MoveCounters()}
        return out
