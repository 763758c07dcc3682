"""Declared sizes through the gateway: the hints read, what the engine is told, and bad hints refused."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from autellix.client import async_session
from autellix.protocol import EXPECTED_TOKENS_HEADER, XARG_DECLARED, XARGS_FIELD
from tests.gateway.standins import MODEL, gateway_app, get_json, stand_ins


async def post(base: str, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(base + path, json=body, headers=headers or {}) as r:
        return r.status, await r.json(content_type=None)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}


async def declared(base: str, session: str) -> int:
    return (await get_json(base, f"/v1/sessions/{session}"))["declared_tokens"]


@pytest.mark.asyncio
async def test_each_hint_declares_and_a_declaration_only_grows() -> None:
    async with stand_ins("ok") as (engine,), gateway_app([engine.url], poll_interval=0.05) as (base, _):
        status, opened = await post(base, "/v1/sessions", {"expected_tokens": 5_000})
        assert status == 201, opened
        assert await declared(base, opened["id"]) == 5_000

        session = {"X-Autellix-Session": opened["id"]}
        for tokens in ("9000", "100"):
            headers = {**session, EXPECTED_TOKENS_HEADER: tokens}
            status, answer = await post(base, "/v1/chat/completions", chat(), headers)
            assert status == 200, answer
        assert await declared(base, opened["id"]) == 9_000

        hints = {"nvext": {"agent_hints": {"total_requests": 12, "osl": 250, "priority": 3}}}
        status, answer = await post(base, "/v1/chat/completions", chat(**hints), {"x-session-id": "nat-run"})
        assert status == 200, answer
        assert await declared(base, "nat-run") == 3_000
        osl_only = {"nvext": {"agent_hints": {"osl": 250}}}  # one call's size says nothing of the program's
        assert (await post(base, "/v1/chat/completions", chat(**osl_only), {"x-session-id": "osl-run"}))[0] == 200
        assert await declared(base, "osl-run") == 0


@pytest.mark.asyncio
async def test_the_engine_is_told_the_declared_model_time_once_the_gateway_can_reckon_it() -> None:
    async with stand_ins("ok") as (engine,), gateway_app([engine.url], poll_interval=0.05) as (base, gateway):
        headers = {"x-session-id": "sized", EXPECTED_TOKENS_HEADER: "2000"}
        assert (await post(base, "/v1/chat/completions", chat(), headers))[0] == 200
        rate = gateway.store.programs.table.seconds_per_token  # what the first call taught the gateway
        assert (await post(base, "/v1/chat/completions", chat(), headers))[0] == 200
        first, second = (body[XARGS_FIELD] for body in engine.bodies)
        assert XARG_DECLARED not in first  # no call had finished: no model time per token known yet
        assert rate > 0 and second[XARG_DECLARED] == pytest.approx(2000 * rate, rel=1e-6)


@pytest.mark.asyncio
@pytest.mark.parametrize(("path", "body", "headers", "param"), [
    ("/v1/chat/completions", chat(), {EXPECTED_TOKENS_HEADER: "lots"}, EXPECTED_TOKENS_HEADER),
    ("/v1/chat/completions", chat(), {EXPECTED_TOKENS_HEADER: "0"}, EXPECTED_TOKENS_HEADER),
    ("/v1/chat/completions", chat(nvext={"agent_hints": {"total_requests": 3, "osl": "long"}}), {},
     "nvext.agent_hints.osl"),
    ("/v1/chat/completions", chat(nvext={"agent_hints": {"total_requests": -1, "osl": 5}}), {},
     "nvext.agent_hints.total_requests"),
    ("/v1/chat/completions", chat(nvext=["agent_hints"]), {}, "nvext"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
     {EXPECTED_TOKENS_HEADER: "2.5"}, EXPECTED_TOKENS_HEADER),
], ids=["header-text", "header-zero", "osl-text", "total-negative", "nvext-list", "messages-header"])
async def test_a_bad_hint_is_a_400_that_changes_nothing(path: str, body: dict[str, Any], headers: dict[str, str],
                                                         param: str) -> None:
    async with stand_ins("ok") as (engine,), gateway_app([engine.url], poll_interval=0.05) as (base, gateway):
        status, answer = await post(base, path, body, {"x-session-id": "hinted", **headers})
        assert status == 400, answer
        if path == "/v1/messages":  # the Messages API's own error shape
            assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
        else:
            assert answer["error"]["param"] == param and answer["error"]["type"] == "invalid_request_error"
        assert engine.calls == 0 and await gateway.store.programs.load("hinted") is None


@pytest.mark.asyncio
@pytest.mark.parametrize("value", [0, -5, "many", 10**12, True])
async def test_a_bad_expected_tokens_opens_no_session(value: object) -> None:
    async with stand_ins("ok") as (engine,), gateway_app([engine.url], poll_interval=0.05) as (base, gateway):
        status, answer = await post(base, "/v1/sessions", {"expected_tokens": value})
        assert status == 400 and answer["error"]["param"] == "expected_tokens", answer
        assert len(gateway.store.programs.table) == 0


@pytest.mark.asyncio
async def test_the_client_declares_when_it_opens_its_session() -> None:
    async with (stand_ins("ok") as (engine,), gateway_app([engine.url], poll_interval=0.05) as (base, _),
                async_session(base, expected_tokens=1_234) as program):
        assert await declared(base, program.id) == 1_234
