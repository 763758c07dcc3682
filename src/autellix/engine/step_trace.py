"""Every engine step, as the scheduler saw it: what each batch held and how long it took.

The simulator's step cost model is fitted from controlled batches timed at the
client (``autellix.sim.profiling``). Whether it holds under a benchmark's load,
where batches mix prefills, decodes and admissions, only the engine's own steps
can say. With ``AUTELLIX_STEP_TRACE=<path>`` in the engine's environment, the
scheduler appends one JSON line per step to ``<path>``:

``[t0, t1, t2, t3, prefill_tokens, decode_seqs, kv_tokens, new_requests, cached_tokens, running, waiting, idle]``

``t0``/``t1``: ``schedule()`` entered and returned; ``t2``/``t3``:
``update_from_output()`` entered and returned (``time.monotonic()``, the
engine process's clock). Between ``t1`` and ``t2`` the model ran (the loop is
synchronous on CPU and under the plugin); from ``t3`` to the next ``t0`` the
engine core hands outputs to the API server. The batch measures are the cost
model's (``autellix.sim.cost_model``): tokens of prompts (or recomputed
context) scheduled, sequences decoding one token, KV tokens the step's
attention reads, requests admitted from waiting, and prompt tokens served
from the prefix cache to the admitted ones; ``running``/``waiting`` as the
step was scheduled, ``idle`` 1 when the step left no request (the gap to the
next step is then the engine waiting for work, not part of a step).

``autellix.engine.scheduler.TracedScheduler`` is stock vLLM's scheduler (FCFS
or priority, as the engine's ``--scheduling-policy`` says) with the trace and
nothing else, for the systems that run without the plugin; ``AutellixScheduler``
traces the same way. This module imports nothing of vLLM's, so the benchmark
can read traces without it.
``autellix bench sweep --trace-steps`` runs a benchmark with the trace on, and
``experiments/engine_steps_vs_profile.py`` compares its steps with the profile's cost and with
the simulator's steps.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

ENV_TRACE = "AUTELLIX_STEP_TRACE"
#: Fields of a trace line, in order.
FIELDS = ("t0", "t1", "t2", "t3", "prefill_tokens", "decode_seqs", "kv_tokens", "new_requests", "cached_tokens",
          "running", "waiting", "idle")


def batch_measures(scheduled: Mapping[str, int], requests: Mapping[str, Any]) -> tuple[int, int, int]:
    """(prefill tokens, decoding sequences, KV tokens read) of a batch just
    scheduled: vLLM has already advanced each request's ``num_computed_tokens``
    by its scheduled tokens. A request decodes when it is scheduled one token,
    the last it has, after its first output (``autellix.sim.engine_model``
    counts the same way)."""
    prefill = decode = kv = 0
    for rid, n in scheduled.items():
        request = requests[rid]
        computed = request.num_computed_tokens
        if n == 1 and request.num_output_tokens > 0 and computed == request.num_tokens:
            decode += 1
        else:
            prefill += n
        kv += computed
    return prefill, decode, kv


class StepTrace:
    """Buffered JSON lines, one a step; the buffer is written at least every
    ``flush_s`` seconds of steps (so a kept engine's trace is complete a moment
    after its run, with no shutdown to wait for)."""

    def __init__(self, path: Path, flush_s: float = 0.5) -> None:
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self._rows: list[list[float]] = []
        self._flush_s = flush_s
        self._flushed = time.monotonic()
        self._pending: list[float] | None = None

    @classmethod
    def from_env(cls) -> StepTrace | None:
        path = os.environ.get(ENV_TRACE)
        return cls(Path(path)) if path else None

    def scheduled(self, t0: float, output: Any, requests: Mapping[str, Any], running: int, waiting: int) -> None:
        t1 = time.monotonic()
        prefill, decode, kv = batch_measures(output.num_scheduled_tokens, requests)
        new = output.scheduled_new_reqs
        # built before vLLM advanced the request: what the prefix cache (or a resume) already held
        cached = sum(r.num_computed_tokens for r in new)
        self._pending = [t0, t1, 0.0, 0.0, prefill, decode, kv, len(new), cached, running, waiting]

    def updated(self, t2: float, *, idle: bool) -> None:
        """The step's outputs are applied; ``idle``: no request is left, so the
        trace is written now (the run it closes is complete on disk)."""
        row, self._pending = self._pending, None
        if row is None:  # an update with nothing scheduled through us
            return
        row[2], row[3] = t2, time.monotonic()
        row.append(int(idle))
        self._rows.append(row)
        if idle or row[3] - self._flushed >= self._flush_s:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            self._file.write("".join(json.dumps(r) + "\n" for r in self._rows))
            self._file.flush()
            self._rows.clear()
        self._flushed = time.monotonic()


def read_trace(path: Path, start: float = -math.inf, end: float = math.inf) -> list[dict[str, float]]:
    """A trace's steps scheduled within [start, end] (monotonic), as dicts keyed by ``FIELDS``."""
    with path.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [dict(zip(FIELDS, row, strict=True)) for row in rows if start <= row[0] <= end]


def step_cycles(steps: list[dict[str, float]]) -> list[float]:
    """Each step's whole time: from its ``schedule()`` to the next one's, the
    engine core's hand-off of outputs and intake of new calls included, unless
    it left the engine idle (then it ends where its update did)."""
    cycles = []
    for step, after in zip(steps, [*steps[1:], None], strict=True):
        busy_on = after is not None and not step["idle"]
        cycles.append((after["t0"] if busy_on else step["t3"]) - step["t0"])
    return cycles


def summarize_steps(steps: list[dict[str, float]]) -> dict[str, float]:
    """What a run's steps add up to: the figures the simulator's engine model
    reports for a run (``EngineModel.stats``), measured."""
    cycles = step_cycles(steps)
    total = sum(cycles)
    return {
        "steps": float(len(steps)),
        "busy_seconds": total,
        "model_seconds": sum(s["t2"] - s["t1"] for s in steps),
        "mean_step_ms": 1e3 * total / len(steps) if steps else 0.0,
        "prefill_tokens": sum(s["prefill_tokens"] for s in steps),
        "decode_seq_steps": sum(s["decode_seqs"] for s in steps),
        "mean_decode_batch": (sum(s["decode_seqs"] for s in steps) / len(steps)) if steps else 0.0,
        "mean_kv_tokens": (sum(s["kv_tokens"] for s in steps) / len(steps)) if steps else 0.0,
        "new_requests": sum(s["new_requests"] for s in steps),
        "cached_tokens": sum(s["cached_tokens"] for s in steps),
    }
