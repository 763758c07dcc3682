"""The engine's call planner: a subagent tree's calls in flight, tenants' bands, declared sizes, the sweep's cadence."""

import pytest

from autellix.core import SchedulerConfig
from autellix.engine.planner import CallIdentity, CallPlanner
from autellix.protocol import XARG_DECLARED, XARG_TENANT, SchedulingFields


def planner_with_a_typical_call_of(seconds: float) -> CallPlanner:
    planner = CallPlanner(SchedulerConfig())
    planner.arrive("x0", CallIdentity("x"), 0.0)
    planner.started(["x0"])
    planner.step_done(seconds)
    planner.leave("x0", seconds, finished=True)
    assert planner.table.call_time == pytest.approx(seconds)
    return planner


def test_calls_in_flight_of_one_gateway_tree_commit_it_together():
    planner = planner_with_a_typical_call_of(2.0)
    planner.arrive("a0", CallIdentity("root/a", tree="root", service=1.0), 3.0)
    assert planner.program_view("root/a").committed == 0.0
    planner.arrive("b0", CallIdentity("root/b", tree="root", service=1.0), 3.0)
    planner.arrive("c0", CallIdentity("root/c", tree="root", service=1.0), 3.0)
    for program_id in ("root/a", "root/b", "root/c"):  # three of one tree: two beside the first
        view = planner.program_view(program_id)
        assert (view.tree, view.service, view.committed, view.priority) == ("root", 1.0, 4.0, 5.0)
    planner.arrive("l0", CallIdentity("lone", service=1.0), 3.0)  # a program of its own commits nothing
    assert planner.program_view("lone").committed == 0.0
    for call_id in ("a0", "b0", "c0"):
        planner.leave(call_id, 4.0, finished=False)
    assert planner.program_view("root/a").committed == 0.0  # the round is over


def test_the_declared_model_time_from_the_gateway_places_a_new_programs_call():
    planner = CallPlanner(SchedulerConfig())
    xargs = SchedulingFields(program="big", call="g1", service=0.0, wait=0.0, declared=40.0).xargs()
    who = CallIdentity.of("r1", xargs, None)
    assert who.declared == 40.0
    big = planner.arrive("r1", who, 0.0)
    small = planner.arrive("r2", CallIdentity.of("r2", SchedulingFields("small", "g2", 0.0, 0.0).xargs(), None), 0.0)
    assert planner.program_view("big").priority == 40.0
    assert big.level > small.level  # behind the program that said nothing and has had nothing
    assert XARG_DECLARED not in SchedulingFields("small", "g2", 0.0, 0.0).xargs()


def test_the_tenant_and_its_weight_from_the_gateway_share_the_engines_slots_between_tenants():
    planner = CallPlanner(SchedulerConfig())

    def identity(program: str, call: str, tenant: str, weight: float = 1.0) -> CallIdentity:
        fields = SchedulingFields(program=program, call=call, service=0.0, wait=0.0, tenant=tenant,
                                  tenant_weight=weight)
        return CallIdentity.of(call, fields.xargs(), None)

    assert identity("p", "c", "team-a", 3.0).tenant_weight == 3.0
    assert XARG_TENANT not in SchedulingFields("p", "c", 0.0, 0.0).xargs()  # no tenants: nothing said
    for call in ("a0", "a1"):  # team-a alone fills both slots: nothing banded
        planner.arrive(call, identity(f"prog-{call}", call, "team-a"), 0.0)
    assert planner.replan(0.0, [], 2) == ([], [])
    planner.started(["a0", "a1"])
    planner.step_done(0.5)
    for call in ("b0", "b1"):
        planner.arrive(call, identity(f"prog-{call}", call, "team-b"), 0.5)
    assert planner.table["prog-a0"].owner == "team-a" and planner.program_view("prog-a0").lead == 0.0
    moved, victims = planner.replan(0.5, ["a0", "a1"], 2)  # a slot each: team-a's second call gives way
    assert {c.call_id: c.band for c in moved} == {"a1": 1, "b1": 1}
    assert [c.call_id for c in victims] == ["a1"]
    assert planner.queue.get("b0").rank < planner.queue.get("a1").rank < planner.queue.get("b1").rank
    planner.arrive("a2", identity("prog-a2", "a2", "team-a", weight=1e6), 0.5)  # the latest weight counts
    assert planner.table.tenants.weight("team-a") == 1e6 and planner.program_view("prog-b0").patience == 1e6
    moved, _ = planner.replan(0.5, ["a0", "b0"], 2)  # both slots are team-a's quota now
    assert {c.call_id: c.band for c in moved} == {"a1": 0, "b0": 1, "a2": 1}
    for call in ("b0", "b1"):
        planner.leave(call, 1.0, finished=False)
    moved, _ = planner.replan(1.0, ["a0", "a1"], 2)  # team-a alone again: nothing banded
    assert {c.call_id: c.band for c in moved} == {"a2": 0}


@pytest.mark.parametrize(("queued", "every"), [(100, 0.02), (4000, 0.08)])
def test_sweeps_come_no_more_often_than_the_queue_can_afford(queued: int, every: float):
    planner = CallPlanner(SchedulerConfig())
    planner.skip_quiet_sweeps = False  # count every sweep that falls due
    for i in range(queued):
        planner.arrive(f"c{i}", CallIdentity(f"p{i}"), 0.0)
    for step in range(1, 1001):  # a step every millisecond for a second
        planner.replan(step / 1000, [], 256)
    assert planner.sweeps == pytest.approx(1.0 / every, abs=1)
