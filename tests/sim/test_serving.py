"""The program-level simulator: agent programs on modelled engines in simulated time."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autellix.cli import app
from autellix.core import ProcessTable, SchedulerConfig
from autellix.engine.tiny_model import build_tiny_model
from autellix.sim.cost_model import StepCost
from autellix.sim.engine_model import EngineModel
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import render, sim_summary, simulate_programs, speed_stats
from autellix.sim.virtual_loop import Deadlock, run_virtual
from autellix.workloads import AgentProgram, fit_messages, make_programs
from autellix.workloads.data import workloads_available

PROFILE = EngineProfile("test", block_size=16, kv_blocks=4000, max_num_seqs=8, max_num_batched_tokens=512,
                        cost=StepCost(overhead=0.01, per_prefill_token=2e-5, per_decode_seq=1e-3, per_kv_token=1e-8))
needs_data = pytest.mark.skipif(not workloads_available(), reason="workload data not found")


def heavy_tailed(count: int, seed: int) -> list[AgentProgram]:
    """Chat programs whose number of calls is Pareto-distributed: most short, a few very long."""
    rng = random.Random(seed)
    programs = []
    for i in range(count):
        calls = min(60, int(rng.paretovariate(1.1)))
        lengths = [rng.randrange(20, 120) for _ in range(calls)]
        programs.append(_chat(f"p{i}", lengths))
    return programs


def _chat(program_id: str, lengths: list[int]) -> AgentProgram:
    async def run(llm) -> None:  # type: ignore[no-untyped-def]
        history = [{"role": "system", "content": "You are helpful. " * 8}]
        for n in lengths:
            history = fit_messages([*history, {"role": "user", "content": f"{program_id}: next question"}], n)
            history.append({"role": "assistant", "content": await llm.chat(list(history), max_tokens=n)})
            await llm.tool(0.05)

    return AgentProgram("synthetic", program_id, run, expected_calls=len(lengths))


def test_every_call_completes_with_all_its_tokens_and_time_only_moves_forward() -> None:
    programs = heavy_tailed(40, seed=1)
    run = simulate_programs(programs, profile=PROFILE, system="autellix", rate=2.0, seed=1)
    summary = sim_summary(run)
    assert summary["completed"] == 40 and summary["failed"] == 0
    assert summary["calls"] == sum(p.expected_calls or 0 for p in programs)
    for call in run.result.calls:
        assert call.submitted <= (call.first_token or 0) <= call.finished
    assert all(p.finish > p.arrival for p in run.result.programs)
    speed = speed_stats(run)
    assert speed["simulated_seconds"] > 0 and speed["events"] > 0


def test_the_simulator_is_deterministic_per_seed() -> None:
    def once(seed: int) -> dict:
        run = simulate_programs(heavy_tailed(30, seed=seed), profile=PROFILE, system="autellix", rate=3.0, seed=seed)
        return sim_summary(run)

    assert once(4) == once(4)
    assert once(4) != once(5)


def test_autellix_beats_fcfs_on_a_heavy_tailed_workload() -> None:
    # loaded (the engine busy all the time) but not so far past saturation that every
    # program waits beta times its service and anti-starvation turns the queues into FCFS
    programs = heavy_tailed(150, seed=2)
    results = {system: sim_summary(simulate_programs(programs, profile=PROFILE, system=system, rate=3.0, seed=2))
               for system in ("vllm-opt", "autellix")}
    fcfs, ours = results["vllm-opt"], results["autellix"]
    assert fcfs["completed"] == ours["completed"] == 150
    assert ours["mean_token_latency"] < 0.7 * fcfs["mean_token_latency"]
    assert ours["p99_token_latency"] < fcfs["p99_token_latency"]


@pytest.mark.parametrize("balancer", ["round_robin", "least_used", "autellix"])
def test_multi_engine_balancers_spread_the_programs(balancer: str) -> None:
    programs = heavy_tailed(40, seed=3)
    run = simulate_programs(programs, profile=PROFILE, system="autellix", rate=4.0, seed=3, engines=4,
                            config=SchedulerConfig(balancer=balancer))
    assert sim_summary(run)["completed"] == 40
    served = [s["finished_requests"] for s in run.engines.values()]
    assert len(served) == 4 and all(n > 0 for n in served)
    assert sum(served) == len(run.result.calls)


def test_more_engines_serve_the_same_load_faster() -> None:
    programs = heavy_tailed(80, seed=6)
    latency = {n: sim_summary(simulate_programs(programs, profile=PROFILE, system="vllm-opt", rate=8.0, seed=6,
                                                engines=n))["mean_token_latency"] for n in (1, 4)}
    assert latency[4] < latency[1]


def test_a_call_the_engine_refuses_fails_only_its_program() -> None:
    too_long = _chat("big", [9000])
    run = simulate_programs([too_long, _chat("ok", [10])], profile=PROFILE, system="autellix", rate=1.0, seed=0)
    errors = {p.program_id: p.error for p in run.result.programs}
    assert errors["ok"] is None and "context" in (errors["big"] or "")


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="system"):
        simulate_programs([], profile=PROFILE, system="sjf", rate=1.0, seed=0)
    with pytest.raises(ValueError, match="engines"):
        simulate_programs([], profile=PROFILE, system="vllm", rate=1.0, seed=0, engines=0)


def test_render_is_the_real_engines_prompt_and_keeps_histories_prefix_stable(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(build_tiny_model(tmp_path))
    short = [{"role": "system", "content": "rules"}, {"role": "user", "content": "hi é"}]
    longer = [*short, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    for messages in (short, longer):  # the engine's tokens are the rendered bytes
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        assert list(getattr(ids, "input_ids", ids)) == list(render(messages))
    # the next turn starts with the last prompt and the reply generated for it: all in the prefix cache
    assert render(longer).startswith(render(short) + b"hello")


def test_the_virtual_clock_runs_sleeps_instantly_and_detects_deadlock() -> None:
    async def sleeper() -> float:
        await asyncio.sleep(3600)
        return asyncio.get_running_loop().time()

    value, end = run_virtual(sleeper())
    assert value == pytest.approx(3600) and end == pytest.approx(3600)

    async def stuck() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(Deadlock):
        run_virtual(stuck())


@needs_data
def test_the_benchmark_programs_run_in_simulation_as_on_the_engine() -> None:
    programs = make_programs("bfcl", 12, seed=1)
    run = simulate_programs(programs, profile=EngineProfile.load("cpu-tiny"), system="vllm-opt", rate=1.0, seed=1)
    summary = sim_summary(run)
    assert summary["completed"] == 12
    assert summary["calls"] == sum(p.expected_calls or 0 for p in programs)
    assert 0.5 < summary["prefix_cache_hit_rate"] < 1  # calls of a program share their tool docs


@needs_data
def test_cli_sim_with_an_engine_profile_reports_speed() -> None:
    out = CliRunner().invoke(app, ["sim", "--engine-profile", "cpu-tiny", "--workload", "bfcl", "--programs", "6",
                                   "--rate", "1", "--system", "vllm,autellix", "--engines", "2", "--balancer",
                                   "algorithm2", "--stats", "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert set(data) == {"vllm", "autellix"}
    assert data["autellix"]["completed"] == 6
    assert data["autellix"]["simulator"]["events_per_second"] > 0
    assert data["autellix"]["simulator"]["sim_to_wall_ratio"] > 0
    bad = CliRunner().invoke(app, ["sim", "--engine-profile", "cpu-tiny", "--workload", "bfcl", "--system", "sjf"])
    assert bad.exit_code == 2 and "sjf" in bad.output
    bad = CliRunner().invoke(app, ["sim", "--engine-profile", "nope", "--workload", "bfcl"])
    assert bad.exit_code == 2 and "unknown engine profile" in bad.output
    bad = CliRunner().invoke(app, ["sim", "--engine-profile", "cpu-tiny", "--balancer", "random"])
    assert bad.exit_code == 2 and "balancer" in bad.output


@needs_data
def test_cli_sim_with_an_engine_profile_takes_the_queue_settings() -> None:
    def mean(*extra: str) -> float:
        out = CliRunner().invoke(app, ["sim", "--engine-profile", "cpu-tiny", "--workload", "mixed", "--programs", "12",
                                       "--rate", "2", "--seed", "3", "--max-num-seqs", "8", "--system", "autellix",
                                       "--format", "json", *extra])
        assert out.exit_code == 0, out.output
        return json.loads(out.output)["autellix"]["mean_token_latency"]

    assert mean("--boundaries", "0.1,0.4,1.6,6.4") != mean()  # the queues move the programs
    bad = CliRunner().invoke(app, ["sim", "--engine-profile", "cpu-tiny", "--workload", "mixed", "--boundaries", "3,1"])
    assert bad.exit_code == 2 and "boundaries" in bad.output


def test_decode_runs_give_the_same_outcome_as_single_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Coalescing decode steps (and cutting a run when a call arrives) is only a speed-up."""
    programs = heavy_tailed(40, seed=8)
    for system in ("vllm-opt", "autellix"):
        fast = simulate_programs(programs, profile=PROFILE, system=system, rate=3.0, seed=8)
        with monkeypatch.context() as patch:
            patch.setattr(EngineModel, "coalescible", lambda self, start, until=0.0: 0)
            slow = simulate_programs(programs, profile=PROFILE, system=system, rate=3.0, seed=8)
        assert fast.events < slow.events / 2
        assert fast.engines["engine-0"]["steps"] == slow.engines["engine-0"]["steps"]
        for a, b in zip(fast.result.programs, slow.result.programs, strict=True):
            assert (a.program_id, a.tokens) == (b.program_id, b.tokens)
            assert a.finish == pytest.approx(b.finish, rel=1e-6)


