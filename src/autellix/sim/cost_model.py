"""The cost of one engine step: a linear model of the batch, and its fit.

One step of a vLLM engine runs every scheduled token through the model once.
At the batch sizes an engine runs, its time splits into four parts, each
linear in one measure of the batch (Vidur profiles operators and sums them;
summed over one step, its operator costs reduce to these terms):

* ``overhead``: fixed per step: reading the weights once (decode is memory
  bound: weights / bandwidth), kernel launches, scheduling, sampling setup,
  the API server's share of the step;
* ``per_prefill_token``: the matrix multiplies of each prompt token (compute
  bound: 2 x parameters FLOPs per token);
* ``per_decode_seq``: what each decoding sequence adds beyond its one token
  (sampling, detokenizing, streaming its output);
* ``per_kv_token``: attention reads every cached token of every scheduled
  sequence once (memory bound: KV bytes per token / bandwidth);
* ``per_new_request``: what a request admitted into the batch adds to that
  step (its input state, block table and sampling set-up; on a CPU engine also
  its share of the API server's request handling, which runs on the same cores).

Prefill attention is quadratic in the chunk, but chunks are capped by the token
budget (``max_num_batched_tokens``), so within the budget it is folded into the
per-token terms; the fit's residual says how well that holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

#: The terms of the model, in the order of ``StepSample.features``.
TERMS = ("overhead", "per_prefill_token", "per_decode_seq", "per_kv_token", "per_new_request")


@dataclass(frozen=True)
class StepCost:
    """Seconds per step = overhead + each coefficient x its measure of the batch."""

    overhead: float
    per_prefill_token: float
    per_decode_seq: float
    per_kv_token: float
    per_new_request: float = 0.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"step cost {name}: expected a finite number >= 0, got {value!r}")

    def seconds(self, prefill_tokens: int, decode_seqs: int, kv_tokens: int, new_requests: int = 0) -> float:
        if prefill_tokens == 0 and decode_seqs == 0:
            return 0.0
        return (self.overhead + self.per_prefill_token * prefill_tokens + self.per_decode_seq * decode_seqs
                + self.per_kv_token * kv_tokens + self.per_new_request * new_requests)

    def decode_run_seconds(self, steps: int, seqs: int, kv_tokens: int) -> float:
        """Seconds of ``steps`` pure decode steps of ``seqs`` sequences, the first reading
        ``kv_tokens`` KV tokens and each later one ``seqs`` more (the engine model's decode runs)."""
        return steps * (self.overhead + self.per_decode_seq * seqs) + self.per_kv_token * decode_run_kv_tokens(
            steps, seqs, kv_tokens)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def decode_run_kv_tokens(steps: int, seqs: int, kv_tokens: int) -> int:
    """KV tokens that ``steps`` pure decode steps of ``seqs`` sequences read, the first reading ``kv_tokens``."""
    return steps * kv_tokens + seqs * steps * (steps - 1) // 2


class StepSample(NamedTuple):
    """One measured (or synthetic) step, or ``steps`` steps summed: the batch
    measures and how long it took."""

    prefill_tokens: float
    decode_seqs: float
    kv_tokens: float
    seconds: float
    steps: float = 1.0
    #: Requests admitted into the batch over these steps.
    new_requests: float = 0.0
    #: Calls whose fixed way in and out (HTTP, API server) the time includes.
    calls: float = 0.0

    @property
    def features(self) -> tuple[float, ...]:
        return (self.steps, self.prefill_tokens, self.decode_seqs, self.kv_tokens, self.new_requests, self.calls)


@dataclass(frozen=True)
class Fit:
    cost: StepCost
    #: Seconds each call spends outside the engine's steps (request and response
    #: handling); 0 when no sample includes it.
    call_overhead: float
    #: Coefficient of determination over the samples, and the mean absolute relative error.
    r2: float
    mean_abs_rel_error: float
    samples: int

    def quality(self) -> dict[str, Any]:
        return {"r2": self.r2, "mean_abs_rel_error": self.mean_abs_rel_error, "samples": self.samples}


def fit_step_cost(samples: Sequence[StepSample]) -> Fit:
    """Least squares (of relative errors) of the step time on the terms (and
    the per-call overhead, when samples include calls), no coefficient below 0.

    A term whose unconstrained coefficient comes out negative (noise on a term
    the data barely excites) is dropped and the rest refitted: active-set
    non-negative least squares, small enough to write out."""
    import numpy as np

    columns = len(TERMS) + 1
    if len(samples) < columns:
        raise ValueError(f"need at least {columns} samples to fit {columns} terms, got {len(samples)}")
    x = np.array([s.features for s in samples], dtype=float)
    y = np.array([s.seconds for s in samples], dtype=float)
    if not np.all(np.isfinite(x)) or not np.all(np.isfinite(y)) or np.any(y < 0):
        raise ValueError("samples must be finite and step times >= 0")
    # Relative errors: each row divided by its measured time, so a 10 ms time
    # to first token weighs as much as a 300 ms decode run (what the simulator
    # gets wrong is a share of each call, not seconds of the longest ones).
    weight = 1.0 / np.maximum(y, 1e-6)
    xw, yw = x * weight[:, None], y * weight
    # Columns scaled to unit norm: token counts and seconds differ by 1e6.
    scale = np.linalg.norm(xw, axis=0)
    scale[scale == 0] = 1.0
    active = [i for i in range(columns) if np.any(x[:, i])]
    coef = np.zeros(columns)
    while active:
        sol, *_ = np.linalg.lstsq(xw[:, active] / scale[active], yw, rcond=None)
        sol = sol / scale[active]
        if np.all(sol >= 0):
            coef[:] = 0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    pred = x @ coef
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    rel = float(np.mean(np.abs(pred - y) / np.maximum(y, 1e-12)))
    return Fit(StepCost(*(float(c) for c in coef[:len(TERMS)])), call_overhead=float(coef[len(TERMS)]), r2=r2,
               mean_abs_rel_error=rel, samples=len(samples))
