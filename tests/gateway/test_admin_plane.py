"""The admin plane on its own listener with its own keys: engines, drain, calls, sessions on a tenant's behalf."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from autellix.control.keys import KeyRing, KeySource
from autellix.gateway.admin import create_admin_app
from autellix.gateway.parts import Gateway
from tests.gateway.standins import MODEL, gateway_app, stand_ins
from tests.live import serve_on_loopback

ADMIN_KEY = "admin-" + "k" * 20


@contextlib.asynccontextmanager
async def admin_listener(gateway: Gateway, keys: KeyRing | None) -> AsyncIterator[str]:
    runner = web.AppRunner(create_admin_app(gateway, keys), access_log=None)
    try:
        yield await serve_on_loopback(runner)
    finally:
        await runner.cleanup()


async def call(method: str, url: str, body: Any = None, key: str | None = ADMIN_KEY) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http, http.request(method, url, json=body, headers=headers) as r:
        return r.status, await r.json(content_type=None)


@pytest.mark.asyncio
async def test_admin_key_opens_sessions_for_a_tenant_and_drains(tmp_path: Path) -> None:
    keys_file = tmp_path / "admin-keys"
    keys_file.write_text(f"operator {ADMIN_KEY}\n")
    keys = KeyRing([KeySource(path=keys_file)], environ={})
    async with stand_ins("ok") as (engine,), gateway_app([engine.url], poll_interval=0.05) as (_base, gateway), \
            admin_listener(gateway, keys) as admin:
        # no key, a wrong key: 401 in OpenAI's shape, nothing changes
        for key in (None, "wrong-key-of-some-length"):
            status, body = await call("POST", admin + "/admin/sessions", {"tenant": "team-a"}, key=key)
            assert status == 401 and body["error"]["code"] == "invalid_admin_key"
        assert not list(gateway.store.programs.programs())

        status, opened = await call("POST", admin + "/admin/sessions", {"tenant": "team-a"})
        assert status == 201 and opened["tenant"] == "team-a"
        sid = opened["id"]
        assert (await gateway.store.programs.load(sid)).owner == "team-a"  # the tenant's, not the operator's
        status, view = await call("GET", f"{admin}/admin/sessions/{sid}")
        assert status == 200 and view["tenant"] == "team-a" and view["calls_done"] == 0
        for bad in ({"tenant": "no/slashes"}, {"tenant": 3}, {"owner": "x"}, [1]):
            status, body = await call("POST", admin + "/admin/sessions", bad)
            assert status == 400 and body["error"]["param"] == "tenant"
        status, ended = await call("DELETE", f"{admin}/admin/sessions/{sid}")
        assert status == 200 and ended["deleted"] is True
        status, body = await call("GET", f"{admin}/admin/sessions/{sid}")
        assert status == 404 and "ended" in body["error"]["message"]

        status, engines = await call("GET", admin + "/admin/engines")
        assert status == 200 and [e["url"] for e in engines["data"]] == [engine.url]
        status, drained = await call("POST", admin + "/admin/engines/drain", {"url": engine.url})
        assert status == 200 and drained["draining"] is True
        status, body = await call("POST", admin + "/admin/engines/drain", {"url": "http://nowhere"})
        assert status == 400 and body["error"]["code"] == "engine_not_found"
        status, calls = await call("GET", admin + "/admin/calls?limit=5")
        assert status == 200 and calls["object"] == "list"


@pytest.mark.asyncio
async def test_tenants_see_engine_labels_never_addresses_and_the_admin_sees_urls() -> None:
    from autellix.gateway.views import engine_label

    async with stand_ins("ok") as (engine,), gateway_app([engine.url], poll_interval=0.05) as (base, gateway):
        for _ in range(100):
            if gateway.pool is not None and gateway.pool.loads():
                break
            await asyncio.sleep(0.02)
        status, opened = await call("POST", base + "/v1/sessions", key=None)
        sid = opened["id"]
        body = {"model": MODEL, "messages": [{"role": "user", "content": "y" * 20_000}]}  # long: it pins
        async with aiohttp.ClientSession() as http, http.post(base + "/v1/chat/completions", json=body,
                                                              headers={"X-Autellix-Session": sid}) as r:
            assert r.status == 200, await r.text()
        assert gateway.store.programs.pins(sid) == {MODEL: engine.url}  # the store pins by address
        label = engine_label(engine.url)
        async with aiohttp.ClientSession() as http, http.get(f"{base}/v1/sessions/{sid}") as r:
            raw = await r.text()
        view = orjson.loads(raw)
        assert view["engines"] == [label] and view["pins"] == {MODEL: label} and view["pinned_engine"] == label
        assert engine.url not in raw and "127.0.0.1" not in raw  # no address, in any field
        assert gateway.admin_url is not None
        status, admin_view = await call("GET", f"{gateway.admin_url}/admin/sessions/{sid}", key=None)
        assert status == 200 and admin_view["engines"] == [engine.url] and admin_view["pins"] == {MODEL: engine.url}
        status, ended = await call("DELETE", f"{base}/v1/sessions/{sid}", key=None)
        assert status == 200 and ended["engines"] == [label] and engine.url not in orjson.dumps(ended).decode()
