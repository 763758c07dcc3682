"""The autoscaler's decision (pure): bounds, stabilisation windows (no flapping), drain before removal."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from autellix.kube.autoscaler import (
    EngineLoad,
    LoadHistory,
    Sample,
    ScalePlan,
    desired_replicas,
    plan,
    recommend,
    trim,
)
from autellix.kube.spec import Autoscaling

policies = st.builds(
    lambda lo, span, target, up, down: Autoscaling(enabled=True, min_replicas=lo, max_replicas=lo + span,
                                                   target_load=target, scale_up_window=up, scale_down_window=down),
    st.integers(1, 4), st.integers(0, 6), st.floats(0.5, 32), st.sampled_from([0.0, 1.0, 3.0, 10.0]),
    st.sampled_from([0.0, 2.0, 5.0, 30.0]))
loads = st.floats(0, 300, allow_nan=False)
#: (seconds since the previous sample, total load)
series = st.lists(st.tuples(st.sampled_from([0.5, 1.0, 2.0, 4.0]), loads), min_size=1, max_size=60)


def run(policy: Autoscaling, steps: list[tuple[float, float]], start: int) -> list[tuple[float, int, int]]:
    """The timer's loop: sample, decide, apply. Returns (time, before, after) for every decision."""
    history: list[Sample] = []
    current, now, out = start, 0.0, []
    for gap, load in steps:
        now += gap
        history = trim([*history, Sample(now, load)], policy, now)
        new = desired_replicas(history, current, policy, now)
        out.append((now, current, new))
        current = new
    return out


@settings(max_examples=300, deadline=None)
@given(policies, series, st.integers(0, 20))
def test_replicas_stay_within_bounds(policy: Autoscaling, steps: list[tuple[float, float]], start: int) -> None:
    for _, _, after in run(policy, steps, start):
        assert policy.min_replicas <= after <= policy.max_replicas


@settings(max_examples=300, deadline=None)
@given(policies, series)
def test_no_flapping_within_the_stabilisation_windows(policy: Autoscaling, steps: list[tuple[float, float]]) -> None:
    """After a scale-up nothing is removed within the scale-down window, and vice versa."""
    decisions = run(policy, steps, policy.min_replicas)
    last_up = last_down = -math.inf
    for now, before, after in decisions:
        if after < before:
            assert now - last_up > policy.scale_down_window, decisions
            last_down = now
        elif after > before:
            assert now - last_down > policy.scale_up_window, decisions
            last_up = now


@settings(max_examples=200, deadline=None)
@given(policies, loads, loads)
def test_a_lasting_load_is_followed(policy: Autoscaling, first: float, second: float) -> None:
    """Load held longer than both windows ends at the recommendation for it, from any start."""
    hold = [(1.0, first)] * int(max(policy.scale_up_window, policy.scale_down_window) + 2)
    then = [(1.0, second)] * int(max(policy.scale_up_window, policy.scale_down_window) + 2)
    decisions = run(policy, hold + then, policy.min_replicas)
    assert decisions[len(hold) - 1][2] == recommend(first, policy)
    assert decisions[-1][2] == recommend(second, policy)


def test_recommendation() -> None:
    policy = Autoscaling(enabled=True, min_replicas=1, max_replicas=4, target_load=10)
    assert [recommend(x, policy) for x in (0, 10, 10.5, 25, 1000)] == [1, 1, 2, 3, 4]


engines = st.lists(st.builds(EngineLoad, url=st.sampled_from([f"http://10.0.0.{i}:8000" for i in range(8)]),
                             load=st.sampled_from([0.0, 0.0, 1.0, 7.5]), inflight=st.sampled_from([0, 0, 2]),
                             draining=st.booleans(), healthy=st.booleans()),
                   max_size=8, unique_by=lambda e: e.url)


@settings(max_examples=500, deadline=None)
@given(engines, st.integers(0, 10), st.integers(0, 10))
def test_scale_down_removes_only_drained_idle_engines(seen: list[EngineLoad], current: int, desired: int) -> None:
    step = plan(current, desired, seen)
    by_url = {e.url: e for e in seen}
    for gone in step.remove:  # never an engine with work, nor one the gateway still sends calls to
        assert by_url[gone.url].draining and gone.load == 0 and gone.inflight == 0
    assert len(step.remove) <= max(current - desired, 0)
    assert all(not by_url[u].draining for u in step.drain)
    assert all(by_url[u].draining for u in step.undrain)
    if desired >= current:
        assert not step.drain and not step.remove and step.replicas == desired
        return
    # replicas the gateway does not see go first; then as many seen engines are (being) drained as are in
    # excess, never leaving fewer than ``desired`` that take calls
    unseen = min(current - desired, max(current - len(seen), 0))
    assert step.replicas == current - unseen - len(step.remove) >= desired
    draining = {e.url for e in seen if e.draining} - set(step.undrain) | set(step.drain)
    assert len(draining) == current - desired - unseen
    assert len(seen) - len(draining) >= min(desired, len(seen))


def test_scale_down_drains_the_least_loaded_first_and_then_removes_it() -> None:
    busy, quiet = EngineLoad("http://a", load=9), EngineLoad("http://b", load=1)
    step = plan(2, 1, [busy, quiet])
    assert step.drain == ("http://b",) and not step.remove and step.replicas == 2
    draining = EngineLoad("http://b", load=1, draining=True)
    assert plan(2, 1, [busy, draining]).remove == ()  # still finishing a call
    idle = EngineLoad("http://b", load=0, draining=True)
    step = plan(2, 1, [busy, idle])
    assert step.remove == (idle,) and step.replicas == 1
    assert plan(2, 2, [busy, idle]).undrain == ("http://b",)  # load came back: keep it


def test_an_engine_being_replaced_is_not_made_up_for_by_draining_the_one_left() -> None:
    """Two replicas, one pod deleted and its replacement not ready: the gateway sees one engine. A lull
    then lowers spec.replicas (the pod that is not ready goes) and drains nothing: the one engine the
    gateway has keeps taking calls."""
    step = plan(2, 1, [EngineLoad("http://left", load=0.5)])
    assert step == ScalePlan(replicas=1)
    assert plan(3, 1, [EngineLoad("http://a", load=2), EngineLoad("http://b", load=1)]) == \
        ScalePlan(replicas=2, drain=("http://b",))


def test_an_operator_that_just_took_the_lead_waits_a_whole_window_before_scaling_down() -> None:
    """The new leader knows no load before its first sample: a lull it has seen for less than the
    scale-down window removes nothing, one it has seen for the whole window does; a load spike still
    scales up at once. A gap longer than the windows starts the watch again."""
    policy = Autoscaling(enabled=True, min_replicas=1, max_replicas=4, target_load=10, scale_up_window=0,
                         scale_down_window=60)
    history = LoadHistory(since=1000.0)
    for now in range(1000, 1060, 5):
        history.add(Sample(now, 0.0), policy)
        assert desired_replicas(history.samples, 3, policy, now, since=history.since) == 3
    history.add(Sample(1060, 0.0), policy)
    assert desired_replicas(history.samples, 3, policy, 1060, since=history.since) == 1
    assert desired_replicas([Sample(1000, 35.0)], 3, policy, 1000, since=1000) == 4
    history.add(Sample(1200, 0.0), policy)  # no sample for longer than the windows: watched since now
    assert history.since == 1200 and history.samples == [Sample(1200, 0.0)]
    assert desired_replicas(history.samples, 3, policy, 1200, since=history.since) == 3
