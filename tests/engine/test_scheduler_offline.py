"""Autellix's scheduler inside vLLM's real V1 ``Scheduler`` class, stepped in-process
with fabricated model output (``autellix_lab.harness``): every decision of
the plugin, in milliseconds, deterministic."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from autellix.engine.scheduler import AutellixScheduler
from autellix_lab.harness import build_scheduler, make_request, step


def xargs(program: str, service: float = 0.0, wait: float = 0.0, call: str | None = None) -> dict:
    args: dict = {"autellix_program": program, "autellix_service": service, "autellix_wait": wait}
    if call is not None:
        args["autellix_call"] = call
    return args


class Run:
    """A scheduler plus what each request produced."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler
        self.tokens: dict[str, int] = {}
        self.finished: dict[str, int] = {}  # request id -> step it finished at
        self.steps = 0
        self.preempted: list[str] = []

    def add(self, request_id: str, prompt: int, max_tokens: int, extra: dict | None = None) -> None:
        self.s.add_request(make_request(request_id, prompt, max_tokens, extra_args=extra))

    def step(self) -> set[str]:
        out, results = step(self.s)
        self.steps += 1
        self.preempted += sorted(out.preempted_req_ids or ())
        for engine_outputs in results.values():
            for o in engine_outputs.outputs:
                self.tokens[o.request_id] = self.tokens.get(o.request_id, 0) + len(o.new_token_ids)
                if o.finish_reason is not None:
                    self.finished[o.request_id] = self.steps
        return set(out.num_scheduled_tokens)

    def until(self, done: str, limit: int = 5000) -> None:
        for _ in range(limit):
            if done in self.finished:
                return
            self.step()
        raise AssertionError(f"{done} did not finish within {limit} steps")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.delenv("AUTELLIX_FEEDBACK_ADDR", raising=False)
    yield monkeypatch


def test_a_fresh_call_preempts_a_heavy_programs_running_call(env) -> None:
    run = Run(build_scheduler(AutellixScheduler, max_num_seqs=2))
    run.add("p0", 8, 400, xargs("P", service=5.0))
    run.add("p1", 8, 400, xargs("P", service=5.0))
    for _ in range(3):
        assert run.step() == {"p0", "p1"}
    run.add("q", 8, 20, xargs("Q"))
    assert "q" in run.step()  # at once: one of P's calls made room
    assert run.preempted == ["p1"]  # the later, worse-ranked of P's two calls
    run.until("q")
    run.until("p0")
    run.until("p1")
    # nothing lost to the preemption: every call produced exactly its tokens
    assert run.tokens == {"p0": 400, "p1": 400, "q": 20}
    assert run.finished["q"] < run.finished["p0"] < run.finished["p1"]
    assert len(run.s.planner) == 0 and not run.s.requests


def test_with_no_preemption_budget_the_fresh_call_waits(env) -> None:
    env.setenv("AUTELLIX_MAX_PREEMPTIONS", "0")
    run = Run(build_scheduler(AutellixScheduler, max_num_seqs=2))
    run.add("p0", 8, 40, xargs("P", service=5.0))
    run.add("p1", 8, 40, xargs("P", service=5.0))
    run.step()
    run.add("q", 8, 20, xargs("Q"))
    assert "q" not in run.step()
    run.until("q")
    assert run.preempted == [] and run.finished["q"] > run.finished["p0"]


def test_stock_vllm_makes_the_fresh_call_wait() -> None:
    run = Run(build_scheduler(Scheduler, max_num_seqs=2))
    for rid in ("p0", "p1"):
        run.s.add_request(make_request(rid, 8, 400, priority=2))
    run.step()
    run.s.add_request(make_request("q", 8, 20, priority=0))
    run.until("q")
    assert run.finished["q"] > run.finished["p0"]  # vLLM preempts only for memory
    assert run.preempted == []


