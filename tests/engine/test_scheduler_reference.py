"""The scheduler plugin's step-time shortcuts change no decision.

One trace of calls (programs of a spread of attained service, arriving over time, some coming back
after their last call left, so that KV retention holds their prefixes) is run through two
``AutellixScheduler`` instances inside vLLM's real ``Scheduler`` (``autellix_lab.harness``), on the
same step clock: the plugin as it runs, and a reference whose queue is the straightforward one
(``tests.core.test_mlq_reference.ReferenceQueue``: every due sweep visits every call, charging and
marking the running calls as before), whose planner skips no sweep, and whose KV manager always
allocates through the retaining wrapper. Every step must schedule the same requests, in the same
order, for the same tokens, preempt the same, finish the same, and leave every request with the same
priority (docs/results/2026-12-06-scheduler-step.md).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm")

from autellix.engine.kv.retention import RetainingKVCacheManager
from autellix.engine.scheduler import AutellixScheduler
from autellix_lab.harness import build_scheduler, make_request, step
from tests.core.test_mlq_reference import ReferenceQueue


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.delenv("AUTELLIX_FEEDBACK_ADDR", raising=False)
    yield monkeypatch


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t


def plugin(clock: Clock, *, reference: bool, **kwargs) -> AutellixScheduler:
    scheduler = build_scheduler(AutellixScheduler, **kwargs)
    assert isinstance(scheduler, AutellixScheduler)
    scheduler.clock = clock.now
    planner, leave = scheduler.planner, scheduler.planner.leave
    planner.records = []  # type: ignore[attr-defined]

    def kept_leave(call_id: str, now: float, *, finished: bool):
        record = leave(call_id, now, finished=finished)
        if record is not None:
            planner.records.append(record)  # type: ignore[attr-defined]
        return record

    planner.leave = kept_leave  # type: ignore[method-assign]
    if reference:
        planner.queue = ReferenceQueue(planner.queue.spec, planner.program_view,
                                       places_by_priority=planner.queue.places_by_priority)
        planner.skip_quiet_sweeps = False
        manager = scheduler.kv_cache_manager
        if isinstance(manager, RetainingKVCacheManager):
            scheduler.retention.on_holding = None
            manager.__dict__.pop("allocate_slots", None)  # the wrapper, always
    return scheduler


def trace(seed: int, programs: int, steps: int) -> tuple[dict[int, list[tuple]], dict[str, list[tuple]]]:
    """Calls that arrive at fixed steps, and agents' calls that follow each other: each agent's next
    call arrives a few steps after its last one finished (a tool's pause), with its context so far as
    its prompt. A call: (request id, program, prompt tokens, max tokens, gateway service, wait, pause)."""
    rng = random.Random(seed)
    base = {f"P{i}": list(rng.randbytes(48)) for i in range(programs)}
    service = {f"P{i}": rng.choice([0.0, 0.2, 0.7, 1.5, 3.0, 6.0, 20.0]) for i in range(programs)}
    arrivals: dict[int, list[tuple]] = {}
    for n, at in enumerate(sorted(rng.sample(range(steps), steps // 25))):
        for k in range(rng.choice([1, 1, 2, 4])):
            program = rng.choice(sorted(base))
            # a program's calls share its prefix: a call that comes back finds it, held or cached
            prompt = base[program] + list(rng.randbytes(rng.choice([8, 24, 70])))
            arrivals.setdefault(at, []).append((f"r{n}.{k}", program, prompt, rng.choice([6, 40, 150, 400]),
                                                service[program], rng.choice([0.0, 0.0, 2.0]), 0))
    agents: dict[str, list[tuple]] = {}
    for i in range(programs // 2):
        context = list(rng.randbytes(64))
        calls = []
        for k in range(8):
            context = context + list(rng.randbytes(rng.choice([16, 40])))
            calls.append((f"a{i}.{k}", f"A{i}", list(context), rng.choice([10, 30, 60]), rng.choice([0.0, 0.3, 2.5]),
                          0.0, rng.choice([3, 10, 30])))
            context = context + [7] * calls[-1][3]  # its reply (the fake model samples one token)
        agents[f"A{i}"] = calls
        arrivals.setdefault(rng.randrange(50), []).append(calls[0])
    return arrivals, agents


def run(scheduler: AutellixScheduler, clock: Clock, calls: tuple[dict[int, list[tuple]], dict[str, list[tuple]]],
        steps: int, step_s: float) -> list[tuple]:
    arrivals = {at: list(batch) for at, batch in calls[0].items()}
    agents = calls[1]
    log = []
    for n in range(steps):
        for rid, program, prompt, max_tokens, service, wait, _ in arrivals.get(n, ()):
            extra = {"autellix_program": program, "autellix_service": service, "autellix_wait": wait,
                     "autellix_call": rid}
            scheduler.add_request(make_request(rid, 0, max_tokens, prompt_token_ids=prompt, extra_args=extra))
        out, results = step(scheduler)
        finished = sorted(o.request_id for e in results.values() for o in e.outputs if o.finish_reason is not None)
        for rid in finished:  # an agent's next call, after its tool's pause
            if rid.startswith("a"):
                agent, k = rid[1:].split(".")
                following = agents[f"A{agent}"][int(k) + 1:]
                if following:
                    arrivals.setdefault(n + 1 + following[0][6], []).append(following[0])
        log.append((n, list(out.num_scheduled_tokens.items()), sorted(out.preempted_req_ids or ()), finished,
                    sorted((rid, r.priority) for rid, r in scheduler.requests.items())))
        clock.t += step_s
    return log


@pytest.mark.parametrize(("seed", "slots", "blocks", "step_s"), [
    (1, 4, 20000, 0.007),  # plenty of KV: quiet stretches, sweeps skipped
    (2, 8, 20000, 0.003),
    (3, 4, 120, 0.007),  # KV pressure: held prefixes given back
    (6, 8, 150, 0.005),
])
def test_the_plugin_decides_as_the_reference(env, seed: int, slots: int, blocks: int, step_s: float) -> None:
    steps = 1500
    calls = trace(seed, programs=10, steps=steps)
    clock_fast, clock_slow = Clock(), Clock()
    fast = plugin(clock_fast, reference=False, max_num_seqs=slots, num_blocks=blocks)
    slow = plugin(clock_slow, reference=True, max_num_seqs=slots, num_blocks=blocks)
    fast_log = run(fast, clock_fast, calls, steps, step_s)
    slow_log = run(slow, clock_slow, calls, steps, step_s)
    for got, want in zip(fast_log, slow_log, strict=True):
        assert got == want, f"step {want[0]} differs"
    # the trace reaches what the shortcuts skip: sweeps that move nothing, promotions, preemptions, holds
    assert fast.planner.skipped_sweeps > 0 and slow.planner.skipped_sweeps == 0
    assert fast.planner.sweeps + fast.planner.skipped_sweeps == slow.planner.sweeps
    assert fast.planner.records == slow.planner.records  # service, wait, steps, promotions of every call
    assert sum(record.promotions for record in slow.planner.records) > 0
    assert any(preempted for _, _, preempted, _, _ in slow_log)
    assert fast.retention.stats() == slow.retention.stats()
    assert fast.retention.ledger.kept > 0
    # vLLM's allocate_slots bound to the manager exactly while nothing is held
    assert ("allocate_slots" in vars(fast.kv_cache_manager)) == (fast.retention.ledger.held_blocks == 0)
    if blocks < 1000:
        assert fast.retention.ledger.dropped > 0