def test_client_priority_buckets_the_programs_own_token_count_by_doubling() -> None:
    from autellix.workloads import client_priority

    assert [client_priority(n) for n in (0, 63, 64, 127, 128, 255, 256, 10_000)] == [0, 0, 1, 1, 2, 2, 3, 8]


def test_client_plas_programs_send_their_own_bucketed_token_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    from autellix.workloads import client_priority

    seen: list[tuple[str | None, int]] = []
    original = EngineModel.add

    def add(self, request, now):  # type: ignore[no-untyped-def]
        seen.append((request.program_id, request.priority))
        return original(self, request, now)

    monkeypatch.setattr(EngineModel, "add", add)
    lengths = [100, 100, 100, 100]
    run = simulate_programs([_chat("p", lengths)], profile=PROFILE, system="client-plas", rate=1.0, seed=1)
    assert sim_summary(run)["completed"] == 1
    # no gateway: no program id reaches the engine; the priority is the tokens generated before each call
    assert seen == [(None, client_priority(sum(lengths[:i]))) for i in range(4)] == [(None, p) for p in (0, 1, 2, 3)]


def _wide(program_id: str, rounds: int, width: int, tokens: int) -> AgentProgram:
    async def run(llm) -> None:  # type: ignore[no-untyped-def]
        for r in range(rounds):
            await asyncio.gather(*(llm.chat([{"role": "user", "content": f"{program_id} round {r} agent {i}"}],
                                            max_tokens=tokens, thread=f"a{i}") for i in range(width)))

    return AgentProgram("synthetic", program_id, run, expected_calls=rounds * width)


