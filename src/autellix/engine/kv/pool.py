"""Bookkeeping for swapped-out KV, free of vLLM and torch (unit-tested directly).

* :class:`HostBlockPool`: which host rows hold which preempted request's blocks
  (or which paused program's prefix, until its next call takes them: ``rekey``).
  Bounded (``capacity`` rows, fixed at start), least recently swapped out
  evicted first, each request's blocks one contiguous run of rows (so its swap
  is one host transfer). A request that does not fit even in an empty pool is
  refused: it falls back to vLLM's recompute.
* :class:`ResumeAccounting`: how many already-computed tokens a preempted
  request had to compute again when it resumed, from vLLM's own
  ``num_computed_tokens`` (the number the issue asks to drive down).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PoolEntry:
    """A preempted request's blocks in the host pool: rows ``start .. start+blocks-1``
    hold its first ``blocks`` KV blocks, covering ``tokens`` computed tokens."""

    request_id: str
    start: int
    blocks: int
    tokens: int

    def rows(self, first_block: int = 0, end_block: int | None = None) -> list[int]:
        end = self.blocks if end_block is None else end_block
        return list(range(self.start + first_block, self.start + end))


@dataclass
class HostBlockPool:
    capacity: int
    _entries: OrderedDict[str, PoolEntry] = field(default_factory=OrderedDict)
    _free: list[tuple[int, int]] = field(default_factory=list)  # sorted (start, length), merged
    _deferred: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.capacity, int) or isinstance(self.capacity, bool) or self.capacity < 0:
            raise ValueError(f"host pool capacity must be an integer >= 0 blocks, got {self.capacity!r}")
        if self.capacity:
            self._free = [(0, self.capacity)]

    # ---- queries --------------------------------------------------------------------
    def get(self, request_id: str) -> PoolEntry | None:
        return self._entries.get(request_id)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def used(self) -> int:
        """Rows held by entries or waiting to be freed at the end of the step."""
        return self.capacity - sum(length for _, length in self._free)

    # ---- changes --------------------------------------------------------------------
    def reserve(self, request_id: str, blocks: int, tokens: int) -> tuple[PoolEntry | None, list[str]]:
        """Rows for a request's blocks. Evicts the least recently swapped-out
        entries until a contiguous run fits. Returns (entry or None when the
        request is larger than the whole pool, ids evicted to make room)."""
        entries, evicted = self.reserve_run([(request_id, blocks, tokens)])
        return (entries[0] if entries else None), evicted

    def reserve_run(self, requests: list[tuple[str, int, int]]) -> tuple[list[PoolEntry] | None, list[str]]:
        """Rows for several requests' blocks, ``(id, blocks, tokens)`` each, as
        one contiguous run in that order (so one step's swap-outs are one host
        transfer). None when the run cannot fit even with every entry evicted."""
        ids = [request_id for request_id, _, _ in requests]
        if not requests or len(set(ids)) != len(ids):
            raise ValueError(f"expected distinct requests, got {ids}")
        for request_id, blocks, tokens in requests:
            if blocks <= 0 or tokens <= 0:
                raise ValueError(f"nothing to reserve for {request_id!r}: {blocks} blocks, {tokens} tokens")
            if request_id in self._entries:
                raise ValueError(f"request {request_id!r} already holds host rows")
        total = sum(blocks for _, blocks, _ in requests)
        # Rows released this step are still being read (loads run after saves
        # in a step), so only the runs between them can be had, by evicting.
        if total > self._largest_run_outside_deferred():
            return None, []
        evicted: list[str] = []
        start = self._first_fit(total)
        while start is None:
            victim = next(iter(self._entries))  # least recently swapped out
            self._drop(victim, deferred=False)
            evicted.append(victim)
            start = self._first_fit(total)
        self._take(start, total)
        entries = []
        for request_id, blocks, tokens in requests:
            entry = PoolEntry(request_id, start, blocks, tokens)
            self._entries[request_id] = entry
            entries.append(entry)
            start += blocks
        return entries, evicted

    def rekey(self, old_id: str, new_id: str, tokens: int) -> PoolEntry:
        """Hand ``old_id``'s rows to ``new_id``, covering its first ``tokens`` tokens
        (a paused program's offloaded prefix, taken by the program's next call)."""
        if new_id in self._entries:
            raise ValueError(f"request {new_id!r} already holds host rows")
        entry = self._entries.pop(old_id)
        if not 0 < tokens <= entry.tokens:
            self._entries[old_id] = entry
            raise ValueError(f"{new_id!r} can take 1 to {entry.tokens} tokens of {old_id!r}, not {tokens}")
        moved = PoolEntry(new_id, entry.start, entry.blocks, tokens)
        self._entries[new_id] = moved
        return moved

    def release(self, request_id: str) -> PoolEntry | None:
        """Drop a request's entry (restored, finished or no longer needed). Its
        rows become free at the next :meth:`end_step`: a load issued this step
        may still read them after this step's saves."""
        return self._drop(request_id, deferred=True) if request_id in self._entries else None

    def release_all(self) -> list[str]:
        """Drop every entry (rows free at the next :meth:`end_step`); returns their ids."""
        ids = list(self._entries)
        for request_id in ids:
            self._drop(request_id, deferred=True)
        return ids

    def end_step(self) -> None:
        for start, length in self._deferred:
            self._give(start, length)
        self._deferred = []

    # ---- extents --------------------------------------------------------------------
    def _drop(self, request_id: str, *, deferred: bool) -> PoolEntry:
        entry = self._entries.pop(request_id)
        if deferred:
            self._deferred.append((entry.start, entry.blocks))
        else:
            self._give(entry.start, entry.blocks)
        return entry

    def _largest_run_outside_deferred(self) -> int:
        largest, at = 0, 0
        for start, length in sorted(self._deferred):
            largest = max(largest, start - at)
            at = start + length
        return max(largest, self.capacity - at)

    def _first_fit(self, blocks: int) -> int | None:
        for start, length in self._free:
            if length >= blocks:
                return start
        return None

    def _take(self, start: int, blocks: int) -> None:
        i = next(i for i, (s, _) in enumerate(self._free) if s == start)
        s, length = self._free[i]
        if length == blocks:
            del self._free[i]
        else:
            self._free[i] = (s + blocks, length - blocks)

    def _give(self, start: int, length: int) -> None:
        i = bisect.bisect_left(self._free, (start, 0))
        self._free.insert(i, (start, length))
        merged: list[tuple[int, int]] = []
        for s, n in self._free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((s, n))
        self._free = merged

    def check(self) -> None:
        """Invariant (tests): entries, deferred and free rows tile [0, capacity) exactly once."""
        spans = sorted([(e.start, e.blocks) for e in self._entries.values()] + self._deferred + self._free)
        at = 0
        for s, n in spans:
            if s != at or n <= 0:
                raise AssertionError(f"pool rows not tiled at {at}: {spans}")
            at = s + n
        if at != self.capacity:
            raise AssertionError(f"pool rows end at {at}, capacity {self.capacity}")


