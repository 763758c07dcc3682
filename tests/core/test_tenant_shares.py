"""Tenant shares: a tenant ahead of its weighted share of model time ranks behind by its lead."""

import random

import pytest

from autellix.core import ATLAS, PLAS, MultiLevelQueue, ProcessTable, SchedulerConfig, TenantShares
from autellix.core.tenant_shares import LEAD_GAIN


def _served(shares: TenantShares, tenant: str, model_time: float, now: float = 0.0) -> None:
    shares.call_started(tenant, now)
    shares.call_ended(tenant, model_time, now)


def test_the_lead_is_the_weighted_service_over_the_least_served_active_tenant() -> None:
    shares = TenantShares()
    shares.set_weight("heavy", 3.0)
    shares.call_started("heavy", 0.0)
    shares.call_started("light", 0.0)
    shares.call_started("heavy", 0.0)
    shares.call_ended("heavy", 6.0, 1.0)  # heavy: 6 s over weight 3 = 2
    shares.call_started("light", 1.0)
    shares.call_ended("light", 1.0, 1.0)  # light: 1 s over weight 1 = 1
    assert shares.lead("light") == 0.0
    assert shares.lead("heavy") == pytest.approx(LEAD_GAIN * (2.0 - 1.0))
    assert shares.patience("light") == pytest.approx(3.0) and shares.patience("heavy") == 1.0


def test_a_tenant_alone_or_idle_has_no_lead() -> None:
    shares = TenantShares()
    shares.call_started("a", 0.0)
    shares.call_ended("a", 50.0, 1.0)
    shares.call_started("a", 1.0)
    assert shares.lead("a") == 0.0 and shares.patience("a") == 1.0  # alone: nothing to share with
    shares.call_started("b", 1.0)
    assert shares.lead("a") == 0.0  # b arrived at a's normalised service: no credit from before it came
    shares.call_ended("b", 10.0, 2.0)  # b has nothing in flight now
    assert shares.lead("b") == 0.0 and shares.lead("a") == 0.0


def test_a_pause_banks_no_credit_and_what_a_tenant_was_ahead_by_decays() -> None:
    shares = TenantShares(half_life_s=10.0)
    for tenant in ("a", "b"):
        shares.call_started(tenant, 0.0)
    shares.call_ended("a", 1.0, 0.0)  # a goes idle, 1 s served
    shares.call_started("b", 0.0)
    shares.call_ended("b", 100.0, 0.0)  # b runs on alone
    shares.call_started("a", 5.0)  # a returns: at least b's normalised service, not 99 s behind
    assert shares.lead("b") == 0.0 and shares.lead("a") == 0.0
    shares.call_started("c", 5.0)
    shares.call_ended("c", 40.0, 5.0)  # c is 40 s ahead of the others when it pauses
    shares.call_started("c", 25.0)  # two half-lives later: a quarter of that is left
    assert shares.lead("c") == pytest.approx(LEAD_GAIN * 10.0)


def test_weights_come_from_configure_and_set_weight_and_bad_ones_are_refused() -> None:
    shares = TenantShares()
    shares.configure({"a": 2.0})
    assert shares.weight("a") == 2.0 and shares.weight("b") == 1.0 and shares.weight(None) == 1.0
    shares.call_started("a", 0.0)
    shares.configure({})
    assert shares.weight("a") == 1.0  # unnamed again: back to the default
    for bad in (0, -1, float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="positive"):
            shares.set_weight("a", bad)
    with pytest.raises(KeyError):
        shares.call_ended("nobody", 1.0, 0.0)


def test_the_tenants_forgotten_first_are_the_longest_idle() -> None:
    shares = TenantShares(max_tenants=2)
    _served(shares, "old", 1.0, now=0.0)
    _served(shares, "recent", 1.0, now=5.0)
    shares.call_started("new", 6.0)
    assert {s.name for s in shares} == {"recent", "new"}


def test_a_lone_tenants_views_are_those_of_no_tenants() -> None:
    """Work-conserving and lossless for a tenant alone: every view equals the tenant-less table's."""
    rng = random.Random(7)
    tables = [ProcessTable(ATLAS()), ProcessTable(ATLAS())]
    owners = [None, "team-a"]
    live: list[str] = []
    for step in range(400):
        now = float(step)
        if not live or rng.random() < 0.2:
            live.append(f"p{step}")
            for table, owner in zip(tables, owners, strict=True):
                table.start(live[-1], now, owner=owner)
        program = rng.choice(live)
        for table in tables:
            table.call_arrived(program, f"c{step}", now)
        if rng.random() < 0.7:
            model_time = rng.expovariate(1.0)
            for table in tables:
                table.call_finished(program, f"c{step}", now + 0.5, model_time=model_time)
        for table in tables:
            assert table.view(program) == tables[0].view(program)