def test_calls_are_demoted_after_their_quantum(env) -> None:
    env.setenv("AUTELLIX_QUANTA", "4,8,inf")
    env.setenv("AUTELLIX_BOUNDARIES", "100,200")
    env.setenv("AUTELLIX_BETA", "inf")
    run = Run(build_scheduler(AutellixScheduler, max_num_seqs=1))
    run.add("long", 8, 100, xargs("L"))
    for _ in range(6):  # prefill + 5 decode steps: past the 4-step quantum of Q1
        run.step()
    call = run.s.planner.queue.get(run.s.requests["long"].request_id)
    assert call is not None and call.level == 1 and call.demotions == 1
    # a new call of a fresh program now ranks first and takes the only slot
    run.add("fresh", 8, 3, xargs("F"))
    assert run.step() == {"fresh"}
    assert run.preempted == ["long"]
    run.until("long")
    assert run.tokens["long"] == 100


def starving(env, beta: str, sweep_interval: float | None = None, steps: int = 1500) -> Run:
    """One long call against a stream of fresh programs on a single slot."""
    env.setenv("AUTELLIX_QUANTA", "4,8,inf")
    env.setenv("AUTELLIX_BOUNDARIES", "100,200")
    env.setenv("AUTELLIX_BETA", beta)
    run = Run(build_scheduler(AutellixScheduler, max_num_seqs=1))
    if sweep_interval is not None:
        run.s.planner.sweep_interval = run.s.planner.sweep_interval_per_call = sweep_interval
    run.add("long", 8, 60, xargs("L"))
    fresh = 0
    for _ in range(steps):
        if "long" in run.finished:
            break
        if not any(r.request_id.startswith("f") for r in run.s.requests.values()):
            run.add(f"f{fresh}", 8, 3, xargs(f"F{fresh}"))  # 3 steps: never past the Q1 quantum
            run.add(f"f{fresh}b", 8, 3, xargs(f"F{fresh}b"))
            fresh += 1
        run.step()
    return run


def test_anti_starvation_brings_a_long_call_back(env) -> None:
    run = starving(env, beta="4", sweep_interval=0.0)  # sweep every step: fake steps take microseconds
    assert "long" in run.finished and run.tokens["long"] == 60


def test_anti_starvation_with_the_default_sweep_interval(env) -> None:
    run = starving(env, beta="4", steps=200_000)
    assert "long" in run.finished and run.tokens["long"] == 60  # promotions come from the timed sweeps


def test_without_anti_starvation_the_long_call_starves(env) -> None:
    run = starving(env, beta="inf", sweep_interval=0.0)
    assert "long" not in run.finished  # the control: beta is what saved it above


def test_aborts_leave_no_call_behind(env) -> None:
    run = Run(build_scheduler(AutellixScheduler, max_num_seqs=2))
    for i in range(6):
        run.add(f"r{i}", 8, 50, xargs(f"P{i % 2}"))
    run.step()
    run.step()
    run.s.finish_requests(["r0", "r3"], RequestStatus.FINISHED_ABORTED)  # one running, one waiting
    for rid in ("r1", "r2", "r4", "r5"):
        run.until(rid)
    assert len(run.s.planner) == 0 and not run.s.requests
    assert all(run.tokens[r] == 50 for r in ("r1", "r2", "r4", "r5"))


def test_requests_without_gateway_numbers_are_their_own_programs(env) -> None:
    run = Run(build_scheduler(AutellixScheduler, max_num_seqs=4))
    run.add("plain", 8, 5)
    run.step()
    program = run.s.planner.queue.get("plain").program_id
    assert program == "request:plain"
    run.until("plain")


def test_multi_step_replans_every_n_steps(env) -> None:
    env.setenv("AUTELLIX_MULTI_STEP", "4")
    run = Run(build_scheduler(AutellixScheduler, max_num_seqs=1))
    run.add("heavy", 8, 200, xargs("H", service=50.0))
    run.step()  # step 0 plans: heavy admitted
    run.add("fresh", 8, 5, xargs("F"))
    waited = 0
    while "fresh" not in run.step():
        waited += 1
    assert 1 <= waited <= 3  # it waited for the next planning step, no longer
    run.until("heavy")
    assert run.tokens == {"heavy": 200, "fresh": 5}
