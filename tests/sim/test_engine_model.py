"""The engine model: vLLM V1's scheduler, KV cache and preemption, checked step by step."""

from __future__ import annotations

import json
import random

import pytest

from autellix.sim.cost_model import StepCost
from autellix.sim.engine_model import EngineModel
from autellix.sim.engine_profile import EngineProfile, bundled_profiles
from autellix.sim.engine_request import SimRequest, StepResult
from autellix.sim.kv_cache import BlockPool

COST = StepCost(overhead=0.01, per_prefill_token=1e-4, per_decode_seq=1e-4, per_kv_token=1e-7)


def profile(**changes: object) -> EngineProfile:
    base = EngineProfile("test", block_size=16, kv_blocks=64, max_num_seqs=4, max_num_batched_tokens=128, cost=COST,
                         max_model_len=1024)
    return base.with_overrides(**changes)


def tokens(prefix: int, length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [prefix] + [rng.randrange(1000) for _ in range(length - 1)]


def run(engine: EngineModel, *, check: bool = True, limit: int = 100_000) -> tuple[list[StepResult], dict, float]:
    """Step until idle; every step within capacity. Returns the steps, outcomes by id and the end time."""
    now, steps, outcomes = 0.0, [], {}
    for _ in range(limit):
        if engine.idle:
            return steps, outcomes, now
        result = engine.step(now)
        if check:
            engine.check_invariants()
            p = engine.profile
            assert result.prefill_tokens + result.decode_seqs <= engine.token_budget
            assert len(result.tokens) <= p.max_num_seqs
            assert engine.pool.used_blocks <= p.kv_blocks
            assert all(n in (0, 1) for n in result.tokens.values())
        now += result.seconds
        steps.append(result)
        outcomes.update(result.outcomes)
    raise AssertionError("the engine did not drain")


@pytest.mark.parametrize("scheduler", ["fcfs", "vllm-priority", "mlfq", "autellix"])
def test_capacity_and_budget_hold_and_every_call_gets_all_its_tokens(scheduler: str) -> None:
    # KV for about 3 of these at once: preemption by recompute must happen and must lose nothing
    engine = EngineModel(profile(kv_blocks=40), scheduler=scheduler)
    rng = random.Random(7)
    wanted = {}
    for i in range(30):
        rid = f"r{i}"
        wanted[rid] = rng.randrange(1, 200)
        engine.add(SimRequest(rid, tokens(i, rng.randrange(20, 300), i), wanted[rid], program_id=f"p{i % 4}",
                              priority=i % 3), 0.0)
    steps, outcomes, _ = run(engine)
    assert {rid: o.output_tokens for rid, o in outcomes.items()} == wanted
    produced: dict[str, int] = {}
    for s in steps:
        for rid, n in s.tokens.items():
            produced[rid] = produced.get(rid, 0) + n
    assert produced == wanted
    assert engine.stats()["preemptions"] > 0, "the KV cache was meant to run out"
    assert engine.pool.used_blocks == 0, "every block is released at the end"


def test_preemption_frees_the_victims_blocks_and_it_later_finishes() -> None:
    engine = EngineModel(profile(kv_blocks=12, max_num_seqs=2), scheduler="fcfs", prefix_caching=False)
    engine.add(SimRequest("a", tokens(1, 80, 1), 90), 0.0)
    engine.add(SimRequest("b", tokens(2, 80, 2), 90), 0.0)
    now, preempted_at = 0.0, None
    while not engine.idle:
        used_before = engine.pool.used_blocks
        result = engine.step(now)
        engine.check_invariants()
        if result.preempted and preempted_at is None:
            preempted_at = now
            assert result.preempted == ["b"], "FCFS preempts the last admitted"
            assert engine.pool.used_blocks <= used_before, "the victim's blocks went back to the pool"
            assert engine.running == 1 and engine.waiting == 1
        now += result.seconds
        if "b" in result.outcomes:
            assert result.outcomes["b"].output_tokens == 90 and result.outcomes["b"].preemptions >= 1
    assert preempted_at is not None
    assert engine.stats()["recomputed_tokens"] > 0


def test_prefix_cache_shares_full_blocks_of_a_common_prefix() -> None:
    engine = EngineModel(profile(), scheduler="fcfs")
    shared = tokens(5, 50, 5)  # 3 full blocks of 16, then 2 tokens
    engine.add(SimRequest("first", [*shared, 1, 2, 3], 4), 0.0)
    run(engine)
    engine.add(SimRequest("again", [*shared, 7, 8], 4), 1.0)
    engine.add(SimRequest("other", tokens(6, 53, 6), 4), 1.0)
    steps, outcomes, _ = run(engine)
    assert outcomes["again"].cached_tokens == 48
    assert outcomes["other"].cached_tokens == 0
    assert steps[0].cached_tokens == 48
    assert 0 < engine.stats()["prefix_hit_rate"] < 1


def test_without_prefix_caching_nothing_is_shared() -> None:
    engine = EngineModel(profile(), scheduler="fcfs", prefix_caching=False)
    shared = tokens(5, 50, 5)
    engine.add(SimRequest("first", shared, 4), 0.0)
    run(engine)
    engine.add(SimRequest("again", shared, 4), 1.0)
    _, outcomes, _ = run(engine)
    assert outcomes["again"].cached_tokens == 0


def test_fully_cached_prompt_still_computes_its_last_token() -> None:
    engine = EngineModel(profile(), scheduler="fcfs")
    prompt = tokens(3, 64, 3)  # exactly 4 blocks
    engine.add(SimRequest("a", prompt, 2), 0.0)
    run(engine)
    engine.add(SimRequest("b", prompt, 2), 1.0)
    steps, outcomes, _ = run(engine)
    assert outcomes["b"].cached_tokens == 48  # the last block is recomputed, as vLLM does
    assert steps[0].prefill_tokens == 16


def finish_order(engine: EngineModel) -> list[str]:
    steps, _, _ = run(engine)
    return [rid for s in steps for rid in s.finished]


def test_vllm_priority_orders_by_priority_then_arrival_and_fcfs_by_arrival() -> None:
    for scheduler, expected in (("vllm-priority", ["hi", "mid", "lo"]), ("fcfs", ["lo", "hi", "mid"])):
        engine = EngineModel(profile(max_num_seqs=1), scheduler=scheduler)
        for t, (rid, prio) in enumerate((("lo", 2), ("hi", 0), ("mid", 1))):
            engine.add(SimRequest(rid, tokens(t, 20, t), 5, priority=prio), 0.0)
        assert finish_order(engine) == expected


def test_autellix_preempts_a_running_call_when_a_better_ranked_one_waits() -> None:
    engine = EngineModel(profile(max_num_seqs=1), scheduler="autellix")
    engine.add(SimRequest("long", tokens(1, 20, 1), 200, program_id="old", service=30.0), 0.0)
    now = 0.0
    for _ in range(5):
        now += engine.step(now).seconds
    engine.add(SimRequest("short", tokens(2, 20, 2), 5, program_id="new", service=0.0), now)
    result = engine.step(now)
    assert result.preempted == ["long"]
    assert "short" in result.tokens
    assert finish_order(engine) == ["short", "long"]


def test_max_preemptions_bounds_the_planners_preemptions() -> None:
    from autellix.core import SchedulerConfig

    def preempted(config: SchedulerConfig) -> list[str]:
        engine = EngineModel(profile(max_num_seqs=2), scheduler="autellix", config=config)
        for i in range(2):
            engine.add(SimRequest(f"long{i}", tokens(i, 20, i), 200, program_id="old", service=30.0), 0.0)
        now = 0.0
        for _ in range(5):
            now += engine.step(now).seconds
        for i in range(2):
            engine.add(SimRequest(f"short{i}", tokens(5 + i, 20, 5 + i), 5, program_id=f"new{i}"), now)
        return engine.step(now).preempted

    assert len(preempted(SchedulerConfig())) == 2  # the default budget: both fresh calls run at once
    assert preempted(SchedulerConfig(max_preemptions=1)) == ["long1"]  # the worse-ranked of the two
    assert preempted(SchedulerConfig(max_preemptions=0)) == []


def test_mlfq_and_fcfs_do_not_preempt_for_rank() -> None:
    for scheduler in ("fcfs", "mlfq"):
        engine = EngineModel(profile(max_num_seqs=1), scheduler=scheduler)
        engine.add(SimRequest("long", tokens(1, 20, 1), 30, program_id="old", service=30.0), 0.0)
        now = engine.step(0.0).seconds
        engine.add(SimRequest("short", tokens(2, 20, 2), 5, program_id="new", service=0.0), now)
        assert finish_order(engine) == ["long", "short"]


def test_without_chunked_prefill_a_prompt_runs_whole_in_one_step() -> None:
    chunked = EngineModel(profile(), scheduler="fcfs", chunked_prefill=True)
    whole = EngineModel(profile(), scheduler="fcfs", chunked_prefill=False)
    for engine in (chunked, whole):
        engine.add(SimRequest("a", tokens(1, 300, 1), 2), 0.0)
    assert chunked.step(0.0).prefill_tokens == 128
    assert whole.step(0.0).prefill_tokens == 300


def test_step_until_coalesces_decode_steps_without_changing_the_outcome() -> None:
    def build() -> EngineModel:
        engine = EngineModel(profile(kv_blocks=200), scheduler="fcfs")
        for i in range(6):
            engine.add(SimRequest(f"r{i}", tokens(i, 30 + 10 * i, i), 40 + 25 * i), 0.0)
        return engine

    stepwise = build()
    _, single, end_single = run(stepwise)
    coalesced = build()
    now, outcomes, calls = 0.0, {}, 0
    while not coalesced.idle:
        result = coalesced.step_until(now, float("inf"))
        coalesced.check_invariants()
        now += result.seconds
        outcomes.update(result.outcomes)
        calls += 1
    assert calls < stepwise.stats()["steps"] / 3
    for total in ("steps", "prefill_tokens", "decode_seq_steps", "new_requests"):
        assert coalesced.stats()[total] == stepwise.stats()[total], total
    assert now == pytest.approx(end_single)
    for rid, outcome in single.items():
        assert outcomes[rid].finished_at == pytest.approx(outcome.finished_at)
        assert outcomes[rid].output_tokens == outcome.output_tokens


def test_bad_requests_are_refused_and_change_nothing() -> None:
    engine = EngineModel(profile(), scheduler="autellix")
    engine.add(SimRequest("a", [1, 2, 3], 4), 0.0)
    bad = [
        SimRequest("a", [1, 2, 3], 4),  # duplicate id
        SimRequest("b", [1, 2, 3], 0),  # no tokens asked
        SimRequest("c", [], 4),  # empty prompt
        SimRequest("d", [1] * 1000, 100),  # over the context
        SimRequest("e", [1, 2], 5, output=[1, 2]),  # output shorter than max_tokens
    ]
    for request in bad:
        with pytest.raises(ValueError, match=request.request_id):
            engine.add(request, 0.0)
    assert len(engine) == 1 and engine.waiting == 1 and len(engine.planner or []) == 1
    with pytest.raises(KeyError, match="zzz"):
        engine.abort("zzz", 0.0)
    with pytest.raises(ValueError, match="scheduler"):
        EngineModel(profile(), scheduler="sjf")


def test_abort_releases_a_running_request() -> None:
    engine = EngineModel(profile(), scheduler="autellix")
    engine.add(SimRequest("a", tokens(1, 40, 1), 50), 0.0)
    engine.step(0.0)
    assert engine.pool.used_blocks > 0
    engine.abort("a", 0.1)
    assert engine.idle and engine.pool.used_blocks == 0 and len(engine.planner or []) == 0


def test_profiles_load_by_name_and_reject_bad_files(tmp_path) -> None:
    assert {"a100-llama3.1-8b", "cpu-tiny"} <= set(bundled_profiles())
    a100 = EngineProfile.load("a100-llama3.1-8b")
    assert a100.block_size == 16 and a100.provenance["sources"]
    cpu = EngineProfile.load("cpu-tiny")
    assert cpu.max_num_seqs == 4 and cpu.max_num_batched_tokens == 1024  # the bfcl benchmark's engine settings
    assert 0 <= cpu.provenance["fit"]["r2"] <= 1
    assert a100.step_seconds(0, 1, 100) < a100.step_seconds(0, 100, 100 * 100) < a100.step_seconds(4000, 0, 4000)
    with pytest.raises(ValueError, match="unknown engine profile"):
        EngineProfile.load("h100-nothing")
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "block_size": 0, "kv_blocks": 1, "max_num_seqs": 1, '
                   '"max_num_batched_tokens": 1, "cost": {"overhead": 0, "per_prefill_token": 0, '
                   '"per_decode_seq": 0, "per_kv_token": 0}}')
    with pytest.raises(ValueError, match="block_size"):
        EngineProfile.load(bad)
    bad.write_text('{"name": "x", "block_size": 1, "kv_blocks": 1, "max_num_seqs": 1, '
                   '"max_num_batched_tokens": 1, "cost": {"overhead": -1, "per_prefill_token": 0, '
                   '"per_decode_seq": 0, "per_kv_token": 0}}')
    with pytest.raises(ValueError, match="overhead"):
        EngineProfile.load(bad)


