"""The operator without tenant rights: sessions on a tenant's behalf and drains through the gateway's
admin listener (its own URL and key), engines that take calls only with the shared token."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web

from autellix.kube.gateway_client import GatewayClient
from autellix.kube.manifests import engine_deployment
from autellix.kube.spec import SpecError, parse_engine, parse_program
from autellix.protocol import ENGINE_TOKEN_ENV

UID = "0b5c4f5e-6d7e-4f80-9a1b-2c3d4e5f6a7b"


class Recorder:
    """A stand-in gateway that answers the admin and tenant routes and records who asked."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.seen.append((request.method, request.path, request.headers.get("Authorization"), body))
        if request.method == "POST" and request.path.endswith("/sessions"):
            return web.json_response({"id": "sess-1", "object": "autellix.session"}, status=201)
        if request.path.endswith("/admin/engines"):
            return web.json_response({"data": [{"url": "http://e1", "load": 2, "inflight": 1}]})
        return web.json_response({"id": "sess-1", "calls_done": 0})


@pytest.mark.asyncio
async def test_admin_listener_carries_sessions_on_behalf_and_drains() -> None:
    recorder = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            client = GatewayClient(http, None, default_gateway="http://gw.svc", admin_url=base + "/",
                                   admin_key="admin-key")
            assert await client.open_session("http://gw.svc", "team-a") == "sess-1"
            assert await client.get_session("http://gw.svc", "sess-1") is not None
            await client.end_session("http://gw.svc", "sess-1")
            assert [e.url for e in await client.engines("http://gw.svc")] == ["http://e1"]
            await client.drain("http://gw.svc", "http://e1")
            assert recorder.seen == [
                ("POST", "/admin/sessions", "Bearer admin-key", {"tenant": "team-a"}),
                ("GET", "/admin/sessions/sess-1", "Bearer admin-key", None),
                ("DELETE", "/admin/sessions/sess-1", "Bearer admin-key", None),
                ("GET", "/admin/engines", "Bearer admin-key", None),
                ("POST", "/admin/engines/drain", "Bearer admin-key", {"url": "http://e1"}),
            ]
            # a program that names another gateway: its tenant routes (the admin listener is not its)
            recorder.seen.clear()
            other = GatewayClient(http, "tenant-key", default_gateway="http://gw.svc", admin_url="http://admin")
            assert other.admin_of(base) is None
            await other.open_session(base, "team-a")
            assert recorder.seen == [("POST", "/v1/sessions", "Bearer tenant-key", None)]
    finally:
        await runner.cleanup()


def test_program_tenant_comes_from_its_key_secret_or_spec() -> None:
    assert parse_program({"image": "a"}).tenant is None
    keyed = parse_program({"image": "a", "apiKeySecret": {"name": "autellix-tenant-keys", "key": "team-a"}})
    assert keyed.tenant == "team-a"
    named = parse_program({"image": "a", "tenant": "team-b", "apiKeySecret": {"name": "s", "key": "api-key"}})
    assert named.tenant == "team-b"
    with pytest.raises(SpecError, match=r"spec\.tenant"):
        parse_program({"image": "a", "tenant": 3})


def test_engines_get_the_shared_token_from_a_secret() -> None:
    spec = parse_engine({"model": {"name": "m", "source": {"hub": "org/m"}}})
    plain = engine_deployment("e", "ns", UID, spec)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert ENGINE_TOKEN_ENV not in {e["name"] for e in plain}
    guarded = engine_deployment("e", "ns", UID, spec, token_secret="autellix-engine-token")
    env = {e["name"]: e for e in guarded["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[ENGINE_TOKEN_ENV]["valueFrom"] == {"secretKeyRef": {"name": "autellix-engine-token", "key": "token"}}
