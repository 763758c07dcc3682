"""Model-aware routing with real parts: ``autellix emulate --model alpha`` (two
engines) and ``--model beta`` (one) behind a real ``autellix gateway``.

Every call must reach an engine that serves its model; ``/v1/models`` lists
each model once; a program that uses both models keeps a pin per model."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from autellix.backends import parse_metrics
from autellix.child_processes import admin_url
from autellix.sim.emulator import emulator_process
from tests.live import gateway, http

CALLS = 100
TOKENS = 3


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str], list[str]]]:
    logs = tmp_path_factory.mktemp("models")
    with emulator_process(2, "--time-scale=0.02", "--model", "alpha", log_path=logs / "alpha.log") as alpha, \
            emulator_process(1, "--time-scale=0.02", "--model", "beta", log_path=logs / "beta.log") as beta, \
            gateway(alpha + beta, log_path=logs / "gateway.log", env={"AUTELLIX_LONG_PROMPT_TOKENS": "64"}) as gw:
        deadline = time.monotonic() + 20
        while http("GET", gw + "/ready")[1]["engines"] < 3:  # every engine probed
            assert time.monotonic() < deadline, "not every engine joined the pool"
            time.sleep(0.1)
        yield gw, alpha, beta


def generated(urls: list[str]) -> float:
    total = 0.0
    for url in urls:
        with urllib.request.urlopen(url + "/metrics") as r:
            total += parse_metrics(r.read().decode(), {"vllm:generation_tokens_total"}).get(
                "vllm:generation_tokens_total", 0.0)
    return total


def test_every_call_reaches_an_engine_serving_its_model(mixed: tuple[str, list[str], list[str]]) -> None:
    gw, alpha, beta = mixed
    before = generated(alpha), generated(beta)

    async def one(i: int, client: openai.AsyncOpenAI) -> tuple[str, int]:
        model = ("alpha", "beta")[i % 2]
        stream = i % 4 >= 2
        messages = [{"role": "user", "content": f"call {i}"}]
        if stream:
            chunks = [c async for c in await client.chat.completions.create(
                model=model, messages=messages, max_tokens=TOKENS, stream=True,
                stream_options={"include_usage": True})]
            assert chunks[-1].usage is not None
            return chunks[0].model, chunks[-1].usage.completion_tokens
        answer = await client.chat.completions.create(model=model, messages=messages, max_tokens=TOKENS)
        assert answer.usage is not None
        return answer.model, answer.usage.completion_tokens

    async def run() -> list[tuple[str, int]]:
        async with openai.AsyncOpenAI(base_url=gw + "/v1", api_key="none", max_retries=0) as client:
            return await asyncio.gather(*(one(i, client) for i in range(CALLS)))

    results = asyncio.run(run())  # any call sent to the wrong engine would fail with 404
    assert [model for model, _ in results] == [("alpha", "beta")[i % 2] for i in range(CALLS)]
    assert all(tokens == TOKENS for _, tokens in results)
    # each model's engines generated exactly its calls' tokens
    assert generated(alpha) - before[0] == CALLS // 2 * TOKENS
    assert generated(beta) - before[1] == CALLS // 2 * TOKENS
    calls = http("GET", admin_url(gw) + "/admin/calls?limit=1000")[1]["data"]
    assert sum(len(c["attempts"]) for c in calls[:CALLS]) == CALLS  # no call was retried elsewhere
    # every call's model time came from its engine's scheduler record (the feedback channel)
    with urllib.request.urlopen(gw + "/metrics") as r:
        text = r.read().decode()
    assert parse_metrics(text, {"autellix_model_time_source_total"})["autellix_model_time_source_total"] >= CALLS
    assert 'autellix_model_time_source_total{source="scheduler"}' in text
    assert 'source="token_price"' not in text and 'source="vllm_metrics"' not in text


def test_models_are_listed_once_and_unknown_ones_are_404(mixed: tuple[str, list[str], list[str]]) -> None:
    gw, alpha, beta = mixed
    status, models = http("GET", gw + "/v1/models")
    assert status == 200 and sorted(m["id"] for m in models["data"]) == ["alpha", "beta"]
    engines = {e["url"]: e["models"] for e in http("GET", admin_url(gw) + "/admin/engines")[1]["data"]}
    assert engines == {**{u: ["alpha"] for u in alpha}, **{u: ["beta"] for u in beta}}
    status, body = http("POST", gw + "/v1/chat/completions",
                        {"model": "gamma", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert "alpha, beta" in body["error"]["message"]


def test_a_program_using_two_models_keeps_a_pin_per_model(mixed: tuple[str, list[str], list[str]]) -> None:
    gw, alpha, beta = mixed
    sid = http("POST", gw + "/v1/sessions")[1]["id"]
    long = "z" * 400  # over the gateway's long-prompt threshold (64 tokens here): the program's engine
    for turn in range(6):
        model = ("alpha", "beta")[turn % 2]
        status, answer = http("POST", gw + "/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": f"{turn}{long}"}], "max_tokens": 2},
            headers={"X-Autellix-Session": sid})
        assert status == 200, answer
    entry = http("GET", f"{admin_url(gw)}/admin/sessions/{sid}")[1]  # the admin's view: engines by URL
    assert set(entry["pins"]) == {"alpha", "beta"}
    assert entry["pins"]["alpha"] in alpha and entry["pins"]["beta"] == beta[0]
    # one pin per model: a single pin would point at an alpha engine, where the long
    # beta calls would be sent (and refused with 404)
    assert sorted(entry["engines"]) == sorted({entry["pins"]["alpha"], beta[0]})
    assert entry["calls_done"] == 6