@dataclass
class ResumeAccounting:
    """Tokens recomputed after preemption, from vLLM's ``num_computed_tokens``.

    At preemption a request had computed ``c`` tokens (vLLM resets that to 0).
    When it is scheduled again it starts from ``h`` computed tokens (prefix-cache
    hit plus whatever a KV connector loaded); the model must compute ``c - h``
    tokens it had already computed once.
    """

    preempted: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    resumes: int = 0
    recomputed_tokens: int = 0
    kept_tokens: int = 0

    def preempting(self, request_id: str, computed_tokens: int) -> None:
        self.preemptions += 1
        if computed_tokens > 0:
            self.preempted[request_id] = computed_tokens

    def scheduled(self, num_scheduled_tokens: Mapping[str, int], requests: Mapping[str, Any]) -> int:
        """After a step was scheduled (vLLM has already advanced
        ``num_computed_tokens`` by the scheduled tokens). Returns the tokens
        recomputed by requests resumed in this step."""
        if not self.preempted:
            return 0
        recomputed = 0
        for request_id in [r for r in self.preempted if r in num_scheduled_tokens]:
            before = self.preempted.pop(request_id)
            request = requests.get(request_id)
            if request is None:
                continue
            start = request.num_computed_tokens - num_scheduled_tokens[request_id]
            self.resumes += 1
            recomputed += max(0, before - start)
            self.kept_tokens += min(before, start)
        self.recomputed_tokens += recomputed
        return recomputed

    def forget(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self.preempted.pop(request_id, None)
