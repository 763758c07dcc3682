"""What a real gateway process tells the engines of a program beyond its calls: a call that offers tools
says the program expects to come back, and a session's end reaches the engines it ran on.

The engines are experiments/instant_engine.py's stand-in, served in a thread of this process, which
describe themselves as running Autellix's scheduler (``GET /autellix/v1/info``) and record what reaches
them: each chat call's ``vllm_xargs`` and each ``DELETE`` of a program.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from aiohttp import web

from autellix.protocol import FEEDBACK_INFO_PATH, FEEDBACK_PROGRAMS_PATH, SESSION_HEADER, XARG_EXPECT_RETURN
from tests.live import chat, gateway_over, http, load_instant_engine, serve_on_loopback, stand_ins_on_a_thread

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]


class SchedulerStandIn:
    """The instant engine's answers on a real port, as an engine running Autellix's scheduler would give
    them; records every chat call's xargs and every program ended."""

    def __init__(self) -> None:
        self.instant = load_instant_engine()
        self.xargs: list[dict] = []
        self.ended: list[str] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _chat(self, request: web.Request) -> web.Response:
        self.xargs.append((await request.json()).get("vllm_xargs") or {})
        return web.Response(body=self.instant.CHAT, content_type="application/json")

    async def _end(self, request: web.Request) -> web.Response:
        self.ended.append(request.match_info["program"])
        return web.json_response({"program": request.match_info["program"], "ended": True}, status=202)

    async def start(self) -> None:
        app = web.Application()
        self.instant.add_probes(app)
        app.router.add_get(FEEDBACK_INFO_PATH, self.instant.fixed(b'{"scheduler": "autellix"}'))
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_delete(FEEDBACK_PROGRAMS_PATH + "{program}", self._end)
        self._runner = web.AppRunner(app)
        self.url = await serve_on_loopback(self._runner)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture(scope="module")
def stand_ins() -> Iterator[list[SchedulerStandIn]]:
    with stand_ins_on_a_thread(lambda loop: SchedulerStandIn(), 2) as engines:
        yield engines


@pytest.fixture(scope="module")
def gw(stand_ins: list[SchedulerStandIn]) -> Iterator[str]:
    with gateway_over([e.url for e in stand_ins]) as base:
        yield base


def call(base: str, session: str, **extra: object) -> dict:
    status, body = http("POST", base + "/v1/chat/completions", chat(**extra), headers={SESSION_HEADER: session})
    assert status == 200, body
    return body


def test_a_call_that_offers_tools_says_its_program_expects_to_return(gw: str,
                                                                     stand_ins: list[SchedulerStandIn]) -> None:
    session = http("POST", gw + "/v1/sessions")[1]["id"]
    call(gw, session, tools=TOOLS)
    call(gw, session, tools=TOOLS, tool_choice="none")
    call(gw, session)
    sent = [x for engine in stand_ins for x in engine.xargs if x.get("autellix_program") == session]
    assert [x.get(XARG_EXPECT_RETURN) for x in sent] == [True, None, None]


def test_a_sessions_end_reaches_only_the_engines_it_ran_on(gw: str, stand_ins: list[SchedulerStandIn]) -> None:
    session = http("POST", gw + "/v1/sessions")[1]["id"]
    call(gw, session)
    ran_on = [e for e in stand_ins if any(x.get("autellix_program") == session for x in e.xargs)]
    assert len(ran_on) == 1
    status, body = http("DELETE", f"{gw}/v1/sessions/{quote(session, safe='')}")
    assert status == 200, body
    deadline = time.monotonic() + 5
    while session not in ran_on[0].ended:
        assert time.monotonic() < deadline, "the engine never heard of the session's end"
        time.sleep(0.02)
    assert all(session not in e.ended for e in stand_ins if e not in ran_on)
