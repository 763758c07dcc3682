"""Every bad input: a 4xx with an OpenAI-style body, and no state changed."""

from __future__ import annotations

import pytest

from tests.gateway.test_sessions_and_openai import live_programs
from tests.live import chat, gateway, http

BIG = 64 * 1024


@pytest.fixture(scope="module")
def small_gw(two_engines) -> str:
    with gateway([e.url for e in two_engines], "--max-body-bytes", str(BIG)) as base:
        yield base


CASES = [
    ("invalid json", dict(raw=b"{not json"), 400, "invalid_json"),
    ("not an object", dict(body=[1, 2]), 400, "invalid_request"),
    ("missing model", dict(body={"messages": [{"role": "user", "content": "x"}]}), 400, "invalid_request"),
    ("model wrong type", dict(body={**chat(), "model": 7}), 400, "invalid_request"),
    ("messages wrong type", dict(body={**chat(), "messages": "hi"}), 400, "invalid_request"),
    ("message without role", dict(body={**chat(), "messages": [{"content": "x"}]}), 400, "invalid_request"),
    ("stream wrong type", dict(body={**chat(), "stream": "yes"}), 400, "invalid_request"),
    ("max_tokens wrong type", dict(body={**chat(), "max_tokens": "10"}), 400, "invalid_request"),
    ("unknown model", dict(body={**chat(), "model": "gpt-9"}), 404, "model_not_found"),
    ("body too large", dict(body=chat("x" * (BIG + 10))), 413, "request_too_large"),
]


@pytest.mark.parametrize(("name", "request_kw", "status", "code"), CASES, ids=[c[0] for c in CASES])
def test_bad_request_changes_nothing(small_gw: str, name: str, request_kw: dict, status: int, code: str) -> None:
    sid = http("POST", f"{small_gw}/v1/sessions")[1]["id"]
    before, programs = http("GET", f"{small_gw}/v1/sessions/{sid}")[1], live_programs(small_gw)
    got, body = http("POST", f"{small_gw}/v1/chat/completions", headers={"X-Autellix-Session": sid}, **request_kw)
    assert got == status, body
    assert set(body["error"]) >= {"message", "type", "code"} and body["error"]["code"] == code
    assert http("GET", f"{small_gw}/v1/sessions/{sid}")[1] == before
    assert live_programs(small_gw) == programs


def test_unknown_and_ended_sessions_are_404(small_gw: str) -> None:
    status, body = http("POST", f"{small_gw}/v1/chat/completions", chat(), headers={"X-Autellix-Session": "nope"})
    assert status == 404 and body["error"]["code"] == "session_not_found"
    sid = http("POST", f"{small_gw}/v1/sessions")[1]["id"]
    assert http("DELETE", f"{small_gw}/v1/sessions/{sid}")[0] == 200
    for method, path, payload in [("POST", "/v1/chat/completions", chat()), ("GET", f"/v1/sessions/{sid}", None),
                                  ("DELETE", f"/v1/sessions/{sid}", None)]:
        status, body = http(method, small_gw + path, payload, headers={"X-Autellix-Session": sid})
        assert status == 404 and "ended" in body["error"]["message"]
    assert http("POST", f"{small_gw}/v1/completions", {"model": "tiny-llama"})[0] == 400
    assert http("GET", f"{small_gw}/v1/nothing")[1]["error"]["code"] == "not_found"


def test_api_keys_scope_sessions(two_engines, tmp_path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team keys\n  # an indented comment is no key\n"
                    "team-a key-a-0123456789abcdef\nkey-b-0123456789abcdef\n")
    with gateway([e.url for e in two_engines], "--api-keys-file", str(keys)) as base:
        a, b = {"Authorization": "Bearer key-a-0123456789abcdef"}, {"Authorization": "Bearer key-b-0123456789abcdef"}
        assert http("POST", f"{base}/v1/sessions")[0] == 401
        assert http("POST", f"{base}/v1/sessions", headers={"Authorization": "Bearer wrong"})[0] == 401
        sid = http("POST", f"{base}/v1/sessions", headers=a)[1]["id"]
        assert http("GET", f"{base}/v1/sessions/{sid}", headers=a)[0] == 200
        assert http("GET", f"{base}/v1/sessions/{sid}", headers=b)[0] == 404
        status, _ = http("POST", f"{base}/v1/chat/completions", chat(), headers={**b, "X-Autellix-Session": sid})
        assert status == 404
        assert http("DELETE", f"{base}/v1/sessions/{sid}", headers=b)[0] == 404
        assert http("POST", f"{base}/v1/chat/completions", chat(), headers={**a, "X-Autellix-Session": sid})[0] == 200
