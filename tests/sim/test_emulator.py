"""The engine emulator: vLLM's HTTP API over the simulator's engine model, in real time.

In-process tests drive the aiohttp app with the real ``openai`` client; the
gateway tests run ``autellix emulate`` and ``autellix gateway`` as processes,
the way a user (or the multi-engine benchmark) does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest

from autellix.backends import parse_metrics
from autellix.protocol import RECORD_HEADER
from autellix.sim.emulator import EmulatedEngine, emulator_process
from autellix.sim.engine_profile import EngineProfile
from tests.live import gateway, http
from tests.sim.emulated import serving

MODEL = "emulated"


@contextlib.asynccontextmanager
async def running(scheduler: str = "autellix", time_scale: float = 0.2, **options: object) -> AsyncIterator[
        tuple[str, EmulatedEngine]]:
    engine = EmulatedEngine(EngineProfile.load("cpu-tiny"), scheduler=scheduler, time_scale=time_scale, **options)
    async with serving([engine]) as (base,):
        yield base, engine


async def metrics(base: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(base + "/metrics") as r:
        return parse_metrics(await r.text())


@pytest.mark.asyncio
async def test_openai_client_whole_and_streamed() -> None:
    async with running() as (base, engine):
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        whole = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=7)
        assert whole.usage is not None and whole.usage.completion_tokens == 7
        assert len(whole.choices[0].message.content or "") == 7
        assert whole.choices[0].finish_reason == "length"

        stream = await client.completions.create(model=MODEL, prompt="x" * 300, max_tokens=5, stream=True,
                                                 stream_options={"include_usage": True})
        pieces, usage = [], None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                pieces.append(chunk.choices[0].text)
            if chunk.usage is not None:
                usage = chunk.usage
        assert len(pieces) == 5
        assert usage is not None and usage.prompt_tokens == 300 and usage.completion_tokens == 5
        await client.close()

        m = await metrics(base)
        assert m["vllm:generation_tokens_total"] == 12
        assert m["vllm:request_inference_time_seconds_count"] == 2
        assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
        assert engine.model.idle and not engine.calls


@pytest.mark.asyncio
async def test_shared_prefix_hits_the_cache_and_priority_orders_the_queue() -> None:
    async with running(scheduler="vllm-priority", time_scale=1.0) as (base, _):
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        system = "s" * 2000
        await client.chat.completions.create(model=MODEL, max_tokens=2, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": "one"}])
        before = await metrics(base)
        await client.chat.completions.create(model=MODEL, max_tokens=2, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": "two"}])
        after = await metrics(base)
        hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
        assert hits >= 1024  # the system prompt's full blocks (cpu-tiny: 128-token blocks)

        # Fill the engine's 4 slots with long calls, then queue a low and a high
        # priority call: the high one (lower number) must finish first.
        busy = [asyncio.create_task(client.completions.create(model=MODEL, prompt=f"busy {i}", max_tokens=60))
                for i in range(4)]
        await asyncio.sleep(0.05)
        order: list[str] = []

        async def call(name: str, priority: int) -> None:
            await client.completions.create(model=MODEL, prompt=name, max_tokens=3,
                                            extra_body={"priority": priority})
            order.append(name)

        await asyncio.gather(call("low", 10), call("high", -10), *busy)
        assert order == ["high", "low"]
        await client.close()


@pytest.mark.asyncio
async def test_bad_input_is_an_openai_error_and_changes_nothing() -> None:
    async with running() as (base, engine):
        async with aiohttp.ClientSession() as s:
            cases = [
                ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
                ({"model": MODEL, "messages": []}, 400, "messages"),
                ({"model": MODEL, "prompt": 5}, 400, "prompt"),
                ({"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
                ({"model": MODEL, "prompt": "x", "max_tokens": 10**6}, 400, "max_tokens"),
                ({"model": MODEL, "prompt": "x" * 9000}, 400, "messages"),
                ({"model": MODEL, "prompt": "x", "vllm_xargs": [1]}, 400, "vllm_xargs"),
            ]
            for body, status, param in cases:
                path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
                async with s.post(base + path, json=body) as r:
                    answer = await r.json()
                    assert r.status == status, (body, answer)
                    assert answer["error"]["param"] == param and answer["error"]["message"]
            async with s.post(base + "/v1/completions", data=b"{not json") as r:
                assert r.status == 400
            async with s.post(base + "/emulator/faults", json={"slowdown": -1}) as r:
                assert r.status == 400 and (await r.json())["error"]["param"] == "slowdown"
            async with s.get(base + "/emulator/faults") as r:
                assert (await r.json())["slowdown"] == 1.0
        assert engine.model.idle and not engine.calls and engine.steps == 0


@pytest.mark.asyncio
async def test_feedback_records_model_time_for_the_gateway() -> None:
    async with running(scheduler="autellix") as (base, _):
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        await client.completions.create(model=MODEL, prompt="x" * 500, max_tokens=10, extra_body={
            "vllm_xargs": {"autellix_call": "c-1", "autellix_program": "p-1"}})
        await client.close()
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/autellix/v1/info") as r:
                assert r.status == 200
            async with s.get(base + "/autellix/v1/calls/c-1") as r:
                record = await r.json()
            async with s.get(base + "/autellix/v1/calls/c-1") as r:
                assert r.status == 404  # read once
        assert record["program"] == "p-1" and record["finished"]
        # cpu-tiny at time scale 0.2: positive, and no more than the call's wall time
        assert 0 < record["service_s"] < 1.0


@pytest.mark.asyncio
async def test_faults_drop_hang_and_slowdown() -> None:
    async with running(time_scale=1.0) as (base, engine):
        async with aiohttp.ClientSession() as s:
            async with s.post(base + "/emulator/faults", json={"drop_after_tokens": 2}) as r:
                assert r.status == 200
            body = {"model": MODEL, "prompt": "x", "max_tokens": 20, "stream": True}
            with pytest.raises(aiohttp.ClientPayloadError):
                async with s.post(base + "/v1/completions", json=body) as r:
                    await r.read()
            async with s.post(base + "/emulator/faults", json={"hang": True}) as r:
                assert r.status == 200
            with pytest.raises(TimeoutError):
                async with s.post(base + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1},
                                  timeout=aiohttp.ClientTimeout(total=0.5)) as r:
                    await r.read()
            async with s.delete(base + "/emulator/faults") as r:
                assert (await r.json())["hang"] is False
            timings = []
            for slowdown in (1.0, 8.0):
                async with s.post(base + "/emulator/faults", json={"slowdown": slowdown}):
                    pass
                async with s.post(base + "/v1/completions", json={"model": MODEL, "prompt": "x" * 900,
                                                                   "max_tokens": 30}) as r:
                    timings.append((await r.json())["metrics"]["generation_time_ms"])
            assert timings[1] > 3 * timings[0]
        await asyncio.sleep(0.1)
        assert not engine.calls  # the dropped and the hung calls left the engine


def test_gateway_fails_over_from_a_refusing_emulated_engine(tmp_path) -> None:
    with emulator_process(2, "--time-scale=0.2", log_path=tmp_path / "emulator.log") as engines, \
            gateway(engines, "--balancer", "round_robin", log_path=tmp_path / "gateway.log") as gw:
        status, models = http("GET", gw + "/v1/models")
        assert status == 200 and models["data"][0]["id"] == MODEL
        status, _ = http("POST", engines[0] + "/emulator/faults", {"refuse_for": 30})
        assert status == 200
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the socket closes just after the answer
            try:
                urllib.request.urlopen(engines[0] + "/health", timeout=1).close()
            except OSError:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the emulated engine kept accepting connections")
        # The gateway has not seen the refusal yet: calls routed to engine 0 fail
        # to connect and move to engine 1; every call completes.
        for i in range(4):
            status, answer = http("POST", gw + "/v1/chat/completions", {
                "model": MODEL, "messages": [{"role": "user", "content": f"call {i}"}], "max_tokens": 4})
            assert status == 200, answer
            assert answer["usage"]["completion_tokens"] == 4
        with urllib.request.urlopen(engines[1] + "/metrics") as r:
            served = parse_metrics(r.read().decode())["vllm:generation_tokens_total"]
        assert served == 16


def test_a_streamed_call_leaves_an_engine_that_accepted_it_and_hung(tmp_path) -> None:
    with emulator_process(2, "--time-scale=0.2", log_path=tmp_path / "emulator.log") as engines, \
            gateway(engines, "--balancer", "round_robin", "--stream-header-timeout", "1",
                    log_path=tmp_path / "gateway.log") as gw:
        status, _ = http("POST", engines[0] + "/emulator/faults", {"hang": True})
        assert status == 200
        client = openai.OpenAI(base_url=gw + "/v1", api_key="none", max_retries=0, timeout=30)
        waits = []
        for i in range(4):  # round robin: two of them are first sent to the hung engine
            started = time.monotonic()
            stream = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"call {i}"}], max_tokens=4, stream=True,
                stream_options={"include_usage": True})
            chunks = list(stream)
            waits.append(time.monotonic() - started)
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
        # the first call sent there waited out the timeout, then moved; the engine
        # then sat out its backoff, though its health checks pass
        assert sum(w >= 1.0 for w in waits) == 1 and max(waits) < 10
        with urllib.request.urlopen(engines[1] + "/metrics") as r:
            served = parse_metrics(r.read().decode())["vllm:generation_tokens_total"]
        assert served == 16  # every call was served by the healthy engine
        with urllib.request.urlopen(gw + "/metrics") as r:
            retries = [line for line in r.read().decode().splitlines()
                       if line.startswith("autellix_upstream_retries_total ")]
        assert retries and float(retries[0].split()[1]) >= 1


def test_gateway_in_front_of_emulated_engines_charges_their_model_time(tmp_path) -> None:
    with emulator_process(2, "--time-scale=0.2", log_path=tmp_path / "emulator.log") as engines, \
            gateway(engines, log_path=tmp_path / "gateway.log") as gw:
        status, session = http("POST", gw + "/v1/sessions", {})
        assert status == 201 or status == 200, session
        sid = session["id"]
        started = time.monotonic()
        for i in range(3):
            status, answer = http("POST", gw + "/v1/chat/completions", {
                "model": MODEL, "messages": [{"role": "user", "content": "q" * 400 + str(i)}], "max_tokens": 16},
                headers={"X-Autellix-Session": sid})
            assert status == 200, answer
        elapsed = time.monotonic() - started
        status, entry = http("GET", f"{gw}/v1/sessions/{sid}")
        assert status == 200
        assert entry["calls_done"] == 3
        # Model time comes from the emulated plugin's records: positive and less than the wall time.
        assert 0 < entry["service"] < elapsed, json.dumps(entry)
        # every record came with its answer (RECORD_HEADER), none by a request of its own
        for engine in engines:
            status, scrape = http("GET", engine + "/metrics")
            assert "autellix_emulator_record_requests_total 0.0" in scrape["text"], scrape["text"][-600:]
        # and the record stays between gateway and engine
        request = urllib.request.Request(gw + "/v1/chat/completions", method="POST", data=json.dumps({
            "model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 4}).encode(),
            headers={"Content-Type": "application/json", "X-Autellix-Session": sid})
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 200 and answer.headers.get(RECORD_HEADER) is None

