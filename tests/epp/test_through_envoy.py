"""Autellix as the endpoint picker of real Envoy, configured as GIE's reference gateway, in front of two real
vLLM engines (the tiny model, Autellix's scheduler).

Envoy has two listeners over the same picker: FailClose (a picker that cannot
answer means a 503) and FailOpen (the request goes on to any engine of the pool).
Requests that carry the picker's destination header go to an ``ORIGINAL_DST``
cluster, the others (FailOpen) round robin over the pool. The aiohttp gateway
runs beside it in front of the same engines, for the held-to-account comparison.
The last test kills the picker.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import openai
import pytest

from autellix.child_processes import free_ports
from autellix.engine.launch import EngineProcess
from autellix.epp.contract import endpoint_of
from autellix_lab.epp_local import LocalGie, PickerProcess
from autellix_lab.gie_envoy import GatewayListener
from tests.epp.conftest import fetch, metric
from tests.live import MODEL, TOKENIZER, gateway

pytestmark = pytest.mark.engine

FAIRNESS = "x-gateway-inference-fairness-id"
UPSTREAM = "x-test-upstream"
LONG_PROMPT = "y" * 2100  # > 2048 tokens with the byte-level tokenizer: Algorithm 2 pins the program


@dataclass
class Stack:
    engines: list[EngineProcess]
    gie: LocalGie
    gateway: str

    @property
    def fail_close(self) -> str:
        return self.gie.urls()[0]

    @property
    def fail_open(self) -> str:
        return self.gie.urls()[1]

    @property
    def picker(self) -> PickerProcess:
        return self.gie.picker

    def session(self, program: str) -> dict:
        status, _, body = fetch("GET", f"{self.picker.admin_url}/admin/sessions/{program}")
        assert status == 200, body
        return json.loads(body)


@pytest.fixture(scope="module")
def stack(two_engines: list[EngineProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("gie-vllm")
    urls = [e.url for e in two_engines]
    picker = PickerProcess(urls, ["--tokenizer", TOKENIZER], log_path=logs / "epp.log")
    close_port, open_port = free_ports(2)
    gie = LocalGie(picker, [GatewayListener(close_port), GatewayListener.failing_open(open_port)],
                   upstream_header=UPSTREAM, workdir=logs / "envoy")
    with gie.running(), gateway(urls, "--tokenizer", TOKENIZER) as aiohttp_gateway:
        yield Stack(two_engines, gie, aiohttp_gateway)


def call(base: str, path: str, body: dict, program: str | None = None, timeout: float = 120.0,
         ) -> tuple[int, dict[str, str], bytes]:
    return fetch("POST", base + path, body, {FAIRNESS: program} if program else {}, timeout=timeout)


def test_chat_completions_and_streams_reach_the_engine_the_picker_chose(stack: Stack) -> None:
    before = metric(fetch("GET", stack.picker.metrics_url + "/metrics")[2].decode(),
                    "autellix_model_time_source_total", source="scheduler")
    kinds = {
        "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        "completion": ("/v1/completions", {"prompt": "hi"}),
    }
    for kind, (path, fields) in kinds.items():
        for stream in (False, True):
            program = f"reach-{kind}-{stream}"
            status, headers, body = call(stack.fail_close, path, {"model": MODEL, "max_tokens": 6, "ignore_eos": True,
                                                                  "stream": stream, **fields}, program)
            assert status == 200, body
            if stream:
                events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
                assert events[-1] == "[DONE]" and len(events) >= 7  # six tokens' events, then [DONE]
                assert all(json.loads(e)["choices"] for e in events[:-1])  # no usage chunk: none was asked
            else:
                assert json.loads(body)["usage"]["completion_tokens"] == 6
            session = stack.session(program)
            assert session["calls_done"] == 1 and session["completion_tokens"] == 6
            (chosen,) = session["engines"]
            assert headers[UPSTREAM] == endpoint_of(chosen)  # the call went where the picker sent it
    text = fetch("GET", stack.picker.metrics_url + "/metrics")[2].decode()
    # the engine's own record of every call (its scheduler's model time): the annotated body reached the plugin
    assert metric(text, "autellix_model_time_source_total", source="scheduler") == before + 4


def run_programs(base: str, programs: list[str]) -> None:
    """Each program: three long calls in turn, all programs at once (an OpenAI client, as users run one)."""

    async def program(name: str) -> None:
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                                    default_headers={FAIRNESS: name})
        try:
            for turn in range(3):
                await client.chat.completions.create(
                    model=MODEL, max_tokens=4, extra_body={"ignore_eos": True},
                    messages=[{"role": "user", "content": f"{name}:{turn}" + LONG_PROMPT}])
        finally:
            await client.close()

    async def all_of_them() -> None:
        await asyncio.gather(*(program(name) for name in programs))

    asyncio.run(all_of_them())


def held_to_account(sessions: list[dict]) -> None:
    """What either transport must have done with the programs: every call counted and charged, each
    program's long calls on its one pinned engine, the pins spread over both engines."""
    for session in sessions:
        assert session["calls_done"] == 3 and session["calls_aborted"] == 0 and session["calls_active"] == 0
        assert session["service"] > 0 and session["completion_tokens"] == 12
        assert session["pinned_engine"] is not None
        assert session["engines"] == [session["pinned_engine"]]
    assert len({s["pinned_engine"] for s in sessions}) == 2


