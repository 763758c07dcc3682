"""The gateway's waiting rooms in simulated time: llm-d's per-program request queues and program admission."""

from __future__ import annotations

import asyncio

from autellix.sim.cost_model import StepCost
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import sim_summary, simulate_programs
from autellix.workloads import AgentProgram, fit_messages


def _profile(slots: int, kv_blocks: int = 4000) -> EngineProfile:
    return EngineProfile("test", block_size=16, kv_blocks=kv_blocks, max_num_seqs=slots, max_num_batched_tokens=512,
                         cost=StepCost(overhead=0.01, per_prefill_token=2e-5, per_decode_seq=1e-3,
                                       per_kv_token=1e-8))


def _chat(program_id: str, calls: int, *, system_bytes: int = 128, reply: int = 40,
          pause: float = 0.05) -> AgentProgram:
    async def run(llm) -> None:  # type: ignore[no-untyped-def]
        history = [{"role": "system", "content": (program_id + " rules. ") * (system_bytes // 16)}]
        for turn in range(calls):
            history = fit_messages([*history, {"role": "user", "content": f"step {turn}"}], reply)
            history.append({"role": "assistant", "content": await llm.chat(list(history), max_tokens=reply)})
            await llm.tool(pause)

    return AgentProgram("synthetic", program_id, run, expected_calls=calls)


def _fan_out(program_id: str, width: int, rounds: int) -> AgentProgram:
    async def run(llm) -> None:  # type: ignore[no-untyped-def]
        prompt = [{"role": "user", "content": f"{program_id}: split this up " * 8}]
        for _ in range(rounds):
            await asyncio.gather(*(llm.chat(prompt, max_tokens=40, thread=f"t{k}") for k in range(width)))

    return AgentProgram("synthetic", program_id, run, expected_calls=width * rounds)


def test_llmd_fairness_is_the_bare_engine_while_the_pool_is_never_saturated() -> None:
    programs = [_chat(f"p{i}", 3) for i in range(6)]
    rival = simulate_programs(programs, profile=_profile(slots=8), system="llmd-fairness", rate=0.5, seed=1)
    bare = simulate_programs(programs, profile=_profile(slots=8), system="vllm-opt", rate=0.5, seed=1)
    assert rival.extra["flow_control_held_calls"] == 0
    assert sim_summary(rival)["mean_token_latency"] == sim_summary(bare)["mean_token_latency"]


def test_llmd_fairness_holds_a_burst_and_sends_the_least_served_programs_first() -> None:
    # wide programs arrive first with 8 parallel calls each; one-call programs follow
    programs = [_fan_out(f"wide{i}", 8, 2) for i in range(4)] + [_chat(f"short{i}", 1) for i in range(6)]
    runs = {s: simulate_programs(programs, profile=_profile(slots=1), system=s, rate=50.0, seed=1)
            for s in ("llmd-fairness", "vllm-opt")}
    assert runs["llmd-fairness"].extra["flow_control_held_calls"] > 0
    for run in runs.values():
        assert sim_summary(run)["completed"] == 10

    def short_latency(system: str) -> float:
        return sum(p.finish - p.arrival for p in runs[system].result.programs if p.program_id.startswith("short"))

    # the stock engine serves the 64 wide calls queued first before them; the gateway holds all but five and,
    # once each wide program has had a call finish (service counts at completion), sends the short ones first
    assert short_latency("llmd-fairness") < 0.8 * short_latency("vllm-opt")


def test_admission_holds_new_programs_when_working_sets_outgrow_the_kv_cache() -> None:
    # contexts of ~3,000 tokens after a tool pause of 2 s; 600 blocks of 16 hold about three of them;
    # the first program finishes at once and shows the working set
    programs = [_chat("first", 1, system_bytes=2800)] + [_chat(f"p{i}", 6, system_bytes=2800, pause=2.0)
                                                         for i in range(15)]
    tight = _profile(slots=8, kv_blocks=600)
    runs = {s: simulate_programs(programs, profile=tight, system=s, rate=2.0, seed=1)
            for s in ("autellix", "autellix-no-admission")}
    admitted = sim_summary(runs["autellix"])
    assert admitted["completed"] == 16 and admitted["admission_held_programs"] > 0
    # fewer live programs: their prefixes stay cached through the pauses, less is computed again
    assert admitted["prefill_tokens"] < sim_summary(runs["autellix-no-admission"])["prefill_tokens"]


def test_admission_changes_nothing_while_the_working_sets_fit() -> None:
    programs = [_chat(f"p{i}", 4, system_bytes=512, pause=0.5) for i in range(10)]
    runs = {s: sim_summary(simulate_programs(programs, profile=_profile(slots=8), system=s, rate=4.0, seed=2))
            for s in ("autellix", "autellix-no-admission")}
    assert runs["autellix"]["admission_held_programs"] == 0
    assert runs["autellix"]["mean_token_latency"] == runs["autellix-no-admission"]["mean_token_latency"]
