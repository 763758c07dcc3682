"""The execution-time channel on its own: publisher, store and ASGI middleware."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("zmq")

from autellix.engine.feedback import ENV_ADDR, FeedbackMiddleware, FeedbackPublisher


async def asgi_get(app: FeedbackMiddleware, path: str, query: bytes = b"", method: str = "GET") -> tuple[int, Any]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    async def send(message: dict) -> None:
        sent.append(message)

    await app({"type": "http", "path": path, "method": method, "query_string": query}, receive, send)
    status = sent[0]["status"]
    body = orjson.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    return status, body


def wait_until(check, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_records_reach_the_server_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    addr = f"ipc://{tmp_path}/fb.sock"
    monkeypatch.setenv(ENV_ADDR, addr)
    passed_through: list[str] = []

    async def inner(scope, receive, send) -> None:
        passed_through.append(scope["path"])

    # the plugin may start first: its messages wait until the server binds
    publisher = FeedbackPublisher(addr)
    publisher.publish("hello", {"scheduler": "autellix", "config": {"policy": "atlas"}})
    app = FeedbackMiddleware(inner)
    assert app.store is not None
    wait_until(lambda: app.store.info is not None)

    async def scenario() -> None:
        assert await asgi_get(app, "/autellix/v1/info") == (200, {"scheduler": "autellix",
                                                                 "config": {"policy": "atlas"}})
        status, body = await asgi_get(app, "/autellix/v1/calls/c1", b"wait=0.05")
        assert status == 404 and body["error"]["code"] == "not_found"
        publisher.publish("call", {"call": "c1", "service_s": 0.25, "wait_s": 0.5})
        status, body = await asgi_get(app, "/autellix/v1/calls/c1", b"wait=2")  # arrives while it waits
        assert status == 200 and body["service_s"] == 0.25
        assert (await asgi_get(app, "/autellix/v1/calls/c1"))[0] == 404  # read once
        assert (await asgi_get(app, "/autellix/v1/calls/c1", method="POST"))[0] == 405
        await app({"type": "http", "path": "/v1/completions", "method": "POST"}, None, None)

    asyncio.run(scenario())
    assert passed_through == ["/v1/completions"]  # everything else goes to vLLM untouched


def test_without_the_socket_the_endpoints_answer_404(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_ADDR, raising=False)
    app = FeedbackMiddleware(None)
    assert asyncio.run(asgi_get(app, "/autellix/v1/info"))[0] == 404
    assert asyncio.run(asgi_get(app, "/autellix/v1/calls/x"))[0] == 404


def test_with_a_token_only_the_gateway_gets_past_the_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    from autellix.protocol import ENGINE_TOKEN_ENV, ENGINE_TOKEN_HEADER

    monkeypatch.delenv(ENV_ADDR, raising=False)
    monkeypatch.setenv(ENGINE_TOKEN_ENV, "s3cret-engine-token")
    reached: list[str] = []

    async def vllm(scope, receive, send) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    app = FeedbackMiddleware(vllm)

    async def get(path: str, token: str | None, method: str = "GET") -> int:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        headers = [(ENGINE_TOKEN_HEADER.lower().encode(), token.encode())] if token is not None else []
        await app({"type": "http", "path": path, "method": method, "query_string": b"", "headers": headers},
                  None, send)
        return sent[0]["status"]

    async def scenario() -> None:
        # a caller that skips the gateway: neither vLLM's routes nor the feedback records
        for path, method in [("/v1/chat/completions", "POST"), ("/v1/completions", "POST"),
                             ("/autellix/v1/calls/c1", "GET"), ("/autellix/v1/info", "GET")]:
            assert await get(path, None, method) == 401
            assert await get(path, "wrong", method) == 401
        assert reached == []
        # the probes stay open; the gateway's token gets through
        assert await get("/health", None) == 200 and await get("/metrics", None) == 200
        assert await get("/v1/chat/completions", "s3cret-engine-token", "POST") == 200
        assert await get("/autellix/v1/info", "s3cret-engine-token") == 404  # past the check: no scheduler
        assert reached == ["/health", "/metrics", "/v1/chat/completions"]

    asyncio.run(scenario())
