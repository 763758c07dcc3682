"""Draining an engine through the admin API of a real gateway process.

The two engines are experiments/instant_engine.py's stand-in (its canned answers),
served in a thread of this process with a gate: a call whose last message is
"hold" waits until the test releases it, so a call can be held in flight on
the engine being drained. Routing is read back from the process table (the
engines each program's calls ran on) and from the engines' own request logs.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from aiohttp import web

from autellix.child_processes import admin_url
from tests.live import chat, gateway_over, http, load_instant_engine, serve_on_loopback, stand_ins_on_a_thread

LONG_PROMPT = "y" * 40_000  # far above long_prompt_tokens (2048) by the gateway's byte estimate


class StandInEngine:
    """The instant engine's answers on a real port; records every chat call's
    last message; holds calls saying "hold" until ``release``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.instant = load_instant_engine()
        self.loop = loop
        self.messages: list[str] = []
        self.held = threading.Event()
        self.gate = asyncio.Event()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        last = body["messages"][-1]["content"]
        self.messages.append(last)
        if last == "hold":
            self.held.set()
            await self.gate.wait()
        return web.Response(body=self.instant.CHAT, content_type="application/json")

    async def start(self) -> None:
        app = web.Application()
        self.instant.add_probes(app)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        self.url = await serve_on_loopback(self._runner)

    async def stop(self) -> None:
        self.gate.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def release(self) -> None:
        self.loop.call_soon_threadsafe(self.gate.set)


@pytest.fixture(scope="module")
def stand_ins() -> Iterator[list[StandInEngine]]:
    with stand_ins_on_a_thread(StandInEngine, 2) as engines:
        yield engines


@pytest.fixture(scope="module")
def gw(stand_ins: list[StandInEngine]) -> Iterator[str]:
    with gateway_over([e.url for e in stand_ins], "--balancer", "autellix") as base:
        yield base


def engines_by_url(base: str) -> dict[str, dict]:
    status, body = http("GET", admin_url(base) + "/admin/engines")
    assert status == 200, body
    return {e["url"]: e for e in body["data"]}


def drain(base: str, url: str, *, undo: bool = False) -> dict:
    status, body = http("POST", admin_url(base) + ("/admin/engines/undrain" if undo else "/admin/engines/drain"),
                        {"url": url})
    assert status == 200, body
    return body


def session_call(base: str, sid: str, content: str) -> dict:
    status, body = http("POST", base + "/v1/chat/completions", chat(content), headers={"X-Autellix-Session": sid})
    assert status == 200, body
    return http("GET", f"{admin_url(base)}/admin/sessions/{sid}")[1]  # the admin's view: engines by URL


def new_session(base: str) -> str:
    return http("POST", base + "/v1/sessions")[1]["id"]


def test_listing_shows_every_engine(gw: str, stand_ins: list[StandInEngine]) -> None:
    listed = engines_by_url(gw)
    assert sorted(listed) == [e.url for e in stand_ins]
    for entry in listed.values():
        assert entry["healthy"] is True and entry["draining"] is False and entry["inflight"] == 0
        assert set(entry) >= {"url", "healthy", "load", "inflight", "draining"}


def test_a_drained_engine_gets_no_new_program_and_pins_move(gw: str, stand_ins: list[StandInEngine]) -> None:
    sid = new_session(gw)
    pinned = session_call(gw, sid, "first " + LONG_PROMPT)["pinned_engine"]
    other = next(e.url for e in stand_ins if e.url != pinned)
    try:
        assert drain(gw, pinned)["draining"] is True
        entry = session_call(gw, sid, "second " + LONG_PROMPT)
        assert entry["pinned_engine"] == other  # the long call left the drained engine, and the pin with it
        assert entry["engines"] == sorted([pinned, other])
        for i in range(6):  # new programs, short and long, never reach the drained engine
            fresh = session_call(gw, new_session(gw), f"fresh {i}" + (LONG_PROMPT if i % 2 else ""))
            assert fresh["engines"] == [other]
        assert engines_by_url(gw)[pinned]["draining"] is True
    finally:
        drain(gw, pinned, undo=True)
    assert engines_by_url(gw)[pinned]["draining"] is False