def test_width_aware_atlas_keeps_wide_programs_from_buying_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chats among programs that run 8 calls at once: charged only its critical path
    (the paper's rule), a wide program keeps its place in the top queues; charged
    all its engine time, it yields to the chats and their latency falls."""
    import autellix.core.policies as policies
    from autellix.core.policies.atlas import ATLAS

    class PaperATLAS(ATLAS):
        def attained_service(self, service: float, inherited: float, model_time: float) -> float:
            return max(service, inherited + model_time)

    rng = random.Random(7)
    programs = [_wide(f"w{i}", rounds=4, width=8, tokens=100) if i % 5 == 0 else
                _chat(f"c{i}", [rng.randrange(30, 120) for _ in range(3)]) for i in range(60)]

    def chat_latency() -> float:
        run = simulate_programs(programs, profile=PROFILE, system="autellix", rate=0.8, seed=7)
        chats = [p.token_latency for p in run.result.programs if p.program_id.startswith("c")]
        return sum(chats) / len(chats)

    committed = chat_latency()
    # the charge rules alone: a round's calls in flight commit no service (``ProcessTable.view``)
    monkeypatch.setattr(ProcessTable, "_commitment", lambda self, in_flight: 0.0)
    width_aware = chat_latency()
    monkeypatch.setitem(policies._BY_NAME, "atlas", PaperATLAS)
    paper = chat_latency()
    assert width_aware < 0.5 * paper
    # charging a round as it starts keeps its calls out of Q1 until the first finishes
    assert committed < 0.9 * width_aware


def test_the_gateway_runs_each_policys_own_queue_layout() -> None:
    """The gateway's queue levels come from the policy (``Policy.queues``), as the engine plugin's do."""
    from autellix.core import QueueSpec, policy_by_name
    from autellix.sim.serving import SimGateway
    from autellix.workloads.systems import SYSTEMS

    config = SchedulerConfig()

    async def layouts() -> dict[str, QueueSpec]:
        return {name: SimGateway(SYSTEMS[name], config, {}).controller.queues for name in ("autellix", "mlfq", "vllm")}

    got = asyncio.run(layouts())
    assert got["autellix"] == policy_by_name("atlas").queues(config) == QueueSpec.from_config(config)
    assert got["mlfq"] == policy_by_name("mlfq").queues(config) != QueueSpec.from_config(config)
    assert got["vllm"] == policy_by_name("fcfs").queues(config)
