"""The execution-time channel on its own: publisher, store and ASGI middleware."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("zmq")

from autellix.engine.feedback import ENV_ADDR, FeedbackMiddleware, FeedbackPublisher, ProgramEnds


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


def test_a_whole_answer_carries_its_record_when_it_is_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway's call id on a call puts the call's record in a 200 answer's headers (one
    request fewer per call); the record is then gone from the GET. A record that is not in yet,
    or an answer that is not a 200, leaves the record for the GET."""
    from autellix.protocol import CALL_HEADER, RECORD_HEADER

    addr = f"ipc://{tmp_path}/fb.sock"
    monkeypatch.setenv(ENV_ADDR, addr)
    statuses = {"/v1/completions": 200, "/v1/bad": 400}

    async def vllm(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": statuses[scope["path"]],
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})

    app = FeedbackMiddleware(vllm)
    publisher = FeedbackPublisher(addr)

    async def post(path: str, call_id: str | None) -> dict[bytes, bytes]:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        headers = [(CALL_HEADER.lower().encode(), call_id.encode())] if call_id else []
        await app({"type": "http", "path": path, "method": "POST", "query_string": b"", "headers": headers},
                  None, send)
        assert sent[1]["body"] == b"{}"  # the body passes untouched
        return dict(sent[0]["headers"])

    record_header = RECORD_HEADER.lower().encode()
    for call in ("c1", "c2", "c3"):  # a program id in any script must fit a header as ASCII
        publisher.publish("call", {"call": call, "program": "programme-été", "finished": True,
                                   "service_s": 0.25, "wait_s": 0.5})
    wait_until(lambda: all(app.store._records.get(c) for c in ("c1", "c2", "c3")))

    async def scenario() -> None:
        headers = await post("/v1/completions", "c1")
        record = orjson.loads(headers[record_header])
        assert record["program"] == "programme-été" and record["service_s"] == 0.25
        headers[record_header].decode("ascii")
        assert (await asgi_get(app, "/autellix/v1/calls/c1"))[0] == 404  # it went with the answer
        # not in yet: no header, nothing taken
        assert record_header not in await post("/v1/completions", "c9")
        # an error answer, or a call sent without its id: the record stays for the GET
        assert record_header not in await post("/v1/bad", "c2")
        assert record_header not in await post("/v1/completions", None)
        assert (await asgi_get(app, "/autellix/v1/calls/c2"))[0] == 200
        assert (await asgi_get(app, "/autellix/v1/calls/c3"))[0] == 200

    asyncio.run(scenario())


def test_a_sessions_end_crosses_to_the_scheduler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    addr = f"ipc://{tmp_path}/fb.sock"
    monkeypatch.setenv(ENV_ADDR, addr)
    app = FeedbackMiddleware(None)
    scheduler_side = ProgramEnds(addr)  # may bind after the API server connected: ends wait for it

    async def scenario() -> None:
        assert await asgi_get(app, "/autellix/v1/programs/team/agent-7", method="DELETE") == (
            202, {"program": "team/agent-7", "ended": True})
        status, body = await asgi_get(app, "/autellix/v1/programs/", method="DELETE")
        assert status == 404 and body["error"]["code"] == "not_found"
        assert (await asgi_get(app, "/autellix/v1/info", method="DELETE"))[0] == 405

    asyncio.run(scenario())
    ended: list[str] = []
    wait_until(lambda: bool(ended.extend(scheduler_side.take()) or ended))
    assert ended == ["team/agent-7"]
    scheduler_side.close()
