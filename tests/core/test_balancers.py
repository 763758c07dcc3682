import math

import pytest

from autellix.core import (
    LeastUsedBalancer,
    LocalityBalancer,
    NoEngine,
    ProcessTable,
    RoundRobinBalancer,
    SchedulerConfig,
    balancer_from_config,
    least_used_engine,
    policy_by_name,
)
from autellix.core.balancers.autellix import REFERENCE_SLOTS, tokens_per_call


def test_least_used_breaks_ties_by_name():
    assert least_used_engine({"b": 1, "a": 1, "c": 3}) == "a"
    assert least_used_engine({"b": 0.5, "a": 1}) == "b"
    with pytest.raises(NoEngine):
        least_used_engine({})


def test_short_calls_go_to_least_used_even_when_pinned():
    lb = LocalityBalancer(long_prompt_tokens=2048)
    route = lb.choose({"e1": 5, "e2": 1}, prompt_tokens=2048, pinned="e1")
    assert route.engine == "e2" and route.pin == "e1"  # the pin is kept for later long calls


def test_long_calls_pin_on_first_use_and_stick():
    lb = LocalityBalancer(long_prompt_tokens=2048)
    first = lb.choose({"e1": 3, "e2": 1}, prompt_tokens=2049, pinned=None)
    assert first.engine == "e2" and first.pin == "e2"
    later = lb.choose({"e1": 0, "e2": 9}, prompt_tokens=5000, pinned=first.pin)
    assert later.engine == "e2" and later.pin == "e2"


def test_a_removed_pinned_engine_frees_the_pin():
    lb = LocalityBalancer(long_prompt_tokens=100)
    route = lb.choose({"e1": 4, "e3": 2}, prompt_tokens=500, pinned="e2")
    assert route == ("e3", "e3")
    short = lb.choose({"e1": 4, "e3": 2}, prompt_tokens=5, pinned="e2")
    assert short.pin is None


def test_algorithm2_with_the_process_table():
    table = ProcessTable(policy_by_name("atlas"))
    table.start("p", now=0.0)
    lb = balancer_from_config(SchedulerConfig(long_prompt_tokens=1000))
    loads = {"e1": 0.0, "e2": 0.0}
    # short: least used; long: pins to the least used (e2), then sticks even when e2 is busier
    for prompt, expected in [(10, "e1"), (3000, "e2"), (10, "e1"), (3000, "e2"), (3000, "e2")]:
        route = lb.choose(loads, prompt_tokens=prompt, pinned=table["p"].pinned_engine)
        table.pin("p", route.pin)
        assert route.engine == expected
        loads[route.engine] += 1
    assert loads == {"e1": 2.0, "e2": 3.0}
    table.drop_engine("e2")
    route = lb.choose({"e1": 7.0, "e3": 8.0}, prompt_tokens=3000, pinned=table["p"].pinned_engine)
    assert route == ("e1", "e1")


def test_baselines():
    rr = RoundRobinBalancer()
    loads = {"b": 0, "a": 10}
    assert [rr.choose(loads, prompt_tokens=9999, pinned=None).engine for _ in range(3)] == ["a", "b", "a"]
    with pytest.raises(NoEngine):
        rr.choose({}, prompt_tokens=1, pinned=None)
    lu = LeastUsedBalancer()
    assert lu.choose({"a": 3, "b": 2}, prompt_tokens=99999, pinned="a") == ("b", "a")
    assert isinstance(balancer_from_config(SchedulerConfig(balancer="round_robin")), RoundRobinBalancer)


def test_an_unpinned_call_goes_where_its_prefix_is_until_load_outweighs_it():
    lb = LocalityBalancer(long_prompt_tokens=2048, cached_tokens_per_call=1000)
    # 3000 cached tokens weigh as 3 calls: e2 (load 4 - 3) beats e1 (load 2)
    first = lb.choose({"e1": 2, "e2": 4}, prompt_tokens=6000, pinned=None, cached={"e2": 3000})
    assert first == ("e2", "e2")
    # ...but not at load 6 (6 - 3 > 2): the least loaded engine, pinned there
    assert lb.choose({"e1": 2, "e2": 6}, prompt_tokens=6000, pinned=None, cached={"e2": 3000}) == ("e1", "e1")
    # a short call keeps its program's pin and goes where it is cheapest
    assert lb.choose({"e1": 2, "e2": 4}, prompt_tokens=100, pinned="e1", cached={"e2": 3000}) == ("e2", "e1")


