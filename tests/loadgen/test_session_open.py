"""The load generator opens a program's session as a client SDK would: a 429 (the gateway's queue of new
programs is full) is tried again after its Retry-After, and counted; other errors fail the program."""

from __future__ import annotations

import time

import openai
import pytest
from aiohttp import web

from autellix.loadgen.runner import open_session, retry_after_s
from autellix.workloads.run_metrics import ProgramStat


async def _gateway(refusals: int, status: int = 429) -> tuple[web.AppRunner, str, list[dict]]:
    bodies: list[dict] = []

    async def sessions(request: web.Request) -> web.Response:
        bodies.append(await request.json() if request.can_read_body else {})
        if len(bodies) <= refusals:
            return web.json_response({"error": {"message": "queue full", "type": "rate_limit_error",
                                                "code": "program_queue_full"}}, status=status,
                                     headers={"Retry-After": "0"})
        return web.json_response({"id": "sess-1", "object": "autellix.session"}, status=201)

    app = web.Application()
    app.router.add_post("/v1/sessions", sessions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1", bodies


@pytest.mark.asyncio
async def test_a_refused_session_is_opened_after_its_retry_after_and_the_refusals_are_counted() -> None:
    runner, base, bodies = await _gateway(refusals=2)
    client = openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0)
    stat = ProgramStat("p", "tool-pause", time.monotonic())
    try:
        assert await open_session(client, stat, {"parent": "sess-0"}) == "sess-1"
    finally:
        await client.close()
        await runner.cleanup()
    assert stat.refused == 2 and bodies == [{"parent": "sess-0"}] * 3


@pytest.mark.asyncio
async def test_other_errors_are_not_retried() -> None:
    runner, base, bodies = await _gateway(refusals=1, status=503)
    client = openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0)
    stat = ProgramStat("p", "tool-pause", time.monotonic())
    try:
        with pytest.raises(openai.InternalServerError):
            await open_session(client, stat)
    finally:
        await client.close()
        await runner.cleanup()
    assert stat.refused == 0 and len(bodies) == 1


def test_retry_after_is_read_in_seconds() -> None:
    assert retry_after_s("7") == 7.0 and retry_after_s(None) == 1.0
    assert retry_after_s("Wed, 21 Oct 2026 07:28:00 GMT") == 1.0 and retry_after_s("-3") == 0.0