def _queue(table: ProcessTable) -> MultiLevelQueue:
    return MultiLevelQueue(PLAS().queues(SchedulerConfig()), table.view)


def _agent_and_swarm(owned: bool) -> tuple[ProcessTable, MultiLevelQueue]:
    """One tenant's long agent (20 s so far) and another's three programs of 10-12 s (33 s in all), each
    with a call waiting; ``owned``: the programs' tenants are named."""
    table = ProcessTable(PLAS())
    services = {"lone-agent": 20.0, "s0": 10.0, "s1": 11.0, "s2": 12.0}
    queue = _queue(table)
    for program in services:  # all in flight together: the tenants are active all along
        table.start(program, 0.0, owner=("lone" if program == "lone-agent" else "swarm") if owned else None)
        table.call_arrived(program, f"{program}-0", 0.0)
        table.call_arrived(program, f"{program}-next", 0.0)
        queue.add(f"{program}-next", program, 0.0)
    for program, service in services.items():
        table.call_finished(program, f"{program}-0", 0.0, model_time=service)
    queue.rebalance(0.0)  # the waiting calls follow their programs' priorities
    return table, queue


def test_a_tenant_ahead_ranks_behind_a_tenant_behind_and_keeps_its_own_order() -> None:
    _, queue = _agent_and_swarm(owned=False)
    assert [c.program_id for c in queue.form_batch(lambda call: True)] == ["s0", "s1", "s2", "lone-agent"]
    table, queue = _agent_and_swarm(owned=True)
    assert [c.program_id for c in queue.form_batch(lambda call: True)] == ["lone-agent", "s0", "s1", "s2"]
    assert table.view("s0").lead == pytest.approx(LEAD_GAIN * 13.0) and table.view("lone-agent").lead == 0.0


def test_anti_starvation_lifts_a_starving_program_only_to_its_tenants_lead() -> None:
    table = ProcessTable(PLAS())
    spec = PLAS().queues(SchedulerConfig())
    queue = MultiLevelQueue(spec, table.view)
    served = (("a-prog", "a", 30.0), ("b-prog", "b", 40.0))  # tenant b is ahead
    for program, tenant, _ in served:
        table.start(program, 0.0, owner=tenant)
        table.call_arrived(program, f"{program}-0", 0.0)
        table.call_arrived(program, f"{program}-1", 0.0)
    for program, _, service in served:
        table.call_finished(program, f"{program}-0", 0.0, model_time=service)
    queue.add("b-prog-1", "b-prog", 0.0)
    queue.add("a-prog-1", "a-prog", 9_990.0)
    lead = table.view("b-prog").lead
    assert lead == pytest.approx(LEAD_GAIN * 10.0) and table.view("a-prog").lead == 0.0
    queue.rebalance(10_000.0)  # b-prog has starved far longer than a-prog
    lifted = queue.get("b-prog-1")
    assert lifted.promoted and lifted.level == spec.level_for(lead) > 0  # not to Q1: its tenant is ahead
    assert [c.call_id for c in queue.form_batch(lambda call: True)] == ["a-prog-1", "b-prog-1"]


def test_slot_quotas_split_the_engine_by_weight_and_tilt_against_a_tenant_ahead() -> None:
    shares = TenantShares(quota_halving_s=1.0)
    shares.call_started("a", 0.0)
    assert shares.slot_quotas(8) is None  # alone: nothing to share
    shares.set_weight("heavy", 3.0)
    shares.call_started("heavy", 0.0)
    assert shares.slot_quotas(8) == {"a": 2, "heavy": 6}
    _served(shares, "heavy", 3.0 * 8.0)  # heavy is a whole second of the 8-slot engine ahead: half its weight
    assert shares.slot_quotas(8) == {"a": 3, "heavy": 5}  # 3.2 and 4.8: the larger remainder rounds up
    shares.call_started("c", 0.0)
    one = shares.slot_quotas(1)  # one slot: one of the tenants not ahead (heavy is 8 s of this engine ahead)
    assert one is not None and sorted(one.values()) == [0, 0, 1] and one["heavy"] == 0
    with pytest.raises(ValueError):
        TenantShares(quota_halving_s=0.0)


def test_an_engines_shares_have_no_lead() -> None:
    shares = TenantShares(lead_gain=0.0)
    shares.call_started("a", 0.0)
    shares.call_started("b", 0.0)
    _served(shares, "a", 10.0)
    assert shares.lead("a") == 0.0 and shares.slot_quotas(2)["b"] > 1.0