def test_a_short_calls_cached_tokens_weigh_more_on_a_larger_engine_and_never_less_than_set():
    """On an engine of 32 reference sizes (256 slots against 8) a call in flight costs the others less, so a
    short call's cached tokens weigh sqrt(32) ~ 5.7 times as many calls; at the reference size, below it, or
    where the size is unknown, as set. A long call's place pins its program: its cached tokens weigh as set."""
    lb = LocalityBalancer(long_prompt_tokens=2048, cached_tokens_per_call=1000)
    loads, cached = {"e1": 2, "e2": 10}, {"e2": 1500}
    assert lb.choose(loads, prompt_tokens=2000, pinned=None, cached=cached).engine == "e1"  # 10 - 1.5 > 2
    for sizes in ({"e1": 8, "e2": 8}, {"e2": 4}):
        assert lb.choose(loads, prompt_tokens=2000, pinned=None, cached=cached, slots=sizes).engine == "e1"
    big = {"e1": 256, "e2": 256}  # 1500 tokens weigh as 1.5 x 5.66 = 8.5 calls: 10 - 8.5 < 2
    assert lb.choose(loads, prompt_tokens=2000, pinned="e1", cached=cached, slots=big) == ("e2", "e1")
    assert lb.choose({"e1": 2, "e2": 11}, prompt_tokens=2000, pinned=None, cached=cached, slots=big).engine == "e1"
    # the same prefix in a long call, which pins: as set (10 - 1.5 > 2)
    assert lb.choose(loads, prompt_tokens=4000, pinned=None, cached=cached, slots=big) == ("e1", "e1")
    assert tokens_per_call(1000, 256) == pytest.approx(1000 / math.sqrt(32))
    assert [tokens_per_call(1000, s) for s in (None, 1, 4, REFERENCE_SLOTS)] == [1000] * 4


def test_a_pinned_long_call_stays_and_no_index_is_the_papers_rule():
    lb = LocalityBalancer(long_prompt_tokens=2048, cached_tokens_per_call=1000)
    assert lb.choose({"e1": 9, "e2": 0}, prompt_tokens=6000, pinned="e1", cached={"e2": 6000}) == ("e1", "e1")
    off = LocalityBalancer(long_prompt_tokens=2048, cached_tokens_per_call=0)
    assert off.choose({"e1": 2, "e2": 1}, prompt_tokens=6000, pinned=None, cached={"e1": 6000}) == ("e2", "e2")
    assert lb.choose({"e1": 2, "e2": 1}, prompt_tokens=6000, pinned=None) == ("e2", "e2")


def test_llm_d_prefix_rule_scores_prefix_share_and_relative_queue():
    lb = balancer_from_config(SchedulerConfig(balancer="prefix_score"))
    # all of the prompt cached on the busiest engine: 3 x 1 + 2 x 0 = 3 beats 0 + 2 x 1 = 2
    assert lb.choose({"e1": 1, "e2": 9}, prompt_tokens=100, pinned=None, cached={"e2": 100}).engine == "e2"
    # a third of it: 1 + 0 loses to 2
    assert lb.choose({"e1": 1, "e2": 9}, prompt_tokens=300, pinned=None, cached={"e2": 100}).engine == "e1"
    # equal loads: the prefix decides; nothing cached anywhere: the least loaded, then the name
    assert lb.choose({"e1": 3, "e2": 3}, prompt_tokens=300, pinned=None, cached={"e2": 100}).engine == "e2"
    assert lb.choose({"e2": 3, "e1": 3}, prompt_tokens=300, pinned="e2").engine == "e1"
    with pytest.raises(NoEngine):
        lb.choose({}, prompt_tokens=1, pinned=None)
