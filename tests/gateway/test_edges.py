"""Edge cases a security review found, each an OpenAI-style 4xx (or a correct answer), state unchanged."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
import pytest

from tests.gateway.standins import MODEL, gateway_app, stand_ins


async def post(base: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(base + "/v1/chat/completions", json=body,
                                                          headers=headers or {}) as r:
        return r.status, await r.json(content_type=None)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.mark.asyncio
@pytest.mark.parametrize(("body", "param"), [
    (chat(messages=[{"role": "wizard", "content": "hi"}]), "messages[0].role"),
    (chat(messages=[{"role": "user", "content": [{"type": "text", "text": 3}]}]), "messages[0].content[0]"),
    (chat(messages=[{"role": "user", "content": [7]}]), "messages[0].content[0]"),
    (chat(messages=[{"role": "user", "content": {"text": "x"}}]), "messages[0].content"),
    (chat(n=17), "n"),
    (chat(max_tokens=32_769), "max_tokens"),
    (chat(max_completion_tokens=10**9), "max_completion_tokens"),
    (chat(n=True), "n"),
], ids=["unknown-role", "text-not-string", "part-not-object", "content-object", "n-over", "max-tokens-over",
        "max-completion-over", "n-bool"])
async def test_bad_calls_are_400_and_reach_no_engine(body: dict[str, Any], param: str) -> None:
    async with stand_ins("ok") as (engine,), gateway_app([engine.url], poll_interval=0.05) as (base, gateway):
        status, answer = await post(base, body, {"x-session-id": "edge-program"})
        assert status == 400, answer
        assert answer["error"]["param"] == param and answer["error"]["type"] == "invalid_request_error"
        assert engine.calls == 0 and await gateway.store.programs.load("edge-program") is None  # nothing changed


@pytest.mark.asyncio
async def test_bounds_are_configurable_and_good_calls_pass() -> None:
    async with stand_ins("ok") as (engine,), gateway_app([engine.url], poll_interval=0.05, max_n=2) as (base, gw):
        for _ in range(100):
            if gw.pool is not None and gw.pool.loads():
                break
            time.sleep(0.02)
        assert (await post(base, chat(n=3)))[0] == 400
        good = chat(n=2, max_tokens=32_768,
                    messages=[{"role": "developer", "content": "be brief"},
                              {"role": "user", "content": [{"type": "text", "text": "hi"}]}])
        status, answer = await post(base, good)
        assert status == 200, answer


@pytest.mark.asyncio
async def test_session_objects_carry_unix_timestamps() -> None:
    async with stand_ins("ok") as (engine,), gateway_app([engine.url]) as (base, _), aiohttp.ClientSession() as http:
        async with http.post(base + "/v1/sessions") as r:
            sid = (await r.json())["id"]
        async with http.get(f"{base}/v1/sessions/{sid}") as r:
            created = (await r.json())["created_at"]
        assert abs(created - time.time()) < 5  # Unix time, not the monotonic clock


async def raw_request(base: str, head: bytes) -> tuple[int, bytes, bytes]:
    """Send a raw request head (no client library limits); the status, headers and body back."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head)
        await writer.drain()
        raw = await reader.read()  # the gateway closes the connection after refusing a request
    finally:
        writer.close()
    head_out, _, body = raw.partition(b"\r\n\r\n")
    return int(head_out.split(b" ", 2)[1]), head_out, body


@pytest.mark.asyncio
async def test_oversized_headers_and_request_lines_are_answered_in_the_openai_shape() -> None:
    """Up to the parser's 64 KiB a session header is the gateway's own 400; beyond it aiohttp's
    parser refuses the request before any middleware runs, and the answer is still OpenAI's shape
    (431), never plain text, on the tenants' port and on the admin listener, and never echoes the
    header back."""
    async with stand_ins("ok") as (engine,), gateway_app([engine.url]) as (base, gw):
        status, answer = await post(base, chat(), {"x-session-id": "s" * 10_000})
        assert status == 400 and answer["error"]["code"] == "invalid_header"
        secret = b"k" * 70_000
        for target, head in [
            (base, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-session-id: " + secret + b"\r\n\r\n"),
            (base, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + b"\r\n\r\n"),
            (base, b"GET /v1/sessions/" + secret + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
            (gw.admin_url, b"GET /admin/engines HTTP/1.1\r\nHost: x\r\nx-" + secret + b": 1\r\n\r\n"),
        ]:
            assert target is not None
            status, head_out, body = await raw_request(target, head)
            assert status == 431 and b"application/json" in head_out.lower(), (head_out, body[:200])
            error = orjson.loads(body)["error"]
            assert error["code"] == "header_too_large" and error["type"] == "invalid_request_error"
            assert "kkkk" not in error["message"]
        status, head_out, body = await raw_request(base, b"NOT HTTP AT ALL\r\n\r\n")
        assert status == 400 and orjson.loads(body)["error"]["code"] == "bad_http_request"


def test_engine_errors_are_relayed_in_the_openai_shape() -> None:
    """vLLM answers ``"code": 400`` (a number); OpenAI's ``code`` is a string (schemathesis found it)."""
    import orjson

    from autellix.gateway.errors import openai_error_shape

    vllm = orjson.dumps({"error": {"message": "bad prompt", "type": "BadRequestError", "param": "prompt",
                                   "code": 400}})
    assert orjson.loads(openai_error_shape(vllm))["error"] == {"message": "bad prompt", "type": "BadRequestError",
                                                               "param": "prompt", "code": "400"}
    fine = orjson.dumps({"error": {"message": "x", "type": "t", "param": None, "code": None}})
    assert openai_error_shape(fine) == fine and openai_error_shape(b"not json") == b"not json"