def test_undrained_engine_takes_calls_again(gw: str, stand_ins: list[StandInEngine]) -> None:
    first, second = (e.url for e in stand_ins)
    drain(gw, first)
    drain(gw, first, undo=True)
    drain(gw, second)  # with the other one drained, only the undrained engine can take calls
    try:
        assert session_call(gw, new_session(gw), "after undrain")["engines"] == [first]
    finally:
        drain(gw, second, undo=True)


def test_in_flight_call_finishes_on_a_draining_engine(gw: str, stand_ins: list[StandInEngine]) -> None:
    target = stand_ins[0]  # equal loads: the least-used choice breaks the tie by the smaller URL
    other = stand_ins[1]
    target.held.clear()
    with ThreadPoolExecutor(1) as pool:
        held: Future = pool.submit(http, "POST", gw + "/v1/chat/completions", chat("hold"))
        assert target.held.wait(20), "the held call never reached the first engine"
        try:
            assert engines_by_url(gw)[target.url]["inflight"] == 1
            drain(gw, target.url)
            before = len(other.messages)
            session_call(gw, new_session(gw), "while draining")
            assert other.messages[before:] == ["while draining"]
            listed = engines_by_url(gw)[target.url]
            assert (listed["draining"], listed["inflight"]) == (True, 1)  # drained, its call still running
        finally:
            target.release()
        status, body = held.result(20)
        assert status == 200 and body["choices"][0]["message"]["content"] == "ok"
    listed = engines_by_url(gw)[target.url]
    assert listed["inflight"] == 0 and listed["draining"] is True  # what an autoscaler waits for
    drain(gw, target.url, undo=True)


def test_draining_every_engine_makes_the_gateway_unready(gw: str, stand_ins: list[StandInEngine]) -> None:
    for engine in stand_ins:
        drain(gw, engine.url)
    try:
        assert http("GET", gw + "/ready")[0] == 503
        status, body = http("POST", gw + "/v1/chat/completions", chat("nowhere"))
        assert status == 503 and body["error"]["code"] == "no_engine_available"
    finally:
        for engine in stand_ins:
            drain(gw, engine.url, undo=True)
    assert http("GET", gw + "/ready")[0] == 200


BAD = [
    ("invalid json", dict(raw=b"{nope"), "invalid_json"),
    ("not an object", dict(body=["http://x"]), "invalid_request"),
    ("url missing", dict(body={}), "invalid_request"),
    ("url not a string", dict(body={"url": 8000}), "invalid_request"),
    ("url empty", dict(body={"url": ""}), "invalid_request"),
    ("extra key", dict(body={"url": "{first}", "force": True}), "invalid_request"),
    ("unknown engine", dict(body={"url": "http://10.0.0.1:8000"}), "engine_not_found"),
]


@pytest.mark.parametrize("route", ["drain", "undrain"])
@pytest.mark.parametrize(("name", "request_kw", "code"), BAD, ids=[b[0] for b in BAD])
def test_bad_drain_request_is_refused_and_changes_nothing(gw: str, stand_ins: list[StandInEngine], route: str,
                                                          name: str, request_kw: dict, code: str) -> None:
    if "body" in request_kw:  # the extra-key case names a real engine: only the extra key is wrong
        request_kw = {"body": json.loads(json.dumps(request_kw["body"]).replace("{first}", stand_ins[0].url))}
    before = engines_by_url(gw)
    status, body = http("POST", f"{admin_url(gw)}/admin/engines/{route}", **request_kw)
    assert status == 400, body
    assert body["error"]["code"] == code and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"]
    after = engines_by_url(gw)
    assert {u: e["draining"] for u, e in after.items()} == {u: e["draining"] for u, e in before.items()}
