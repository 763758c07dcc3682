"""One retry budget per call, against real engine stand-ins that fail.

At most ``max_attempts`` engines per call in total, each attempt's reason in the
admin API and the metrics; never retried once bytes reached the client, nor
when a whole answer's body was being read (the call may have run)."""

from __future__ import annotations

import aiohttp
import pytest

from tests.gateway.standins import MODEL, gateway_app, get_json, metric_values, stand_ins

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def post(base: str, body: dict, **headers: str) -> tuple[int, dict | str]:
    async with aiohttp.ClientSession() as http, http.post(base + "/v1/chat/completions", json=body,
                                                          headers=headers) as r:
        text = await r.text()
        return r.status, (await r.json() if r.content_type == "application/json" else text)


@pytest.mark.asyncio
@pytest.mark.parametrize(("engines", "behaviour", "reason"), [
    (3, ["drop"], {"disconnected"}), (5, ["drop"], {"disconnected"}),
    (3, ["empty_stream"], {"stream_closed"}),
    # both failures in one pool: a retry loop around a dispatch loop would try
    # up to 3 x 3 = 9 of these engines for one call
    (9, ["drop", "drop", "empty_stream"], {"disconnected", "stream_closed"})])
async def test_one_call_against_failing_engines_makes_exactly_three_attempts(engines: int, behaviour: list[str],
                                                                             reason: set[str]) -> None:
    kinds = (behaviour * engines)[:engines]
    async with stand_ins(*kinds) as pool, \
            gateway_app([e.url for e in pool], max_attempts=3, retry_backoff=0.01) as (base, _):
        status, body = await post(base, {**CHAT, "stream": "empty_stream" in kinds})
        assert status == 502 and body["error"]["code"] == "engine_failed", body
        # What the engines saw: three engines, each once (a call dropped on a new connection is the
        # engine's failure and moves on at once: ``open_upstream``).
        tried = [e for e in pool if e.calls]
        assert len(tried) == 3
        assert all(e.calls == 1 for e in tried)
        calls = (await get_json(base, "/admin/calls"))["data"]
        assert len(calls) == 1 and calls[0]["result"] == "failed"
        attempts = calls[0]["attempts"]
        assert len(attempts) == 3 and len({a["engine"] for a in attempts}) == 3
        assert {a["reason"] for a in attempts} <= reason
        counted = await metric_values(base, "autellix_upstream_attempts_total")
        assert sum(counted.values()) == 3
        assert (await metric_values(base, "autellix_upstream_retries_total"))[""] == 2


@pytest.mark.asyncio
async def test_a_call_moves_on_from_a_failing_engine_and_succeeds() -> None:
    async with stand_ins("drop", "ok") as (bad, good), \
            gateway_app([bad.url, good.url], retry_backoff=0.01) as (base, _):
        for _ in range(4):
            status, body = await post(base, CHAT)
            assert status == 200, body
        # the failed engine leaves the pool until healthy again (one attempt there at most)
        assert good.calls == 4 and bad.calls in (0, 1)
        calls = (await get_json(base, "/admin/calls"))["data"]
        assert all(c["result"] == "ok" and c["attempts"][-1]["reason"] == "ok" for c in calls)
        assert sum(len(c["attempts"]) for c in calls) == 4 + (bad.calls > 0)


@pytest.mark.asyncio
async def test_a_whole_answer_cut_while_its_body_was_read_is_not_retried() -> None:
    async with stand_ins(*["cut_body"] * 3) as pool, gateway_app([e.url for e in pool], retry_backoff=0.01) as (
            base, _):
        status, body = await post(base, CHAT)
        assert status == 502 and body["error"]["code"] == "engine_failed", body
        assert sum(e.calls for e in pool) == 1  # two more engines could have taken it: the call may have run
        attempts = (await get_json(base, "/admin/calls"))["data"][0]["attempts"]
        assert [a["reason"] for a in attempts] == ["body_cut"]


@pytest.mark.asyncio
async def test_a_stream_cut_after_its_first_event_is_not_retried() -> None:
    async with stand_ins(*["cut_stream"] * 3) as pool, gateway_app([e.url for e in pool], retry_backoff=0.01) as (
            base, _):
        sid = (await post_session(base))["id"]
        status, text = await post(base, {**CHAT, "stream": True}, **{"X-Autellix-Session": sid})
        assert status == 200
        assert '"content":"a"' in text and "stream_interrupted" in text  # the client learns it was cut
        assert sum(e.calls for e in pool) == 1
        call = (await get_json(base, "/admin/calls"))["data"][0]
        assert len(call["attempts"]) == 1
        entry = await get_json(base, f"/v1/sessions/{sid}")
        assert entry["calls_aborted"] == 1 and entry["calls_done"] == 0 and entry["service"] == 0


async def post_session(base: str) -> dict:
    async with aiohttp.ClientSession() as http, http.post(base + "/v1/sessions") as r:
        return await r.json()
