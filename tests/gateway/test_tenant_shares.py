"""Tenant shares through the gateway: weights from the keys file, what the engine is told, what admins see."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import pytest

from autellix.protocol import XARG_TENANT, XARG_TENANT_WEIGHT, XARGS_FIELD
from tests.gateway.standins import gateway_app, stand_ins
from tests.gateway.test_tenants import ADMIN, KEY_A, KEY_B, chat, request, until_healthy


@pytest.mark.asyncio
async def test_weights_reach_the_engine_with_each_call_and_the_admin_sees_each_tenants_share(tmp_path: Path) -> None:
    tenants, admin = tmp_path / "tenant-keys", tmp_path / "admin-keys"
    tenants.write_text(f"team-a {KEY_A}\nteam-a weight=3\nteam-b {KEY_B}\n")
    admin.write_text(f"operator {ADMIN}\n")
    async with stand_ins("ok") as (engine,), gateway_app([engine.url], poll_interval=0.05, api_keys_file=tenants,
                                                         admin_keys_file=admin, keys_reload_interval=0.05) as (
            base, gateway):
        await until_healthy(gateway)
        for key in (KEY_A, KEY_B):
            assert (await request("POST", base + "/v1/chat/completions", key, chat()))[0] == 200
        told = [(body[XARGS_FIELD][XARG_TENANT], body[XARGS_FIELD][XARG_TENANT_WEIGHT]) for body in engine.bodies]
        assert told == [("team-a", 3.0), ("team-b", 1.0)]

        status, listed, _ = await request("GET", gateway.admin_url + "/admin/tenants", ADMIN)
        assert status == 200
        shares = {row["tenant"]: row for row in listed["data"]}
        assert (shares["team-a"]["weight"], shares["team-b"]["weight"]) == (3.0, 1.0)
        assert all(row["calls_in_flight"] == 0 and row["service"] >= 0 for row in shares.values())
        assert (await request("GET", gateway.admin_url + "/admin/tenants", KEY_A))[0] == 401
        async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as r:
            assert 'autellix_tenant_weight{tenant="team-a"} 3.0' in await r.text()

        tenants.write_text(f"team-a {KEY_A}\nteam-b {KEY_B}\nteam-b weight=2\n")  # a reload re-weighs
        os.utime(tenants, ns=(1, 1))
        for _ in range(100):
            if gateway.store.programs.tenants.weight("team-b") == 2.0:
                break
            await asyncio.sleep(0.02)
        assert gateway.store.programs.tenants.weight("team-b") == 2.0
        assert gateway.store.programs.tenants.weight("team-a") == 1.0
