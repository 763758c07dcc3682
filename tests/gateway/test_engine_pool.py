"""The engine pool's health checks, against a real aiohttp engine stand-in."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from autellix.backends import VllmBackend, parse_metrics
from autellix.gateway import engines as engines_module
from autellix.gateway.engines import (
    MODELS_EVERY,
    SLOW_PROBES_TO_UNHEALTHY,
    EnginePool,
    StaticDiscovery,
)
from tests.gateway.standins import StandIn


def stand_in(slow: asyncio.Event) -> web.Application:
    async def health(_: web.Request) -> web.Response:
        if slow.is_set():
            await asyncio.sleep(1.0)
        return web.Response()

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    return app


@pytest.mark.asyncio
async def test_slow_health_answers_drop_an_engine_only_after_a_run_of_them() -> None:
    slow = asyncio.Event()
    async with TestServer(stand_in(slow)) as server, aiohttp.ClientSession() as http:
        url = str(server.make_url("")).rstrip("/")
        pool = EnginePool(StaticDiscovery([url]), http)
        pool.probe_timeout = 0.2
        await pool.refresh()
        assert pool.engines[url].healthy
        slow.set()
        for _ in range(SLOW_PROBES_TO_UNHEALTHY - 1):
            await pool.refresh()
            assert pool.engines[url].healthy, "a slow answer alone must not drop the engine"
        await pool.refresh()
        assert not pool.engines[url].healthy
        slow.clear()
        await pool.refresh()
        assert pool.engines[url].healthy and pool.engines[url].slow_probes == 0


@pytest.mark.asyncio
async def test_a_refused_connection_drops_the_engine_at_once() -> None:
    async with aiohttp.ClientSession() as http:
        server = TestServer(stand_in(asyncio.Event()))
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        pool = EnginePool(StaticDiscovery([url]), http)
        await pool.refresh()
        assert pool.engines[url].healthy
        await server.close()
        await pool.refresh()
        assert not pool.engines[url].healthy


@pytest.mark.asyncio
async def test_an_engine_that_hung_stays_out_though_healthy_longer_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines_module, "HUNG_BACKOFF", 0.2)
    async with TestServer(stand_in(asyncio.Event())) as server, aiohttp.ClientSession() as http:
        url = str(server.make_url("")).rstrip("/")
        pool = EnginePool(StaticDiscovery([url]), http)
        await pool.refresh()
        assert url in pool.loads()
        pool.mark_hung(url)
        await pool.refresh()  # its health checks still pass ...
        assert pool.engines[url].healthy
        assert url not in pool.loads()  # ... but it takes no new call
        assert 0 < pool.describe()[0]["hung_backoff_s"] <= 0.2
        await asyncio.sleep(0.25)
        assert url in pool.loads()
        pool.mark_hung(url)  # a second hang in a row: twice as long
        assert pool.describe()[0]["hung_backoff_s"] > 0.2
        pool.mark_answered(url)  # it answered a call: the next hang starts over
        assert pool.engines[url].hangs == 0


#: Lines as vLLM 0.32's /metrics writes them (abridged): a wanted gauge's name is
#: the prefix of another metric's, and a histogram has the wanted ``_sum``.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 5.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny-llama",reason="capacity"} 4.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny-llama",reason="deferred"} 1.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 1284.0
vllm:generation_tokens_created{engine="0",model_name="tiny-llama"} 1.7960530659047143e+09
# TYPE vllm:request_inference_time_seconds histogram
vllm:request_inference_time_seconds_sum{engine="0",model_name="tiny-llama"} 2.84
vllm:request_inference_time_seconds_bucket{engine="0",le="0.3",model_name="tiny-llama"} 40.0
vllm:request_inference_time_seconds_bucket{engine="0",le="+Inf",model_name="tiny-llama"} 44.0
vllm:request_inference_time_seconds_count{engine="0",model_name="tiny-llama"} 44.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2048"} 1.0
"""


def test_the_pool_parses_only_the_metrics_it_reads() -> None:
    everything = parse_metrics(VLLM_METRICS)
    read = parse_metrics(VLLM_METRICS, VllmBackend.pool_metrics)
    assert read == {name: everything[name] for name in VllmBackend.pool_metrics}
    assert read == {"vllm:num_requests_running": 3.0, "vllm:num_requests_waiting": 5.0,
                    "vllm:generation_tokens_total": 1284.0, "vllm:request_inference_time_seconds_sum": 2.84,
                    "vllm:kv_cache_usage_perc": 0.25}
    assert everything["vllm:num_requests_waiting_by_reason"] == 5.0  # a longer name is a different metric


def test_the_kv_capacity_is_read_from_the_cache_config_labels() -> None:
    backend = VllmBackend()
    assert backend.kv_blocks(VLLM_METRICS) == (2048, 16)
    assert backend.kv_usage(parse_metrics(VLLM_METRICS, VllmBackend.pool_metrics)) == 0.25
    assert backend.kv_blocks(VLLM_METRICS.replace('num_gpu_blocks="2048"', 'num_gpu_blocks="None"')) is None
    assert backend.kv_blocks("") is None


@pytest.mark.asyncio
async def test_served_models_are_learned_and_refreshed_with_the_health_checks() -> None:
    engine = StandIn("ok", model="alpha")
    await engine.start()
    try:
        async with aiohttp.ClientSession() as http:
            pool = EnginePool(StaticDiscovery([engine.url]), http)
            await pool.refresh()
            assert pool.candidates("alpha") == {engine.url: 0.0} and pool.candidates("beta") == {}
            engine.model = "beta"  # redeployed with another model behind the same address
            for _ in range(MODELS_EVERY):
                await pool.refresh()
            assert pool.candidates("beta") == {engine.url: 0.0} and pool.candidates("alpha") == {}
            assert [m["id"] for m in pool.models()] == ["beta"] and not pool.serves("alpha")
    finally:
        await engine.stop()
