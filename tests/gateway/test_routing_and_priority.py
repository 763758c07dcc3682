"""Program-aware behaviour on real engines: Algorithm 2 pinning and priority order."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from tests.live import MODEL, TOKENIZER, gateway, http

LONG_PROMPT = "y" * 2100  # > 2048 tokens with the byte-level tokenizer


def test_long_calls_stick_to_their_program_engine(gw: str) -> None:
    async def program(i: int) -> dict:
        sid = http("POST", f"{gw}/v1/sessions")[1]["id"]
        client = openai.AsyncOpenAI(base_url=gw + "/v1", api_key="none",
                                    default_headers={"X-Autellix-Session": sid})
        for turn in range(3):
            await client.chat.completions.create(
                model=MODEL, max_tokens=4, extra_body={"ignore_eos": True},
                messages=[{"role": "user", "content": f"{i}:{turn}" + LONG_PROMPT}])
        await client.close()
        return http("GET", f"{gw}/v1/sessions/{sid}")[1]

    async def run_all() -> list[dict]:
        return await asyncio.gather(*(program(i) for i in range(8)))

    entries = asyncio.run(run_all())
    for entry in entries:
        assert entry["pinned_engine"] is not None
        assert entry["engines"] == [entry["pinned_engine"]]  # every long call on the pinned engine
    assert len({e["pinned_engine"] for e in entries}) == 2  # pins spread by load over both engines


@pytest.fixture(scope="module")
def one_seq_engine(engine_cache):
    # Stock vLLM ordered by the gateway's priority (no Autellix plugin), one running
    # sequence at a time: the waiting queue's order is all that matters
    return engine_cache(scheduler="vllm-priority", max_num_seqs=1)


def _race(base: str) -> tuple[float, list[float]]:
    """P builds service, queues 4 long calls, then fresh Q sends a short one.
    Returns Q's finish time and P's queued calls' finish times."""

    async def run() -> tuple[float, list[float]]:
        def client(sid: str) -> openai.AsyncOpenAI:
            return openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                                      default_headers={"X-Autellix-Session": sid})

        p = client(http("POST", f"{base}/v1/sessions")[1]["id"])
        q = client(http("POST", f"{base}/v1/sessions")[1]["id"])

        async def call(c: openai.AsyncOpenAI, tokens: int) -> float:
            await c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "go"}],
                                            max_tokens=tokens, extra_body={"ignore_eos": True})
            return time.monotonic()

        for _ in range(3):  # P's history: about a second of service in all
            await call(p, 400)
        p_calls = [asyncio.create_task(call(p, 400)) for _ in range(4)]
        await asyncio.sleep(0.3)  # P's calls are queued at the engine
        q_done = await call(q, 10)
        return q_done, list(await asyncio.gather(*p_calls))

    return asyncio.run(run())


@pytest.mark.parametrize("policy", ["atlas", "fcfs"])
def test_a_fresh_program_overtakes_a_heavy_one(one_seq_engine, policy: str) -> None:
    with gateway([one_seq_engine.url], "--policy", policy, "--tokenizer", TOKENIZER) as base:
        q_done, p_done = _race(base)
    overtaken = sum(1 for t in p_done if t > q_done)
    if policy == "atlas":
        assert overtaken >= 3  # Q runs right after P's call already running
    else:
        assert overtaken == 0  # FCFS: Q waits behind all of P's queued calls
