"""Program admission under overload: whether a new program starts now, waits
its turn, or is refused with a Retry-After.

Only *new programs* are held: every call of an admitted program goes straight
to the scheduler, so an admitted program runs to completion. The limit
follows the engines' capacity rather than a fixed count: as many programs
are admitted as their KV working sets fit in ``kv_limit`` times the engines'
KV blocks (``program_limit``), a program's working set being the median
context (prompt and reply tokens of its last call) of recently finished
programs; there is no limit until one has finished. ``kv_limit`` is above 1
because that median overstates what a live program holds: most of them are
between calls, many share their system prompt, and only past about twice
the KV cache does holding programs back pay (below that it lengthens the
tail more than it shortens the mean: the record below). Past the limit a new
program waits in one queue, highest priority class first and first come,
first served within a class, and is admitted as programs finish
(``admit_waiting``), or once it has waited ``max_hold_lives`` times the
median life of recently finished programs, room or not, so that holding
costs no program more than half a typical life. The queue holds at most
``queue_per_slot`` programs per running slot of the pool; past that, and for
a class below zero (sheddable) whenever there is no room, the answer is
refuse, with ``retry_after`` the expected wait at the recent admission rate,
and never more than the longest hold: by then every program waiting now has
been admitted, so the queue has room again.

Why the queue is long (16 per slot): a refused program waits out its
Retry-After and then queues behind the programs that came meanwhile, so a
refusal costs it more than a hold, whose length the longest hold bounds
anyway. Refusing is for overloads past what holding can absorb, and to bound
the gateway's memory; with 4 places per slot, bursts on the CPU engine had
12-19 of 60 programs refused and a P99 1.27x that of no admission
(``docs/results/2026-12-05-admission-queue-length.md``).

Why: when more programs are live than their contexts fit in the KV cache, a
program back from a tool pause finds its prefix evicted and computes it
again, so the more programs run, the less the engines get done; holding new
programs back keeps the live ones' contexts cached
(``docs/results/2026-12-05-rival-and-admission.md``). Holding them on running
slots instead was measured and not adopted: it turns least attained service
into first come, first served among programs of unlike size.

Pure: time and engine loads are arguments; the gateway and the simulator call
it alike.
"""

from __future__ import annotations

import bisect
import enum
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from autellix.core.engine_load import EngineLoad

T = TypeVar("T", int, float)


@dataclass(frozen=True)
class AdmissionParams:
    #: How many times the engines' KV blocks the admitted programs' working sets may fill.
    kv_limit: float = 2.5
    #: Programs that may wait, per running slot of the pool; past that a new program is refused.
    queue_per_slot: float = 16.0
    #: Bounds of the Retry-After given with a refusal (seconds).
    min_retry_after: float = 1.0
    max_retry_after: float = 60.0
    #: Admissions over this many recent seconds give the admission rate (for Retry-After).
    rate_window: float = 60.0
    #: Finished programs whose last contexts give the typical working set.
    footprint_window: int = 64
    #: A waiting program is admitted, room or not, once it has waited this many
    #: times the median life of recently finished programs (None: it waits for room).
    max_hold_lives: float | None = 0.5

    def __post_init__(self) -> None:
        if not self.kv_limit > 0:
            raise ValueError(f"kv_limit: expected a share of the KV blocks > 0, got {self.kv_limit}")
        if self.queue_per_slot < 0:
            raise ValueError(f"queue_per_slot: expected >= 0, got {self.queue_per_slot}")
        if not 0 < self.min_retry_after <= self.max_retry_after:
            raise ValueError("retry-after bounds: expected 0 < min <= max")
        if not self.rate_window > 0:
            raise ValueError(f"rate_window: expected seconds > 0, got {self.rate_window}")
        if self.footprint_window < 1:
            raise ValueError(f"footprint_window: expected >= 1, got {self.footprint_window}")
        if self.max_hold_lives is not None and not self.max_hold_lives > 0:
            raise ValueError(f"max_hold_lives: expected > 0 or None, got {self.max_hold_lives}")


class Verdict(enum.Enum):
    ADMIT = "admit"
    WAIT = "wait"
    REFUSE = "refuse"


@dataclass(frozen=True)
class AdmissionDecision:
    verdict: Verdict
    #: Programs ahead of it in the queue (WAIT).
    position: int | None = None
    #: Seconds the client should wait before it tries again (REFUSE).
    retry_after: float | None = None


class AlreadyKnown(ValueError):
    """The program is already admitted or waiting."""


@dataclass(frozen=True)
class _Waiting:
    program_id: str
    priority: int
    arrived: float


