"""The keep / offload / drop decision and the return-time prediction (``autellix.core.kv_retention``)."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autellix.core.kv_retention import (
    GONE_BELOW_PROBABILITY,
    HeldPrefix,
    Retention,
    RetentionCosts,
    RetentionLedger,
    ReturnPredictor,
    plan_retention,
    release_cost,
    release_order,
)

#: An A100 with Llama-3.1-8B: 16-token blocks, 0.1 ms of prefill a token, 84 us a block over PCIe.
A100 = RetentionCosts(recompute_s_per_block=16 * 1.03e-4, swap_out_s_per_block=8.4e-5, swap_in_s_per_block=8.4e-5)
NO_SWAP = RetentionCosts(recompute_s_per_block=16 * 1.03e-4)

prefixes = st.lists(
    st.builds(HeldPrefix, key=st.integers(0, 10**6), blocks=st.integers(0, 500),
              returns_in=st.floats(0, 100, allow_nan=False), return_probability=st.floats(0, 1)),
    max_size=30, unique_by=lambda p: p.key)
costs = st.sampled_from([A100, NO_SWAP, RetentionCosts(1e-3, 1e-2, 1e-2), RetentionCosts(0.0)])


def density(prefix: HeldPrefix, c: RetentionCosts) -> float:
    cheapest = c.drop_cost(prefix.blocks, prefix.return_probability)
    if c.can_swap:
        cheapest = min(cheapest, c.offload_cost(prefix.blocks, prefix.return_probability))
    return cheapest / (max(prefix.blocks, 1) * max(prefix.returns_in, 0.01))


@settings(max_examples=200, deadline=None)
@given(held=prefixes, c=costs, host=st.integers(0, 3000))
def test_release_order_is_every_prefix_cheapest_per_block_second_first(held, c, host) -> None:
    order = release_order(held, c, host_free_blocks=host)
    assert sorted(p.key for p, _ in order) == sorted(p.key for p in held)
    gone = [p.return_probability < GONE_BELOW_PROBABILITY for p, _ in order]
    assert gone == sorted(gone, reverse=True), "prefixes that will not be used again go first"
    likely = [density(p, c) for p, _ in order if p.return_probability >= GONE_BELOW_PROBABILITY]
    assert all(a <= b * (1 + 1e-9) + 1e-15 for a, b in itertools.pairwise(likely))
    offloaded = [p for p, how in order if how is Retention.OFFLOAD]
    assert sum(p.blocks for p in offloaded) <= host, "offloads fit the host pool"
    for p, how in order:
        assert how in (Retention.OFFLOAD, Retention.DROP)
        if how is Retention.OFFLOAD:
            assert c.can_swap and release_cost(p, c, offload=True) < release_cost(p, c, offload=False)


@settings(max_examples=200, deadline=None)
@given(held=prefixes, c=costs, shortfall=st.integers(0, 5000), host=st.integers(0, 3000))
def test_plan_frees_the_shortfall_with_the_cheapest_prefix_of_the_order(held, c, shortfall, host) -> None:
    plan = plan_retention(held, c, shortfall=shortfall, host_free_blocks=host)
    assert set(plan) == {p.key for p in held}
    released = [p for p in held if plan[p.key] is not Retention.KEEP]
    freed = sum(p.blocks for p in released)
    total = sum(p.blocks for p in held)
    if shortfall == 0:
        assert not released
    elif shortfall >= total:
        assert len(released) == len(held)
    else:
        assert freed >= shortfall
    # exactly a leading run of the release order, no more than needed
    order = [p.key for p, _ in release_order(held, c, host_free_blocks=host)]
    assert order[:len(released)] == [k for k in order if plan[k] is not Retention.KEEP]
    if released:
        last = next(p for p in held if p.key == order[len(released) - 1])
        assert freed - last.blocks < shortfall


def test_a_prefix_needed_in_a_moment_outlives_one_needed_in_ten_seconds() -> None:
    soon = HeldPrefix("soon", blocks=300, returns_in=0.2, return_probability=0.95)
    late = HeldPrefix("late", blocks=300, returns_in=10.0, return_probability=0.95)
    plan = plan_retention([soon, late], NO_SWAP, shortfall=100)
    assert plan == {"soon": Retention.KEEP, "late": Retention.DROP}
    # with a host pool, giving it up means offloading it (a transfer costs less than the prefill)
    assert plan_retention([soon, late], A100, shortfall=100, host_free_blocks=1000)["late"] is Retention.OFFLOAD
    # ... unless the pool has no room for it
    assert plan_retention([soon, late], A100, shortfall=100, host_free_blocks=299)["late"] is Retention.DROP


def test_a_program_that_is_probably_gone_is_released_first_whatever_its_size() -> None:
    gone = HeldPrefix("gone", blocks=1000, returns_in=0.0, return_probability=0.001)
    back = HeldPrefix("back", blocks=10, returns_in=30.0, return_probability=0.9)
    assert plan_retention([back, gone], A100, shortfall=5) == {"gone": Retention.DROP, "back": Retention.KEEP}


def test_costs_and_prefixes_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        RetentionCosts(recompute_s_per_block=-1.0)
    with pytest.raises(ValueError):
        RetentionCosts(recompute_s_per_block=math.nan)
    with pytest.raises(ValueError):
        HeldPrefix("p", blocks=-1, returns_in=1.0, return_probability=0.5)
    with pytest.raises(ValueError):
        HeldPrefix("p", blocks=1, returns_in=1.0, return_probability=1.5)
    assert not NO_SWAP.can_swap and A100.can_swap


# ---- prediction ---------------------------------------------------------------------------------------
def feed(predictor: ReturnPredictor, program: str, gaps: list[float], start: float = 0.0) -> float:
    """One call per gap: it starts, finishes, and the program comes back ``gap`` later. Returns the clock."""
    now = start
    for gap in gaps:
        predictor.call_started(program, now)
        now += 0.05
        assert predictor.call_finished(program, now)
        now += gap
    predictor.call_started(program, now)
    now += 0.05
    predictor.call_finished(program, now)
    return now


def test_the_forecast_learns_a_programs_median_gap() -> None:
    rng = random.Random(3)
    predictor = ReturnPredictor()  # prior: median 1 s
    gaps = [rng.lognormvariate(math.log(0.2), 0.3) for _ in range(30)]
    now = feed(predictor, "p", gaps)
    forecast = predictor.forecast("p", now)
    assert forecast.returns_in == pytest.approx(0.2, rel=0.25)
    assert forecast.return_probability > 0.9
    # a program with no history is forecast from everyone's gaps, shrunk towards the prior
    predictor.call_started("fresh", now)
    predictor.call_finished("fresh", now)
    assert 0.2 < predictor.forecast("fresh", now).returns_in < 1.0


@settings(max_examples=60, deadline=None)
@given(gaps=st.lists(st.floats(0.001, 50), min_size=0, max_size=20),
       waits=st.lists(st.floats(0, 200), min_size=1, max_size=8))
def test_the_longer_a_program_stays_away_the_less_likely_it_returns(gaps, waits) -> None:
    predictor = ReturnPredictor()
    now = feed(predictor, "p", gaps)
    last = 1.0
    for elapsed in sorted(waits):
        forecast = predictor.forecast("p", now + elapsed)
        assert forecast.returns_in >= 0 and 0 <= forecast.return_probability <= 1
        assert forecast.return_probability <= last + 1e-12
        last = forecast.return_probability


def test_a_program_with_a_call_on_the_engine_is_not_paused() -> None:
    predictor = ReturnPredictor()
    predictor.call_started("p", 0.0)
    predictor.call_started("p", 0.0)  # two threads
    assert not predictor.call_finished("p", 1.0)
    assert predictor.forecast("p", 1.0).returns_in == 0.0
    assert predictor.call_finished("p", 2.0)
    assert predictor.paused() == ["p"] and predictor.paused_at("p") == 2.0
    assert predictor.call_started("p", 2.5) == pytest.approx(0.5)
    assert predictor.has_returned("p") and not predictor.paused()


def test_pauses_written_off_lower_the_return_probability_until_the_program_returns() -> None:
    predictor = ReturnPredictor(prior_median_s=0.1, prior_sigma=0.2)
    p0 = predictor.return_probability()
    for i in range(5):
        predictor.call_started(f"p{i}", 0.0)
        predictor.call_finished(f"p{i}", 0.0)
        assert predictor.forecast(f"p{i}", 100.0).return_probability < 0.01
    assert predictor.write_offs == 5 and predictor.return_probability() < p0
    predictor.call_started("p0", 200.0)  # it came back after all
    assert predictor.write_offs == 4 and predictor.returns == 1


# ---- the ledger ---------------------------------------------------------------------------------------
def test_the_ledger_holds_a_program_that_came_back_and_gives_it_up_under_pressure() -> None:
    ledger: RetentionLedger[int, str] = RetentionLedger(NO_SWAP)
    ledger.arrived("p", 0.0)
    pin, unpin = ledger.finished("p", 1.0, [1, 2, 3], ["a", "b", "c"])
    assert pin == () and unpin == ()  # its first pause: no evidence it returns
    ledger.arrived("p", 2.0)
    assert ledger.admitted("p", ["a", "b", "c", "d"], reused_blocks=2) == 1  # one block computed again
    assert ledger.resumed("p") == ()
    pin, unpin = ledger.finished("p", 3.0, [1, 2, 3, 4], ["a", "b", "c", "d"])
    assert pin == (1, 2, 3, 4) and unpin == () and ledger.held_blocks == 4
    assert ledger.shortage(0, 3.5) == []
    (release,) = ledger.shortage(2, 3.5)
    assert release.program == "p" and release.blocks == (1, 2, 3, 4) and release.how is Retention.DROP
    assert ledger.held_blocks == 0 and "p" not in ledger
    stats = ledger.stats()
    assert stats["kept"] == 1 and stats["dropped"] == 1 and stats["recomputed_prefix_blocks"] == 1
    assert stats["reused_prefix_blocks"] == 2


def test_the_ledger_ends_a_hold_when_the_program_takes_its_prefix() -> None:
    ledger: RetentionLedger[int, str] = RetentionLedger(A100)
    for t in (0.0, 2.0):
        ledger.arrived("p", t)
        ledger.finished("p", t + 1, [7, 8], ["x", "y"])
    assert ledger.held("p") == (7, 8)
    ledger.arrived("p", 4.0)
    assert ledger.held("p") == (7, 8)  # until it is admitted: its call may wait in the queue
    assert ledger.admitted("p", ["x", "y", "z"], reused_blocks=2) == 0
    assert ledger.resumed("p") == (7, 8) and ledger.held_blocks == 0
    assert ledger.stats()["resumed_holds"] == 1


def test_the_ledger_without_holding_only_counts() -> None:
    ledger: RetentionLedger[int, str] = RetentionLedger(NO_SWAP, hold=False)
    for t in (0.0, 2.0, 4.0):
        ledger.arrived("p", t)
        assert ledger.finished("p", t + 1, [1, 2], ["a", "b"]) == ((), ())
    ledger.arrived("p", 6.0)
    assert ledger.admitted("p", ["a", "b"], reused_blocks=0) == 2
    assert ledger.stats()["recomputed_prefix_blocks"] == 2


def test_the_ledger_forgets_programs_that_went_quiet_and_releases_everything_on_reset() -> None:
    ledger: RetentionLedger[int, str] = RetentionLedger(NO_SWAP)
    for program, start, block in (("a", 0.0, 1), ("b", 650.0, 2)):
        for t in (start, start + 1.0):
            ledger.arrived(program, t)
            ledger.finished(program, t + 0.5, [block], [program])
    assert ledger.held_blocks == 2
    assert [(r.program, r.blocks) for r in ledger.expire(700.0, 600.0)] == [("a", (1,))]
    assert "a" not in ledger.predictor and "b" in ledger.predictor
    assert [(r.program, r.blocks, r.how) for r in ledger.release_all()] == [("b", (2,), Retention.DROP)]
    assert ledger.held_blocks == 0


def test_a_call_that_expects_its_program_back_is_held_from_its_first_pause() -> None:
    ledger: RetentionLedger[int, str] = RetentionLedger(NO_SWAP)
    ledger.arrived("tools", 0.0)
    assert ledger.finished("tools", 1.0, [1, 2], ["a", "b"], expect_return=True) == ((1, 2), ())
    ledger.arrived("chat", 0.0)
    assert ledger.finished("chat", 1.0, [3], ["c"]) == ((), ())  # no evidence, and none said
    assert ledger.held_blocks == 2


def test_a_programs_end_drops_its_hold_and_counts_its_pause_as_no_return() -> None:
    ledger: RetentionLedger[int, str] = RetentionLedger(NO_SWAP)
    for t in (0.0, 2.0):
        ledger.arrived("p", t)
        ledger.finished("p", t + 1, [5, 6], ["x", "y"])
    assert ledger.held("p") == (5, 6)
    before = ledger.predictor.return_probability()
    assert ledger.ended("p") == (5, 6)
    assert ledger.held_blocks == 0 and "p" not in ledger and "p" not in ledger.predictor
    after = ledger.predictor.return_probability()
    assert after < before and ledger.stats()["dropped"] == 1
    assert ledger.ended("p") == () and ledger.ended("never-seen") == ()
    assert ledger.predictor.return_probability() == after  # ending twice, or an unknown program, counts nothing
