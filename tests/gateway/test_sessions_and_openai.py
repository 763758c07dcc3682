"""The official openai client through the gateway, and the session life cycle."""

from __future__ import annotations

import asyncio

import openai
import pytest

from autellix.client import async_session, session
from tests.live import MODEL, chat, http


def test_openai_client_chat_and_stream_in_a_session(gw: str) -> None:
    with session(gw) as s:
        whole = s.openai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=12, extra_body={"ignore_eos": True})
        assert whole.usage.completion_tokens == 12 and whole.choices[0].message.content
        chunks = list(s.openai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                       max_tokens=12, stream=True, extra_body={"ignore_eos": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert all(c.usage is None for c in chunks)  # the gateway's usage chunk is not shown unasked
        status, entry = http("GET", f"{gw}/v1/sessions/{s.id}")
        assert status == 200 and entry["service"] > 0
        assert entry["calls_done"] == 2 and entry["completion_tokens"] == 24 and entry["calls_active"] == 0
        sid = s.id
    status, body = http("GET", f"{gw}/v1/sessions/{sid}")  # ended on exit
    assert status == 404 and body["error"]["code"] == "session_not_found"


def test_completions_route_and_models(gw: str) -> None:
    client = openai.OpenAI(base_url=gw + "/v1", api_key="none")
    assert [m.id for m in client.models.list()] == [MODEL]
    out = client.completions.create(model=MODEL, prompt="abc", max_tokens=5, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 5
    chunks = list(client.completions.create(model=MODEL, prompt="abc", max_tokens=5, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5  # asked for, so kept


def test_session_ends_even_when_the_program_fails(gw: str) -> None:
    with pytest.raises(RuntimeError), session(gw) as s:
        sid = s.id
        raise RuntimeError("agent crashed")
    assert http("GET", f"{gw}/v1/sessions/{sid}")[0] == 404


def test_async_client_and_threads_grow_the_table(gw: str) -> None:
    async def program() -> dict:
        async with async_session(gw) as s:
            for _ in range(3):  # three calls, two threads in parallel each round
                await asyncio.gather(*(
                    s.openai.with_options(default_headers={"X-Autellix-Thread": t}).chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "x" * 50}], max_tokens=6,
                        extra_body={"ignore_eos": True})
                    for t in ("t1", "t2")))
            return http("GET", f"{gw}/v1/sessions/{s.id}")[1]

    entry = asyncio.run(program())
    assert entry["calls_done"] == 6 and entry["completion_tokens"] == 36 and entry["service"] > 0


def test_implicit_session_headers(gw: str) -> None:
    for header in ("x-session-id", "x-claude-code-session-id", "session_id", "session-id"):
        sid = f"agent-{header}"
        for _ in range(2):
            status, _ = http("POST", f"{gw}/v1/chat/completions", chat(), headers={header: sid})
            assert status == 200
        status, entry = http("GET", f"{gw}/v1/sessions/{sid}")
        assert status == 200 and entry["implicit"] and entry["calls_done"] == 2
        assert http("DELETE", f"{gw}/v1/sessions/{sid}")[0] == 200
        status, body = http("POST", f"{gw}/v1/chat/completions", chat(), headers={header: sid})
        assert status == 404 and "ended" in body["error"]["message"]


def test_one_call_programs_leave_no_entry(gw: str) -> None:
    before = live_programs(gw)
    assert http("POST", f"{gw}/v1/chat/completions", chat())[0] == 200
    assert live_programs(gw) == before


def live_programs(base: str) -> float:
    text = http("GET", base + "/metrics")[1]["text"]
    line = next(ln for ln in text.splitlines() if ln.startswith("autellix_live_programs "))
    return float(line.split()[1])


def test_health_ready_metrics(gw: str) -> None:
    assert http("GET", gw + "/health") == (200, {"status": "ok"})
    status, body = http("GET", gw + "/ready")
    assert status == 200 and body["engines"] == 2  # a count: engine addresses are for the admin listener
    text = http("GET", gw + "/metrics")[1]["text"]
    for name in ("autellix_requests_total", "autellix_gateway_added_latency_seconds_bucket",
                 "autellix_engine_inflight", "autellix_live_programs", "autellix_fairness_jain_index",
                 "autellix_call_waiting_seconds_bucket"):
        assert name in text, name
