"""The step cost model and its fit: known coefficients come back from synthetic timings."""

from __future__ import annotations

import random

import pytest

from autellix.sim.cost_model import StepCost, StepSample, decode_run_kv_tokens, fit_step_cost
from autellix.sim.engine_model import EngineModel
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.engine_request import SimRequest
from autellix.sim.profiling import DEFAULT_GROUPS, Group, Measured, fit_profile, replay

TRUE = StepCost(overhead=0.004, per_prefill_token=3e-5, per_decode_seq=2e-4, per_kv_token=5e-8, per_new_request=1e-3)


def test_fit_recovers_known_coefficients_from_noisy_steps() -> None:
    rng = random.Random(3)
    samples = []
    for _ in range(300):
        prefill, decode, new = rng.choice([0, rng.randrange(1, 2048)]), rng.randrange(0, 64), rng.randrange(0, 4)
        kv = prefill + decode * rng.randrange(10, 3000)
        seconds = TRUE.seconds(prefill, decode or 1, kv, new) * rng.uniform(0.98, 1.02)
        samples.append(StepSample(prefill, decode or 1, kv, seconds, new_requests=new))
    fit = fit_step_cost(samples)
    for name, value in TRUE.to_dict().items():
        assert getattr(fit.cost, name) == pytest.approx(value, rel=0.1), name
    assert fit.r2 > 0.99 and fit.mean_abs_rel_error < 0.03 and fit.call_overhead == pytest.approx(0, abs=1e-4)


def test_a_decode_run_costs_what_its_steps_cost_one_by_one() -> None:
    for steps, seqs, kv in ((1, 1, 17), (7, 3, 500), (64, 32, 90_000)):
        one_by_one = [TRUE.seconds(0, seqs, kv + i * seqs) for i in range(steps)]
        assert TRUE.decode_run_seconds(steps, seqs, kv) == pytest.approx(sum(one_by_one), rel=1e-12)
        assert decode_run_kv_tokens(steps, seqs, kv) == sum(kv + i * seqs for i in range(steps))
    assert TRUE.decode_run_seconds(0, 4, 100) == 0


def test_fit_never_returns_a_negative_coefficient() -> None:
    # times that fall with the KV term: least squares would make it negative
    samples = [StepSample(0, d, kv, 0.01 + 1e-3 * d - 1e-7 * kv) for d in range(1, 9) for kv in (100, 2000, 9000)]
    fit = fit_step_cost(samples)
    assert all(v >= 0 for v in fit.cost.to_dict().values())
    assert fit.cost.per_kv_token == 0


def test_fit_refuses_too_few_or_bad_samples() -> None:
    with pytest.raises(ValueError, match="at least"):
        fit_step_cost([StepSample(1, 1, 1, 0.1)])
    with pytest.raises(ValueError, match="finite"):
        fit_step_cost([StepSample(1, 1, 1, -0.1)] * 10)
    with pytest.raises(ValueError, match="overhead"):
        StepCost(overhead=float("nan"), per_prefill_token=0, per_decode_seq=0, per_kv_token=0)


def test_an_idle_step_costs_nothing() -> None:
    assert TRUE.seconds(0, 0, 0) == 0.0
    assert TRUE.seconds(10, 0, 10) > TRUE.seconds(0, 1, 10) > 0


def _timed(group: Group, profile: EngineProfile, call_overhead: float) -> Measured:
    """What a client would measure if the engine took exactly the model's step times."""
    engine = EngineModel(profile, scheduler="fcfs", prefix_caching=False)
    ids = [f"r{i}" for i in range(group.concurrency)]
    for i, rid in enumerate(ids):
        engine.add(SimRequest(rid, [i + 1] + [0] * (group.prompt - 1), group.output), 0.0)
    now, first, last = 0.0, {}, {}
    while not engine.idle:
        result = engine.step(now)
        now += result.seconds
        for rid in result.first_token:
            first[rid] = now
        for rid in result.finished:
            last[rid] = now
    return Measured(group, 0, tuple((first[r] + call_overhead, last[r] - first[r]) for r in ids))


def test_profile_fit_recovers_the_engine_it_measured() -> None:
    """The whole ``autellix profile`` pipeline without an engine: timings produced by
    a known cost model, replayed and fitted, give that cost model back."""
    truth = EngineProfile("truth", block_size=128, kv_blocks=512, max_num_seqs=4, max_num_batched_tokens=1024,
                          cost=TRUE)
    measured = [_timed(g, truth, call_overhead=0.003) for g in DEFAULT_GROUPS]
    fit, samples = fit_profile(measured, truth.with_overrides(cost=StepCost(0, 0, 0, 0)))
    assert len(samples) == sum(2 * g.concurrency for g in DEFAULT_GROUPS)
    for name in ("overhead", "per_prefill_token", "per_decode_seq"):
        assert getattr(fit.cost, name) == pytest.approx(getattr(TRUE, name), rel=0.05), name
    assert fit.call_overhead == pytest.approx(0.003, rel=0.1)
    assert fit.r2 > 0.999


def test_replay_splits_each_request_into_its_prefill_and_decode_steps() -> None:
    profile = EngineProfile("p", block_size=16, kv_blocks=1000, max_num_seqs=4, max_num_batched_tokens=100,
                            cost=TRUE)
    (pre, dec), = replay(Group(1, 250, 10), profile)
    assert (pre.steps, pre.prefill_tokens, pre.calls) == (3, 250, 1)  # chunks of 100, 100, 50
    assert (dec.steps, dec.decode_seqs, dec.prefill_tokens) == (9, 9, 0)
