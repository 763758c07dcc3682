"""Inside a queue level, calls by their program's arrival instead of their own: measured, not adopted.

    nice -n 10 .venv/bin/python experiments/program_order_within_queue.py

Today each queue of ``core.mlq`` runs its calls first come, first served by
the call's arrival. The alternative tried here orders them by the arrival of
their program (the program's first call at this engine), then by call: least
attained service across queues, first come, first served by program inside
one, so that programs of alike service finish one after another instead of
sharing the engine. It runs the check's points (A100 profile, seeds 1-3) where
that matters with the default and with the alternative (``MultiLevelQueue.add``
patched here, nothing else changed), beside plas and llm-d's rule, and prints
mean / P99 program token latency (ms per token). About 20 minutes of one core.
The whole check with it: docs/results/2026-12-05-rival-and-admission.md.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import autellix.core.mlq as mlq
from autellix.core import SchedulerConfig
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.sweep import CHECK_LOADS, _run

POINTS = ((32, "fanout", 2.0), (32, "mixed", 1.2), (32, "lats", 0.6), (32, "bfcl", 6.0), (32, "sharegpt", 2.0),
          (256, "fanout", 4.0))
#: Low bits of a call's place kept for its own order inside its program.
CALL_BITS = 20


@contextmanager
def program_order() -> Iterator[None]:
    """Calls placed in their queue by their program's first arrival, then their own."""
    original = mlq.MultiLevelQueue.add

    def add(self: mlq.MultiLevelQueue, call_id: Hashable, program_id: str, now: float,
            payload: Any = None) -> mlq.QueuedCall:
        order: dict[str, int] = self.__dict__.setdefault("_program_order", {})
        order.setdefault(program_id, len(order))
        call = original(self, call_id, program_id, now, payload)
        queue = self._queues[call.level]
        queue.discard(call)
        call.entered = (order[program_id] << CALL_BITS) | (call.seq & ((1 << CALL_BITS) - 1))
        queue.insert(call)
        return call

    mlq.MultiLevelQueue.add = add  # type: ignore[method-assign]
    try:
        yield
    finally:
        mlq.MultiLevelQueue.add = original  # type: ignore[method-assign]


def cells(slots: int, workload: str, rate: float, system: str) -> str:
    load = CHECK_LOADS[slots][workload]
    profile = EngineProfile.load("a100-llama3.1-8b").with_overrides(max_num_seqs=slots)
    out = []
    for seed in (1, 2, 3):
        s = _run(workload, load, rate, profile=profile, system=system, engines=1, config=SchedulerConfig(),
                 seed=seed, index=load.rates.index(rate))
        out.append(f"{1e3 * s['mean_token_latency']:.1f} / {1e3 * s['p99_token_latency']:.0f}")
    return ", ".join(out)


def main() -> None:
    print("| point | llmd-fairness | plas | autellix (call order) | autellix (program order) |")
    print("|---|---|---|---|---|")
    for slots, workload, rate in POINTS:
        row = [cells(slots, workload, rate, s) for s in ("llmd-fairness", "plas", "autellix")]
        with program_order():
            row.append(cells(slots, workload, rate, "autellix"))
        print(f"| {slots} slots {workload} {rate}/s | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
