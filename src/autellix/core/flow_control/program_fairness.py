"""llm-d's ``program-aware-fairness`` flow-control policy (strategy ``las``):
per-program FIFO queues at the gateway, and which program's head request to
dispatch next.

Written from the policy's public description (llm-d/llm-d-router,
``pkg/epp/framework/plugins/flowcontrol/fairness/program-aware/README.md``
and its LAS strategy); every number is its default:

* a program's attained service is weighted tokens: prompt tokens x 1 plus
  completion tokens x 2, from each finished request's usage
  (``input_weight``, ``output_weight``);
* it decays in wall-clock time with a half-life of 60 s, lazily, whenever it
  is read or added to (``half_life``); what an in-flight request consumed is
  added, undecayed, when it completes;
* among the programs with a non-empty queue, each gets the score
  ``0.8 x (1 - norm(service)) + 0.2 x norm(head wait)`` where ``norm`` is
  min-max normalisation over those programs (0.5 when all are equal) and head
  wait is how long the queue's oldest request has waited
  (``weight_service``, ``weight_head_wait``); the best score is dispatched;
* requests within a program's queue are first come, first served (the
  default ordering policy).

Ties (which llm-d leaves to Go's map order) go to the queue whose head came
first, so that runs are deterministic. Which requests wait at all
is the saturation detector's (``saturation``); this module only orders them.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class FairnessParams:
    """The policy's parameters, llm-d's defaults."""

    weight_service: float = 0.8
    weight_head_wait: float = 0.2
    #: Seconds for a program's attained service to halve (``lasHalfLifeSeconds``).
    half_life: float = 60.0
    input_weight: float = 1.0
    output_weight: float = 2.0
    #: A program with no request queued or in flight and none finished for this
    #: long is forgotten (``evictionTtlSeconds``).
    eviction_ttl: float = 3600.0

    def __post_init__(self) -> None:
        if self.weight_service < 0 or self.weight_head_wait < 0:
            raise ValueError("fairness weights must be >= 0")
        if not self.half_life > 0:
            raise ValueError(f"half_life: expected seconds > 0, got {self.half_life}")


@dataclass
class _Program(Generic[T]):
    #: (enqueued at, enqueue order, request)
    queue: deque[tuple[float, int, T]]
    #: Attained service at ``anchor`` (weighted tokens).
    service: float = 0.0
    anchor: float = 0.0
    in_flight: int = 0
    last_seen: float = 0.0


class ProgramFairQueues(Generic[T]):
    """Requests (any ``T``) waiting at the gateway, one FIFO per program, and
    each program's decayed attained service."""

    def __init__(self, params: FairnessParams | None = None) -> None:
        self.params = params or FairnessParams()
        self._programs: dict[str, _Program[T]] = {}
        #: Programs with a request waiting (a pick looks at these only).
        self._waiting: set[str] = set()
        self._queued = 0
        self._order = itertools.count()

    def __len__(self) -> int:
        """Requests waiting, over all programs."""
        return self._queued

    def _program(self, program_id: str, now: float) -> _Program[T]:
        program = self._programs.get(program_id)
        if program is None:
            program = self._programs[program_id] = _Program(deque(), anchor=now, last_seen=now)
        return program

    def service(self, program_id: str, now: float) -> float:
        """The program's attained service at ``now`` (0 for a program never seen)."""
        program = self._programs.get(program_id)
        return 0.0 if program is None else self._decayed(program, now)

    def _decayed(self, program: _Program[T], now: float) -> float:
        if now > program.anchor:
            program.service *= math.pow(0.5, (now - program.anchor) / self.params.half_life)
            program.anchor = now
        return program.service

    def push(self, program_id: str, item: T, now: float) -> None:
        """A request of ``program_id`` starts waiting."""
        program = self._program(program_id, now)
        program.queue.append((now, next(self._order), item))
        program.last_seen = now
        self._waiting.add(program_id)
        self._queued += 1

    def pick(self, now: float) -> tuple[str, T] | None:
        """Take the head request of the best-scoring program (None: nothing waits);
        the request counts as in flight until ``completed``."""
        waiting = [(pid, self._programs[pid]) for pid in self._waiting]
        if not waiting:
            return None
        services = {pid: self._decayed(p, now) for pid, p in waiting}
        waits = {pid: now - p.queue[0][0] for pid, p in waiting}
        lo_s, hi_s = min(services.values()), max(services.values())
        lo_w, hi_w = min(waits.values()), max(waits.values())
        weights = self.params

        def score(entry: tuple[str, _Program[T]]) -> tuple[float, int]:
            pid, program = entry
            return (weights.weight_service * (1.0 - _normalized(services[pid], lo_s, hi_s))
                    + weights.weight_head_wait * _normalized(waits[pid], lo_w, hi_w), -program.queue[0][1])

        best_id, best = max(waiting, key=score)
        _, _, item = best.queue.popleft()
        if not best.queue:
            self._waiting.discard(best_id)
        best.in_flight += 1
        self._queued -= 1
        return best_id, item

    def completed(self, program_id: str, now: float, *, prompt_tokens: int, completion_tokens: int) -> None:
        """A dispatched request of ``program_id`` finished with this usage."""
        program = self._program(program_id, now)
        program.in_flight = max(0, program.in_flight - 1)
        cost = self.params.input_weight * prompt_tokens + self.params.output_weight * completion_tokens
        program.service = self._decayed(program, now) + cost
        program.last_seen = now

    def withdraw(self, program_id: str, item: T) -> bool:
        """Take a waiting request out (its client went away); False if it was not waiting."""
        program = self._programs.get(program_id)
        if program is None:
            return False
        for entry in program.queue:
            if entry[2] is item:
                program.queue.remove(entry)
                if not program.queue:
                    self._waiting.discard(program_id)
                self._queued -= 1
                return True
        return False

    def evict_idle(self, now: float) -> list[str]:
        """Forget programs with nothing queued or in flight and no activity for
        ``eviction_ttl`` seconds; their ids."""
        gone = [pid for pid, p in self._programs.items()
                if not p.queue and p.in_flight == 0 and now - p.last_seen >= self.params.eviction_ttl]
        for pid in gone:
            del self._programs[pid]
        return gone


def _normalized(value: float, lo: float, hi: float) -> float:
    """Min-max normalisation to [0, 1]; 0.5 when every value is equal (no signal)."""
    return 0.5 if hi == lo else (value - lo) / (hi - lo)


__all__ = ["FairnessParams", "ProgramFairQueues"]