def test_freed_blocks_stay_cached_until_evicted_least_recently_used_first() -> None:
    pool = BlockPool(4)
    a = pool.allocate(2)
    pool.register(a[0], 111)
    pool.register(a[1], 222)
    pool.release(a)  # free queue: the 2 never used, then a[1], then a[0] (tail first)
    assert pool.cached_prefix([111, 222]) == a and pool.free_blocks == 4
    pool.allocate(3)  # takes the 2 unused blocks, then evicts a[1]
    assert pool.cached_prefix([111]) == [a[0]] and pool.cached_prefix([111, 222]) == [a[0]]
    assert pool.evictions == 1
    pool.check()
    with pytest.raises(MemoryError):
        pool.allocate(2)


def test_profile_round_trips_through_its_file_form(tmp_path) -> None:
    a100 = EngineProfile.load("a100-llama3.1-8b")
    path = tmp_path / "copy.json"
    path.write_text(json.dumps(a100.to_dict()))
    again = EngineProfile.load(path)
    assert again == a100 and again.provenance["sources"] == a100.provenance["sources"]
    assert a100.with_overrides(max_num_seqs=32).max_num_seqs == 32


def test_step_totals_account_for_every_prompt_and_output_token() -> None:
    """The totals ``experiments/engine_steps_vs_profile.py`` sets beside the real engine's trace:
    without preemption every prompt token is prefilled or a prefix hit, and
    every token after a call's first is one decode step of one sequence."""
    engine = EngineModel(profile(kv_blocks=400), scheduler="fcfs")
    shared = tokens(5, 40, 5)
    wanted = {}
    for i in range(12):
        wanted[f"r{i}"] = 3 + 5 * i
        engine.add(SimRequest(f"r{i}", [*shared, *tokens(i, 10 + 20 * i, i)], wanted[f"r{i}"]), 0.0)
    run(engine)
    stats = engine.stats()
    assert stats["preemptions"] == 0 and stats["prefix_hits_tokens"] > 0
    assert stats["prefill_tokens"] == stats["prefix_queries_tokens"] - stats["prefix_hits_tokens"]
    assert stats["decode_seq_steps"] == sum(wanted.values()) - len(wanted) == stats["generated_tokens"] - 12
    assert stats["new_requests"] == 12
