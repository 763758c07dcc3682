"""KV retention in the engine model: held prefixes, their release under pressure, offload and restore, accounting."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from autellix.sim.cost_model import StepCost
from autellix.sim.engine_model import EngineModel
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.engine_request import RequestOutcome, SimRequest

COST = StepCost(overhead=0.01, per_prefill_token=1e-4, per_decode_seq=1e-4, per_kv_token=1e-7)
BLOCK = 16


def profile(**changes: object) -> EngineProfile:
    base = EngineProfile("test", block_size=BLOCK, kv_blocks=40, max_num_seqs=2, max_num_batched_tokens=128,
                         cost=COST, max_model_len=1024)
    return base.with_overrides(**changes)


def tokens(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000) for _ in range(length)]


class Driver:
    """Steps one engine model on its own clock and checks its invariants after every step."""

    def __init__(self, engine: EngineModel) -> None:
        self.engine = engine
        self.now = 0.0
        self.outcomes: dict[str, RequestOutcome] = {}
        self.max_step = 0.0

    def call(self, request: SimRequest) -> RequestOutcome:
        self.engine.add(request, self.now)
        self.drain()
        return self.outcomes[request.request_id]

    def drain(self) -> None:
        while not self.engine.idle:
            result = self.engine.step(self.now)
            self.engine.check_invariants()
            self.now += result.seconds
            self.max_step = max(self.max_step, result.seconds)
            self.outcomes.update(result.outcomes)

    def pause(self, seconds: float) -> None:
        self.now += seconds


def program_turns(driver: Driver, program: str, turns: int, *, between: Callable[[], None] | None = None) -> list[int]:
    """``program`` makes ``turns`` calls, each prompt its last prompt + reply + 32 new tokens,
    pausing 1 s between them (``between`` runs during the last pause)."""
    prompt = tokens(hash(program) % 1000, 96)
    for turn in range(turns):
        reply = tokens(1000 + turn, 8)
        driver.call(SimRequest(f"{program}.{turn}", list(prompt), 8, program_id=program, output=reply))
        if turn == turns - 2 and between is not None:
            between()
        driver.pause(1.0)
        prompt = prompt + reply + tokens(2000 + turn, 32)
    return prompt


def others(driver: Driver, count: int, length: int) -> None:
    """Programs of one call each, one after the other: they churn the LRU free list."""
    for i in range(count):
        driver.call(SimRequest(f"other.{i}", tokens(5000 + i, length), 4, program_id=f"other.{i}"))


@pytest.mark.parametrize("retention", [True, False])
def test_a_held_prefix_survives_the_churn_that_evicts_it_from_the_lru(retention: bool) -> None:
    engine = EngineModel(profile(kv_retention=retention), scheduler="autellix")
    driver = Driver(engine)
    program_turns(driver, "p", 3, between=lambda: others(driver, 6, 200))
    stats = engine.stats()
    if retention:
        assert stats["recomputed_prefix_tokens"] == 0
        assert stats["kv_kept"] >= 1
    else:
        # the third call had to compute again the prefix its second call had computed
        assert stats["recomputed_prefix_tokens"] >= 5 * BLOCK
        assert stats["kv_kept"] == 0
    assert stats["preemptions"] == 0


def test_the_stock_schedulers_never_hold_but_count_what_is_recomputed() -> None:
    engine = EngineModel(profile(), scheduler="vllm-priority")
    driver = Driver(engine)
    program_turns(driver, "p", 3, between=lambda: others(driver, 6, 200))
    assert engine.stats()["kv_kept"] == 0 and engine.stats()["recomputed_prefix_tokens"] > 0


def test_a_held_prefix_yields_to_a_call_that_needs_its_blocks_and_is_offloaded_when_a_host_pool_exists() -> None:
    # the other call needs 36 of the 40 blocks: the held prefix must go, no call is preempted or delayed;
    # a transfer (1e-4 s a block each way) costs less than the prefill (16 x 1e-4 s a block)
    first_scheduled = {}
    for host in (0, 64):
        engine = EngineModel(profile(host_kv_blocks=host, swap_s_per_block=1e-4), scheduler="autellix")
        driver = Driver(engine)
        program_turns(driver, "p", 3, between=lambda d=driver: others(d, 1, 560))
        stats = engine.stats()
        assert stats["preemptions"] == 0 and stats["kv_kept"] >= 1
        first_scheduled[host] = driver.outcomes["other.0"].queue_time
        if host:
            assert stats["kv_offloaded"] == 1 and stats["kv_dropped"] == 0
            # what the other call took comes back from the host; the rest was still in the prefix cache
            assert stats["restored_tokens"] > 0 and stats["recomputed_prefix_tokens"] == 0
            # only the blocks the other call took were copied out, and only they came back in;
            # both transfers were paid in the steps they happened in
            assert 0 < stats["kv_offloaded_saved_blocks"] < stats["kv_offloaded_blocks"]
            assert stats["restored_tokens"] == stats["kv_offloaded_saved_blocks"] * BLOCK
            assert stats["swap_seconds"] == pytest.approx(2e-4 * stats["kv_offloaded_saved_blocks"])
        else:
            assert stats["kv_dropped"] == 1 and stats["recomputed_prefix_tokens"] > 0
    assert first_scheduled[0] == first_scheduled[64] == 0.0


def test_a_request_of_no_program_is_never_held_and_an_idle_engine_keeps_its_holds() -> None:
    engine = EngineModel(profile(), scheduler="autellix")
    driver = Driver(engine)
    for i in range(3):
        driver.call(SimRequest(f"anon.{i}", tokens(i, 100), 4))
    assert engine.stats()["held_blocks"] == 0 and engine.pool.used_blocks == 0
    program_turns(driver, "p", 2)
    assert engine.stats()["held_blocks"] > 0
    # idle: only the hold is referenced, and all of it can be taken back
    assert engine.pool.used_blocks == engine.stats()["held_blocks"] == engine.reclaimable_blocks()


def test_the_tool_pause_workload_recomputes_less_with_retention_on_a_small_cache() -> None:
    from autellix.sim.serving import simulate_programs
    from autellix.workloads import make_programs
    from autellix.workloads.data import workloads_available

    if not workloads_available():
        pytest.skip("the shared workload data (../shared/workloads) is not here")
    programs = make_programs("tool-pause", 12, seed=4)
    small = EngineProfile.load("a100-llama3.1-8b").with_overrides(kv_blocks=1200, max_num_seqs=8)
    recomputed = {}
    for name, prof in (("lru", small.with_overrides(kv_retention=False)),
                       ("offload", small.with_overrides(host_kv_blocks=4096, swap_s_per_block=8.4e-5))):
        run = simulate_programs(programs, profile=prof, system="autellix", rate=1.0, seed=4)
        assert all(p.error is None for p in run.result.programs)
        (stats,) = run.engines.values()
        recomputed[name] = stats["recomputed_prefix_tokens"]
    assert recomputed["lru"] > 0
    assert recomputed["offload"] * 2 <= recomputed["lru"]