class ProgramAdmission:
    """The admitted programs and the queue of those waiting; time is always passed in."""

    def __init__(self, params: AdmissionParams | None = None) -> None:
        self.params = params or AdmissionParams()
        self._admitted: set[str] = set()
        self._queue: list[_Waiting] = []
        self._recent: deque[float] = deque()
        #: Each admitted program's context (prompt plus reply tokens of its last call).
        self._context: dict[str, int] = {}
        #: The last contexts of recently finished programs, in finishing order and sorted.
        self._footprints: deque[int] = deque()
        self._sorted: list[int] = []
        #: When each admitted program was admitted, and recently finished programs' lives (sorted).
        self._admitted_at: dict[str, float] = {}
        self._lives: deque[float] = deque()
        self._sorted_lives: list[float] = []

    # ---- what it holds ------------------------------------------------------------
    @property
    def admitted(self) -> int:
        return len(self._admitted)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def is_admitted(self, program_id: str) -> bool:
        return program_id in self._admitted

    def waiting_ids(self) -> list[str]:
        """The queue, next to be admitted first."""
        return [w.program_id for w in self._queue]

    # ---- capacity -----------------------------------------------------------------
    def working_set(self) -> int | None:
        """A program's KV working set in tokens: the median last context of
        recently finished programs (None until one has finished)."""
        return self._sorted[len(self._sorted) // 2] if self._sorted else None

    def program_limit(self, engines: Sequence[EngineLoad]) -> int | None:
        """How many programs' working sets fit ``kv_limit`` x the engines' KV
        blocks (None: no limit known yet)."""
        typical = self.working_set()
        if typical is None or not engines:
            return None
        blocks = self.params.kv_limit * sum(load.kv_blocks_total for load in engines)
        per_program = max(1, -(-typical // engines[0].kv_block_size))
        return max(1, math.floor(blocks / per_program))

    def has_room(self, engines: Sequence[EngineLoad]) -> bool:
        limit = self.program_limit(engines)
        return limit is None or len(self._admitted) < limit

    def queue_limit(self, engines: Sequence[EngineLoad]) -> int:
        return math.floor(self.params.queue_per_slot * sum(load.slots for load in engines))

    # ---- decisions ----------------------------------------------------------------
    def arrive(self, program_id: str, now: float, engines: Sequence[EngineLoad], *,
               priority: int = 0) -> AdmissionDecision:
        """A new program asks to start. ``priority``: its class (higher first;
        below zero: sheddable, refused rather than queued when there is no room)."""
        if program_id in self._admitted or (self._queue and any(w.program_id == program_id for w in self._queue)):
            raise AlreadyKnown(program_id)
        ahead = bool(self._queue) and self._queue[0].priority >= priority
        if not ahead and self.has_room(engines):
            self._admit(program_id, now)
            return AdmissionDecision(Verdict.ADMIT)
        if priority < 0 or len(self._queue) >= self.queue_limit(engines):
            return AdmissionDecision(Verdict.REFUSE, retry_after=self.retry_after(now, len(self._queue)))
        position = sum(1 for w in self._queue if w.priority >= priority)
        self._queue.insert(position, _Waiting(program_id, priority, now))
        return AdmissionDecision(Verdict.WAIT, position=position)

    def admit_waiting(self, now: float, engines: Sequence[EngineLoad]) -> list[str]:
        """Admit waiting programs, in queue order, while there is room, and any
        that has waited its longest hold; their ids."""
        out: list[str] = []
        while self._queue and self.has_room(engines):
            entry = self._queue.pop(0)
            self._admit(entry.program_id, now)
            out.append(entry.program_id)
        hold = self.longest_hold()
        if hold is not None:
            for entry in [w for w in self._queue if now - w.arrived >= hold]:
                self._queue.remove(entry)
                self._admit(entry.program_id, now)
                out.append(entry.program_id)
        return out

    def longest_hold(self) -> float | None:
        """Seconds a program may wait: ``max_hold_lives`` x the median life of
        recently finished programs (None: no bound, or none finished yet)."""
        if self.params.max_hold_lives is None or not self._sorted_lives:
            return None
        return self.params.max_hold_lives * self._sorted_lives[len(self._sorted_lives) // 2]

    def _admit(self, program_id: str, now: float) -> None:
        self._admitted.add(program_id)
        self._admitted_at[program_id] = now
        self._recent.append(now)
        self._forget_admissions_before(now - self.params.rate_window)

    def _forget_admissions_before(self, since: float) -> None:
        while self._recent and self._recent[0] < since:
            self._recent.popleft()

    def context(self, program_id: str, tokens: int) -> None:
        """An admitted program's call finished with this many tokens of context
        (its prompt and reply): what its next call's KV starts from."""
        if tokens < 0:
            raise ValueError(f"context: expected tokens >= 0, got {tokens}")
        if program_id in self._admitted:
            self._context[program_id] = tokens

    def leave(self, program_id: str, now: float | None = None) -> bool:
        """The program ended (admitted; ``now``: when, so its life counts) or
        gave up (waiting); False if it was neither."""
        if program_id in self._admitted:
            self._admitted.discard(program_id)
            admitted_at = self._admitted_at.pop(program_id)
            last = self._context.pop(program_id, None)
            if last is not None:
                _slide(self._footprints, self._sorted, last, self.params.footprint_window)
            if now is not None:
                _slide(self._lives, self._sorted_lives, now - admitted_at, self.params.footprint_window)
            return True
        for i, entry in enumerate(self._queue):
            if entry.program_id == program_id:
                del self._queue[i]
                return True
        return False

    def retry_after(self, now: float, ahead: int) -> float:
        """Seconds until ``ahead`` waiting programs and this one would have been
        admitted at the recent admission rate, within the configured bounds and
        no longer than the longest hold (when one is known)."""
        window = self.params.rate_window
        self._forget_admissions_before(now - window)
        longest = self.params.max_retry_after
        hold = self.longest_hold()
        if hold is not None:
            longest = max(self.params.min_retry_after, min(longest, hold))
        if not self._recent:
            return longest
        rate = len(self._recent) / window
        return min(longest, max(self.params.min_retry_after, (ahead + 1) / rate))


def _slide(window: deque[T], ordered: list[T], value: T, size: int) -> None:
    """Add ``value`` to a window of the last ``size`` values, kept also in sorted order."""
    if len(window) == size:
        del ordered[bisect.bisect_left(ordered, window.popleft())]
    window.append(value)
    bisect.insort(ordered, value)


__all__ = ["AdmissionDecision", "AdmissionParams", "AlreadyKnown", "ProgramAdmission", "Verdict"]
