"""Tenants apart from admins, and per-tenant limits, on a real gateway app with engine stand-ins.

* a tenant key reaches no admin route (404 on the tenants' port, 401 on the admin listener);
* a tenant at its concurrency limit gets 429 with Retry-After while another tenant is served;
* queued calls run in order, or time out with 429 queue_timeout; sessions per tenant are bounded;
* 503 carries Retry-After; /ready and /metrics name no engine address;
* keys fail closed, and a gateway beyond loopback without keys refuses to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from autellix.control.keys import KeysError
from autellix.control.limits import TenantLimits
from autellix.gateway.compose import create_app
from autellix.gateway.config import GatewayConfig
from autellix.gateway.parts import Gateway
from autellix.protocol import ENGINE_TOKEN_HEADER
from tests.gateway.standins import MODEL, add_probes, gateway_app
from tests.live import serve_on_loopback

KEY_A, KEY_B, ADMIN = "team-a-" + "a" * 20, "team-b-" + "b" * 20, "admin-" + "c" * 20
ADMIN_PATHS = [("GET", "/admin/engines"), ("POST", "/admin/engines/drain"), ("POST", "/admin/engines/undrain"),
               ("GET", "/admin/calls"), ("POST", "/admin/sessions"), ("GET", "/admin/sessions/x"),
               ("DELETE", "/admin/sessions/x")]


class SlowEngine:
    """A stand-in that answers each call after ``seconds`` (vLLM's routes the pool reads, too)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.url, self.running, self.most = seconds, "", 0, 0
        #: (path, the engine token it carried) of every request
        self.seen: list[tuple[str, str | None]] = []

    @web.middleware
    async def record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.seen.append((request.path, request.headers.get(ENGINE_TOKEN_HEADER)))
        return await handler(request)

    async def call(self, request: web.Request) -> web.Response:
        await request.read()
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.running -= 1
        return web.json_response({"id": "x", "object": "chat.completion", "model": MODEL, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[SlowEngine]:
        app = web.Application(middlewares=[self.record])
        add_probes(app)
        app.router.add_post("/v1/chat/completions", self.call)
        runner = web.AppRunner(app, access_log=None)
        self.url = await serve_on_loopback(runner)
        try:
            yield self
        finally:
            await runner.cleanup()


def keys_files(tmp_path: Path) -> dict[str, Path]:
    tenants, admin = tmp_path / "tenant-keys", tmp_path / "admin-keys"
    tenants.write_text(f"# tenants\nteam-a {KEY_A}\nteam-b {KEY_B}\n")
    admin.write_text(f"operator {ADMIN}\n")
    return {"api_keys_file": tenants, "admin_keys_file": admin}


async def request(method: str, url: str, key: str | None, body: Any = None,
                  headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http, http.request(method, url, json=body,
                                                             headers={**auth, **(headers or {})}) as r:
        return r.status, await r.json(content_type=None) if r.content_length != 0 else None, dict(r.headers)


def chat() -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


async def until_healthy(gateway: Gateway) -> None:
    for _ in range(200):
        if gateway.pool is not None and gateway.pool.loads():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("no engine joined")


@pytest.mark.asyncio
async def test_a_tenant_key_reaches_no_admin_route_and_the_admin_key_does(tmp_path: Path) -> None:
    async with SlowEngine(0.0).serving() as engine, \
            gateway_app([engine.url], poll_interval=0.05, **keys_files(tmp_path)) as (base, gateway):
        await until_healthy(gateway)
        admin = gateway.admin_url
        assert admin and admin != base
        for method, path in ADMIN_PATHS:
            for key in (KEY_A, ADMIN, None):  # the tenants' port has no admin route at all
                status, body, _ = await request(method, base + path, key, {"url": engine.url})
                assert status in (401, 404), (method, path, key, status)
                assert body["error"]["code"] in ("not_found", "invalid_api_key", "method_not_allowed")
            status, body, _ = await request(method, admin + path, KEY_A)  # a tenant key on the admin listener
            assert status == 401 and body["error"]["code"] == "invalid_admin_key"
        status, engines, _ = await request("GET", admin + "/admin/engines", ADMIN)
        assert status == 200 and [e["url"] for e in engines["data"]] == [engine.url]
        # a session opened for team-a by the admin key is team-a's: team-a uses it, team-b cannot see it
        status, opened, _ = await request("POST", admin + "/admin/sessions", ADMIN, {"tenant": "team-a"})
        assert status == 201
        sid = opened["id"]
        assert (await request("GET", f"{base}/v1/sessions/{sid}", KEY_A))[0] == 200
        assert (await request("GET", f"{base}/v1/sessions/{sid}", KEY_B))[0] == 404
        status, _, _ = await request("POST", base + "/v1/chat/completions", KEY_A, chat(),
                                     {"X-Autellix-Session": sid})
        assert status == 200
        # neither probes nor metrics give an engine's address to tenants
        status, ready, _ = await request("GET", base + "/ready", None)
        assert status == 200 and ready == {"ready": True, "engines": 1}
        async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as r:
            assert engine.url.removeprefix("http://") not in await r.text()


@pytest.mark.asyncio
async def test_a_flooding_tenant_gets_429_with_retry_after_and_another_is_served(tmp_path: Path) -> None:
    limits = TenantLimits(max_concurrent=2, max_queued=1, queue_timeout_s=5)
    async with SlowEngine(0.3).serving() as engine, \
            gateway_app([engine.url], poll_interval=0.05, tenant_limits=limits, **keys_files(tmp_path)) as (
                base, gateway):
        await until_healthy(gateway)
        flood = [request("POST", base + "/v1/chat/completions", KEY_A, chat()) for _ in range(6)]
        other = request("POST", base + "/v1/chat/completions", KEY_B, chat())
        results = await asyncio.gather(*flood, other)
        flooded, served = results[:6], results[6]
        assert sorted(status for status, _, _ in flooded) == [200, 200, 200, 429, 429, 429]
        for status, body, headers in flooded:
            if status == 429:
                assert body["error"]["code"] == "concurrency_limit" and body["error"]["type"] == "rate_limit_error"
                assert int(headers["Retry-After"]) >= 1
        assert served[0] == 200  # team-b has its own slots
        assert engine.most <= 3  # team-a never ran more than 2 at once; team-b's 1 beside them
        usage = {row["tenant"]: row for row in gateway.limiter.describe(0.0)}
        assert usage["team-a"]["running"] == 0 and usage["team-a"]["queued"] == 0  # every slot given back


@pytest.mark.asyncio
async def test_a_queued_call_times_out_with_429(tmp_path: Path) -> None:
    limits = TenantLimits(max_concurrent=1, max_queued=1, queue_timeout_s=0.2)
    async with SlowEngine(0.6).serving() as engine, \
            gateway_app([engine.url], poll_interval=0.05, tenant_limits=limits, **keys_files(tmp_path)) as (
                base, gateway):
        await until_healthy(gateway)
        first = asyncio.ensure_future(request("POST", base + "/v1/chat/completions", KEY_A, chat()))
        await asyncio.sleep(0.1)
        status, body, headers = await request("POST", base + "/v1/chat/completions", KEY_A, chat())
        assert status == 429 and body["error"]["code"] == "queue_timeout" and "Retry-After" in headers
        assert (await first)[0] == 200


@pytest.mark.asyncio
async def test_sessions_per_tenant_are_bounded(tmp_path: Path) -> None:
    async with SlowEngine(0.0).serving() as engine, \
            gateway_app([engine.url], tenant_limits=TenantLimits(max_sessions=2), **keys_files(tmp_path)) as (
                base, gateway):
        ids = [(await request("POST", base + "/v1/sessions", KEY_A))[1]["id"] for _ in range(2)]
        status, body, headers = await request("POST", base + "/v1/sessions", KEY_A)
        assert status == 429 and body["error"]["code"] == "session_limit" and "Retry-After" in headers
        assert len(list(gateway.store.programs.programs())) == 2  # the refused one opened nothing
        assert (await request("POST", base + "/v1/sessions", KEY_B))[0] == 201  # another tenant's own bound
        assert (await request("DELETE", f"{base}/v1/sessions/{ids[0]}", KEY_A))[0] == 200
        assert (await request("POST", base + "/v1/sessions", KEY_A))[0] == 201


@pytest.mark.asyncio
async def test_503_says_when_to_come_back() -> None:
    async with gateway_app(["http://127.0.0.1:9"], poll_interval=0.05) as (base, _):
        status, body, headers = await request("POST", base + "/v1/chat/completions", None, chat())
        assert status == 503 and body["error"]["code"] == "no_engine_available" and headers["Retry-After"] == "1"


def test_keys_fail_closed(tmp_path: Path) -> None:
    empty = tmp_path / "keys"
    empty.write_text("# all comments\n   # and an indented one\n")
    with pytest.raises(KeysError, match="no key"):
        create_app(GatewayConfig(engines=["http://127.0.0.1:9"], api_keys_file=empty))


def test_beyond_loopback_needs_keys_or_allow_anonymous(tmp_path: Path) -> None:
    open_gateway = create_app(GatewayConfig(engines=["http://127.0.0.1:9"]))
    from autellix.gateway.parts import GATEWAY_KEY

    assert open_gateway[GATEWAY_KEY].exposure_error("127.0.0.1") is None
    assert "without tenant keys" in open_gateway[GATEWAY_KEY].exposure_error("0.0.0.0")
    allowed = create_app(GatewayConfig(engines=["http://127.0.0.1:9"], allow_anonymous=True))
    assert allowed[GATEWAY_KEY].exposure_error("0.0.0.0") is None
    keyed = create_app(GatewayConfig(engines=["http://127.0.0.1:9"], admin_port=9000, admin_host="0.0.0.0",
                                     **keys_files(tmp_path)))
    assert keyed[GATEWAY_KEY].exposure_error("0.0.0.0") is None
    no_admin_keys = create_app(GatewayConfig(engines=["http://127.0.0.1:9"], admin_port=9000, admin_host="0.0.0.0",
                                             allow_anonymous=True))
    assert "without admin keys" in no_admin_keys[GATEWAY_KEY].exposure_error("0.0.0.0")
    # the command refuses before it listens
    done = subprocess.run([sys.executable, "-m", "autellix", "gateway", "--host", "0.0.0.0", "--engine",
                           "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "without tenant keys" in done.stderr + done.stdout


@pytest.mark.asyncio
async def test_every_request_to_an_engine_carries_the_engine_token() -> None:
    async with SlowEngine(0.0).serving() as engine, \
            gateway_app([engine.url], poll_interval=0.05, engine_token="shared-engine-token") as (base, gateway):
        await until_healthy(gateway)
        assert (await request("POST", base + "/v1/chat/completions", None, chat()))[0] == 200
        paths = {path for path, _ in engine.seen}
        assert {"/health", "/metrics", "/v1/models", "/v1/chat/completions"} <= paths
        assert {token for _, token in engine.seen} == {"shared-engine-token"}


class FailingEngine(SlowEngine):
    """Answers 500 to every call while ``failing``; its health checks pass all along."""

    failing = True

    async def call(self, request: web.Request) -> web.Response:
        if self.failing:
            await request.read()
            return web.json_response({"error": {"message": "boom"}}, status=500)
        return await super().call(request)


@pytest.mark.asyncio
async def test_engine_5xx_open_its_breaker_until_a_probe_call_succeeds() -> None:
    from autellix.control.breaker import BreakerConfig

    async with FailingEngine(0.0).serving() as engine, \
            gateway_app([engine.url], poll_interval=0.05) as (base, gateway):
        await until_healthy(gateway)
        assert gateway.pool is not None
        gateway.pool.engines[engine.url].breaker = breaker = type(gateway.pool.engines[engine.url].breaker)(
            BreakerConfig(window_s=10, min_failures=3, failure_ratio=0.5, cooldown_s=0.3))
        for _ in range(3):  # health checks pass, but its answers are 500s
            assert (await request("POST", base + "/v1/chat/completions", None, chat()))[0] == 500
        status, body, headers = await request("POST", base + "/v1/chat/completions", None, chat())
        assert status == 503 and headers["Retry-After"] == "1"  # open: no call goes there
        assert body["error"]["code"] == "no_engine_available"
        status, engines, _ = await request("GET", gateway.admin_url + "/admin/engines", None)
        assert engines["data"][0]["breaker"]["state"] == "open"
        async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as r:
            assert "autellix_engine_breaker_open{engine=" in await r.text()
        engine.failing = False
        await asyncio.sleep(0.35)  # the cooldown: one probe call goes through and closes it
        assert (await request("POST", base + "/v1/chat/completions", None, chat()))[0] == 200
        assert breaker.state(time.monotonic()).value == "closed"


@pytest.mark.asyncio
async def test_implicit_ids_are_per_tenant_and_fresh_programs_inherit_their_tenants_standing(
        tmp_path: Path) -> None:
    async with SlowEngine(0.05).serving() as engine, \
            gateway_app([engine.url], poll_interval=0.05, **keys_files(tmp_path)) as (base, gateway):
        await until_healthy(gateway)
        same = {"x-session-id": "run-1"}
        assert (await request("POST", base + "/v1/chat/completions", KEY_A, chat(), same))[0] == 200
        assert (await request("POST", base + "/v1/chat/completions", KEY_B, chat(), same))[0] == 200  # not a 404
        a_view = (await request("GET", base + "/v1/sessions/run-1", KEY_A))[1]
        b_view = (await request("GET", base + "/v1/sessions/run-1", KEY_B))[1]
        assert a_view["id"] == "team-a/run-1" and b_view["id"] == "team-b/run-1"
        assert a_view["calls_done"] == b_view["calls_done"] == 1

        # team-a's one-call programs leave their service to team-a's next new program; team-b is untouched
        for _ in range(3):
            assert (await request("POST", base + "/v1/chat/completions", KEY_A, chat()))[0] == 200
        carried = gateway.sessions.standing.carry("team-a", time.monotonic())
        assert carried > 0
        fresh_a = (await request("POST", base + "/v1/sessions", KEY_A))[1]["id"]
        fresh_b = (await request("POST", base + "/v1/sessions", KEY_B))[1]["id"]
        a_service = (await request("GET", f"{base}/v1/sessions/{fresh_a}", KEY_A))[1]["service"]
        assert a_service == pytest.approx(carried, rel=0.05)
        assert (await request("GET", f"{base}/v1/sessions/{fresh_b}", KEY_B))[1]["service"] == 0.0