def test_programs_are_held_to_account_alike_through_the_picker_and_the_gateway(stack: Stack) -> None:
    through_gateway = [f"gw-{i}" for i in range(4)]
    run_programs(stack.gateway, through_gateway)
    held_to_account([json.loads(fetch("GET", f"{stack.gateway}/v1/sessions/{p}")[2]) for p in through_gateway])
    through_picker = [f"epp-{i}" for i in range(4)]
    run_programs(stack.fail_close, through_picker)
    held_to_account([stack.session(p) for p in through_picker])


@dataclass
class Load:
    """Calls in a loop on one listener, each recorded as (start, seconds, status); status 0: no whole answer."""

    base: str
    results: list[tuple[float, float, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body = {"model": MODEL, "max_tokens": 16, "ignore_eos": True, "stream": True,
                "messages": [{"role": "user", "content": "keep going"}]}
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                status = call(self.base, "/v1/chat/completions", body, "load", timeout=30)[0]
            except (OSError, http.client.HTTPException):  # the connection broke, or the stream was cut
                status = 0
            self.results.append((start, time.monotonic() - start, status))


def test_calls_with_the_picker_killed_fail_closed_or_open_and_none_hangs(stack: Stack) -> None:
    closed, opened = Load(stack.fail_close), Load(stack.fail_open)
    threads = [threading.Thread(target=load.run) for load in (closed, opened)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(2)
        killed = time.monotonic()
        stack.picker.kill()  # mid-run: calls are in flight through it
        time.sleep(3)
        restarting = time.monotonic()
        stack.picker.start()
        back = time.monotonic()
        time.sleep(3)
    finally:
        closed.stop.set()
        opened.stop.set()
        for thread in threads:
            thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a call hung"
    assert all(seconds < 30 for _, seconds, _ in closed.results + opened.results)

    def started(load: Load, after: float, before: float) -> list[tuple[float, float, int]]:
        return [r for r in load.results if after < r[0] and r[0] + r[1] < before]

    assert {status for *_, status in started(closed, 0, killed)} == {200}
    down_closed = started(closed, killed + 0.2, restarting)
    assert down_closed and {status for *_, status in down_closed} == {503}  # FailClose: refused...
    assert max(seconds for _, seconds, _ in down_closed) < 2.0  # ... at once
    down_open = started(opened, killed + 0.2, restarting)
    assert down_open and {status for *_, status in down_open} == {200}  # FailOpen: on to any engine
    after_closed = started(closed, back + 2.0, float("inf"))
    assert after_closed and {status for *_, status in after_closed} == {200}  # the picker is back
    assert stack.session("load")["calls_done"] >= 1  # the restarted picker holds the program again
