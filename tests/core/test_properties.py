"""Property tests of the policy core over random workloads (hypothesis)."""

import math
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from autellix.core import SchedulerConfig, policy_by_name
from autellix.sim.unit import simulate
from autellix.sim.workloads import CallSpec, ProgramSpec, chain, random_programs

seeds = st.integers(min_value=0, max_value=2**32 - 1)
policies = st.sampled_from(["fcfs", "mlfq", "plas", "atlas"])
CONFIG = SchedulerConfig(boundaries=(2, 4, 8, 16), quanta=(2, 4, 8, 16, math.inf), beta=2.0)


@settings(max_examples=40, deadline=None)
@given(seed=seeds, policy=policies, batch=st.integers(1, 4), beta=st.sampled_from([0.5, 1.0, 2.0, math.inf]))
def test_no_call_is_lost_or_duplicated(seed, policy, batch, beta):
    programs = random_programs(seed, 15, rate=0.3)
    seen_running: dict[str, int] = defaultdict(int)

    def observe(t, queue, table, ran):
        queue.check_invariants()
        ids = [c.call_id for c in ran]
        assert len(ids) == len(set(ids)) <= batch
        for c in ran:
            seen_running[c.call_id] += 1

    result = simulate(programs, policy_by_name(policy), CONFIG.with_overrides(beta=beta), batch_size=batch,
                      observer=observe)
    expected = {c.call_id: c.steps for p in programs for c in p.calls}
    assert {cid: rec.steps for cid, rec in result.calls.items()} == expected
    # every call ran exactly as many steps as it has tokens: never lost, never run twice
    assert dict(seen_running) == expected
    assert all(p.finish >= p.arrival + 1 for p in result.programs.values())


@settings(max_examples=40, deadline=None)
@given(seed=seeds, batch=st.integers(1, 4))
def test_active_calls_of_an_atlas_program_share_one_priority(seed, batch):
    programs = random_programs(seed, 12, rate=0.5, threaded_share=1.0)

    def observe(t, queue, table, ran):
        by_program = defaultdict(set)
        for call in queue:
            if call.steps == 0 and not call.promoted:  # placed by priority, not moved by its own quanta
                by_program[call.program_id].add(call.level)
        for pid, levels in by_program.items():
            assert len(levels) == 1, f"{pid}'s waiting calls sit at levels {levels}"
            assert levels == {queue.spec.level_for(table.priority(pid))}

    simulate(programs, policy_by_name("atlas"), CONFIG.with_overrides(beta=math.inf), batch_size=batch,
             observer=observe)


@settings(max_examples=40, deadline=None)
@given(seed=seeds, batch=st.integers(1, 4), policy=st.sampled_from(["plas", "atlas"]))
def test_one_queue_and_no_promotion_is_fcfs(seed, batch, policy):
    programs = random_programs(seed, 15, rate=0.4)
    one_queue = SchedulerConfig(boundaries=(), quanta=(math.inf,), beta=math.inf)
    got = simulate(programs, policy_by_name(policy), one_queue, batch_size=batch)
    fcfs = simulate(programs, policy_by_name("fcfs"), CONFIG, batch_size=batch)
    assert {c: (r.finish, r.wait) for c, r in got.calls.items()} == {
        c: (r.finish, r.wait) for c, r in fcfs.calls.items()
    }


@settings(max_examples=40, deadline=None)
@given(seed=seeds, batch=st.integers(1, 4), policy=st.sampled_from(["plas", "atlas"]),
       beta=st.sampled_from([0.5, 1.0, 2.0, 4.0]))
def test_no_waiting_call_is_left_below_q1_once_its_program_starves(seed, batch, policy, beta):
    """The mechanism behind the bound: after every round, a call waiting outside
    Q1 has (program wait + call wait) < bound * (program service charged + call
    time), where the bound is the last sweep's (``QueueSpec.starvation_bound``)
    and the service charged counts what the program's calls in flight beside
    the first have committed it to (``ProgramView.charged``)."""
    programs = random_programs(seed, 20, rate=0.6)

    def observe(t, queue, table, ran):
        running = {id(c) for c in ran}
        for call in queue:
            if call.level == 0 or id(call) in running:
                continue
            program = table.view(call.program_id)
            wait, service = program.wait + call.wait, program.charged + call.model_time
            assert wait == 0 or wait < queue.starvation_bound * service, (call, program, queue.starvation_bound)

    simulate(programs, policy_by_name(policy), CONFIG.with_overrides(beta=beta), batch_size=batch, observer=observe)


@settings(max_examples=12, deadline=None)
@given(beta=st.sampled_from([1.0, 2.0, 4.0]), calls=st.integers(3, 8), length=st.integers(6, 20))
def test_a_long_program_is_not_starved_by_a_stream_of_short_ones(beta, calls, length):
    """Fresh one-call programs keep Q1 97.5% busy, so without anti-starvation the
    long program only gets the 2.5% left and waits for the whole stream."""
    long = chain("L", [length] * calls)
    stream_end = 15 * calls * length
    shorts = [ProgramSpec(f"s{i}", float(i), (CallSpec(f"s{i}.0", 2),)) for i in range(stream_end) if i % 40]
    config = CONFIG.with_overrides(beta=beta)
    result = simulate([long, *shorts], policy_by_name("plas"), config, batch_size=2)
    record = result.programs["L"]
    assert record.finish < stream_end  # done while the stream still runs
    # The bound is relative once the stream has made a backlog (the short
    # programs wait too): the long program's wait over its service stays within
    # 2 times the worst short program's (1.6x at worst over every case of the
    # grid drawn from here). Under a fixed beta its ratio stayed under 2 beta
    # while the short programs it went ahead of waited up to 35 times their
    # service (20 times with the backlog's bound; docs/scheduling.md).
    worst_short = max(p.wait / p.service for name, p in result.programs.items() if name != "L")
    assert record.wait <= 2 * worst_short * record.service
    starved = simulate([long, *shorts], policy_by_name("plas"), CONFIG.with_overrides(beta=math.inf), batch_size=2)
    assert starved.programs["L"].finish >= stream_end
