"""The endpoint picker protocol through real Envoy and a real ``autellix epp``, in front of engine stand-ins.

Envoy runs the override-host policy (the picker's list in order, the endpoint it
served reported back), with four listeners: GIE's full-duplex bodies, buffered
bodies, and two with a subset hint (one naming an engine of the pool, one naming
none). The stand-ins record what reached them: the annotated body, the call id.
The tests run in file order on one stack; each leaves the stand-ins as it found them.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autellix.child_processes import free_ports
from autellix.client import session
from autellix_lab.epp_local import LocalGie, PickerProcess
from autellix_lab.gie_envoy import GatewayListener
from tests.epp.conftest import MODEL, StandIn, StandIns, fetch, metric

FAIRNESS = "x-gateway-inference-fairness-id"
UPSTREAM = "x-test-upstream"
BODY_LIMIT = 64 * 1024


class Stack:
    def __init__(self, gie: LocalGie, a: StandIn, b: StandIn, stand_ins: StandIns) -> None:
        self.gie, self.a, self.b, self.stand_ins = gie, a, b, stand_ins
        self.main, self.buffered, self.hinted, self.hinted_nowhere = gie.urls()

    @property
    def picker(self) -> PickerProcess:
        return self.gie.picker

    def admin(self, path: str) -> tuple[int, dict]:
        status, _, body = fetch("GET", self.picker.admin_url + path)
        return status, json.loads(body)

    def metrics(self) -> str:
        return fetch("GET", self.picker.metrics_url + "/metrics")[2].decode()

    def engine_at(self, endpoint: str) -> StandIn:
        return {self.a.endpoint: self.a, self.b.endpoint: self.b}[endpoint]

    def settle_loads(self, a: float, b: float) -> None:
        """Report these loads and wait until the picker has read them (its pool polls every second)."""
        self.a.running, self.b.running = a, b
        deadline = time.monotonic() + 10
        while True:
            loads = {e["url"]: e["running"] for e in self.admin("/admin/engines")[1]["data"]}
            if loads == {self.a.url: a, self.b.url: b} or time.monotonic() > deadline:
                return
            time.sleep(0.2)


@pytest.fixture(scope="module")
def stack(stand_ins: StandIns, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    a, b = stand_ins.add(), stand_ins.add()
    logs: Path = tmp_path_factory.mktemp("gie")
    picker = PickerProcess([a.url, b.url], ["--fallbacks", "1", "--tenant-max-concurrent", "1",
                                            "--max-body-bytes", str(BODY_LIMIT)], log_path=logs / "epp.log")
    ports = free_ports(4)
    listeners = [GatewayListener(ports[0]),
                 GatewayListener(ports[1], request_body="BUFFERED", response_body="BUFFERED"),
                 GatewayListener(ports[2], subset_hint=(b.endpoint,)),
                 GatewayListener(ports[3], subset_hint=("127.0.0.1:1",))]
    gie = LocalGie(picker, listeners, balancing="override_host", upstream_header=UPSTREAM, workdir=logs / "envoy")
    with gie.running():
        yield Stack(gie, a, b, stand_ins)


def chat(**extra: object) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, **extra}


def sse_events(body: bytes) -> list[str]:
    return [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]


def test_calls_reach_the_chosen_engine_annotated_for_its_scheduler(stack: Stack) -> None:
    headers = {FAIRNESS: "prog-a"}
    status, answer_headers, body = fetch("POST", stack.main + "/v1/chat/completions", chat(), headers)
    assert status == 200, body
    assert json.loads(body)["choices"][0]["message"]["content"] == "ok"
    engine = stack.engine_at(answer_headers[UPSTREAM])
    path, sent_headers, sent = engine.calls[-1]
    assert path == "/v1/chat/completions"
    xargs = sent["vllm_xargs"]
    assert xargs["autellix_program"] == "prog-a"  # the program, from GIE's fairness id
    assert sent_headers["x-autellix-call"] == xargs["autellix_call"]  # asks the engine for the call's record
    assert sent["priority"] == 0  # a fresh program: the top queue
    assert "x-gateway-destination-endpoint" not in answer_headers

    status, answer_headers, body = fetch("POST", stack.main + "/v1/chat/completions", chat(stream=True), headers)
    assert status == 200, body
    events = sse_events(body)
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]) == "firstsecond"
    # the picker asked the engine for the usage chunk, and dropped it again: the client did not ask
    assert stack.engine_at(answer_headers[UPSTREAM]).calls[-1][2]["stream_options"] == {"include_usage": True}
    status, _, body = fetch("POST", stack.main + "/v1/chat/completions",
                            chat(stream=True, stream_options={"include_usage": True}), headers)
    assert status == 200 and '"usage"' in body.decode()

    status, _, body = fetch("POST", stack.main + "/v1/completions",
                            {"model": MODEL, "prompt": "hello", "max_tokens": 4}, headers)
    assert status == 200 and json.loads(body)["choices"][0]["text"] == "ok"

    status, session = stack.admin("/admin/sessions/prog-a")
    assert status == 200, session
    assert session["calls_done"] == 4 and session["calls_aborted"] == 0
    assert session["completion_tokens"] == 1 + 2 + 2 + 1  # every answer's usage, streams' included
    assert session["service"] > 0


def test_buffered_bodies_are_routed_and_replaced_too(stack: Stack) -> None:
    status, answer_headers, body = fetch("POST", stack.buffered + "/v1/chat/completions", chat(),
                                         {FAIRNESS: "prog-buffered"})
    assert status == 200, body
    _, _, sent = stack.engine_at(answer_headers[UPSTREAM]).calls[-1]
    assert sent["vllm_xargs"]["autellix_program"] == "prog-buffered"
    assert stack.admin("/admin/sessions/prog-buffered")[1]["calls_done"] == 1


def test_a_fallback_serves_when_the_chosen_engine_takes_nothing(stack: Stack) -> None:
    before = metric(stack.metrics(), "autellix_epp_served_by_fallback_total")
    stack.settle_loads(0.0, 5.0)  # A is the least loaded: the picker chooses it, B is its fallback
    stack.a.refusing = True
    try:
        status, answer_headers, body = fetch("POST", stack.main + "/v1/chat/completions", chat(),
                                             {FAIRNESS: "prog-fallback"})
    finally:
        stack.a.refusing = False
        stack.settle_loads(0.0, 0.0)
    assert status == 200, body
    assert answer_headers[UPSTREAM] == stack.b.endpoint
    assert stack.a.calls[-1][2]["vllm_xargs"]["autellix_program"] == "prog-fallback"  # tried first
    assert metric(stack.metrics(), "autellix_epp_served_by_fallback_total") == before + 1
    session = stack.admin("/admin/sessions/prog-fallback")[1]
    assert stack.b.url in session["engines"] and session["calls_done"] == 1  # the call moved where it ran


def test_the_gateway_subset_hint_is_honoured(stack: Stack) -> None:
    stack.settle_loads(0.0, 5.0)  # A is less loaded, but the hint allows only B
    try:
        for _ in range(3):
            status, answer_headers, body = fetch("POST", stack.hinted + "/v1/chat/completions", chat(),
                                                 {FAIRNESS: "prog-hinted"})
            assert status == 200, body
            assert answer_headers[UPSTREAM] == stack.b.endpoint
    finally:
        stack.settle_loads(0.0, 0.0)
    status, headers, body = fetch("POST", stack.hinted_nowhere + "/v1/chat/completions", chat(),
                                  {FAIRNESS: "prog-nowhere"})
    assert status == 503 and json.loads(body)["error"]["type"] == "service_unavailable"
    assert headers["retry-after"] == "1"
    assert stack.admin("/admin/sessions/prog-nowhere")[0] == 404  # refused before anything changed


def test_bad_input_is_refused_in_the_api_shape_and_changes_nothing(stack: Stack) -> None:
    calls_before = len(stack.a.calls) + len(stack.b.calls)
    headers = {FAIRNESS: "prog-bad"}
    status, _, body = fetch("POST", stack.main + "/v1/chat/completions", raw=b"{not json", headers=headers)
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_json"
    status, _, body = fetch("POST", stack.main + "/v1/chat/completions", {"model": MODEL}, headers)
    assert status == 400 and json.loads(body)["error"]["param"] == "messages"
    status, _, body = fetch("POST", stack.main + "/v1/chat/completions", chat(model="no-such-model"), headers)
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
    status, _, body = fetch("POST", stack.main + "/v1/messages", {"model": MODEL, "max_tokens": 4}, headers)
    assert status == 400 and json.loads(body)["type"] == "error"  # Anthropic's shape on its API
    status, _, body = fetch("POST", stack.main + "/v1/chat/completions", chat(user="x" * 2 * BODY_LIMIT), headers)
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"  # refused mid-body
    assert stack.admin("/admin/sessions/prog-bad")[0] == 404
    assert len(stack.a.calls) + len(stack.b.calls) == calls_before


def test_a_tenant_over_its_limit_is_shed_with_429(stack: Stack) -> None:
    for engine in (stack.a, stack.b):
        stack.stand_ins.hold(engine)
    held: list[int] = []
    first = threading.Thread(target=lambda: held.append(
        fetch("POST", stack.main + "/v1/chat/completions", chat(), {FAIRNESS: "prog-held"})[0]))
    first.start()
    try:
        deadline = time.monotonic() + 10
        while not any(c[2]["vllm_xargs"]["autellix_program"] == "prog-held" for c in stack.a.calls + stack.b.calls):
            assert time.monotonic() < deadline, "the first call never reached an engine"
            time.sleep(0.05)
        status, headers, body = fetch("POST", stack.main + "/v1/chat/completions", chat(), {FAIRNESS: "prog-shed"})
        assert status == 429 and json.loads(body)["error"]["code"] == "concurrency_limit"
        assert int(headers["retry-after"]) >= 1
    finally:
        for engine in (stack.a, stack.b):
            stack.stand_ins.release(engine)
            engine.gate = None
        first.join(30)
    assert held == [200]
    assert metric(stack.metrics(), "autellix_epp_shed_total", code="concurrency_limit") >= 1
    assert stack.admin("/admin/sessions/prog-shed")[0] == 404


def test_no_ready_engine_is_an_immediate_503_and_other_requests_pass_through(stack: Stack) -> None:
    status, _, body = fetch("GET", stack.main + "/v1/models")  # no program's call: to the least-loaded engine
    assert status == 200 and json.loads(body)["data"][0]["id"] == MODEL
    stack.a.healthy = stack.b.healthy = False
    try:
        deadline = time.monotonic() + 10
        while stack.admin("/admin/engines")[1]["data"][0]["healthy"] or \
                stack.admin("/admin/engines")[1]["data"][1]["healthy"]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        status, headers, body = fetch("POST", stack.main + "/v1/chat/completions", chat(), {FAIRNESS: "prog-none"})
        assert status == 503 and headers["retry-after"] == "1", body
    finally:
        stack.a.healthy = stack.b.healthy = True
    deadline = time.monotonic() + 10
    while fetch("POST", stack.main + "/v1/chat/completions", chat())[0] != 200:
        assert time.monotonic() < deadline, "calls did not come back with the engines"
        time.sleep(0.3)
    text = stack.metrics()
    assert metric(text, "autellix_epp_decisions_total", outcome="routed") >= 8
    assert metric(text, "autellix_epp_decisions_total", outcome="passthrough") >= 1
    assert metric(text, "autellix_epp_decisions_total", outcome="unavailable") >= 2
    assert metric(text, "autellix_epp_decision_seconds_count") >= 8


def test_the_client_library_opens_and_ends_its_session_through_the_gateway(stack: Stack) -> None:
    # GET /ready says an Autellix gateway is there (the benchmark's runner opens sessions then)
    status, _, body = fetch("GET", stack.main + "/ready")
    assert status == 200 and json.loads(body) == {"ready": True, "engines": 2}
    with session(stack.main) as program:
        for _ in range(2):
            program.openai.chat.completions.create(model=MODEL, max_tokens=4,
                                                   messages=[{"role": "user", "content": "hello"}])
        status, _, body = fetch("GET", f"{stack.main}/v1/sessions/{program.id}")  # answered by the picker
        assert status == 200, body
        view = json.loads(body)
        assert view["calls_done"] == 2 and view["object"] == "autellix.session"
        assert all(label.startswith("engine-") for label in view["engines"])  # labels: no address to call
        with session(stack.main, parent=program.id) as child:
            assert stack.admin(f"/admin/sessions/{child.id}")[1]["parent"] == program.id
    status, _, body = fetch("GET", f"{stack.main}/v1/sessions/{program.id}")
    assert status == 404 and json.loads(body)["error"]["code"] == "session_not_found"  # ended on leaving
    status, _, body = fetch("POST", stack.main + "/v1/chat/completions", chat(),
                            {"X-Autellix-Session": "never-opened"})
    assert status == 404 and json.loads(body)["error"]["code"] == "session_not_found"


def test_a_client_that_leaves_mid_stream_is_charged_and_leaves_nothing_behind(stack: Stack) -> None:
    for engine in (stack.a, stack.b):
        stack.stand_ins.hold(engine)
    try:
        host, port = stack.main.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.request("POST", "/v1/chat/completions", json.dumps(chat(stream=True)),
                           {"Content-Type": "application/json", FAIRNESS: "prog-left"})
        response = connection.getresponse()
        assert response.status == 200 and b"first" in response.fp.readline() + response.fp.readline()
        assert stack.admin("/admin/sessions/prog-left")[1]["calls_active"] == 1
        connection.close()  # the client leaves with the engine still on its call
        deadline = time.monotonic() + 10
        while (session := stack.admin("/admin/sessions/prog-left")[1])["calls_active"]:
            assert time.monotonic() < deadline, session
            time.sleep(0.1)
    finally:
        for engine in (stack.a, stack.b):
            stack.stand_ins.release(engine)
            engine.gate = None
    assert session["calls_aborted"] == 1 and session["calls_done"] == 0
    deadline = time.monotonic() + 10
    while metric(stack.metrics(), "autellix_epp_streams") != 0:  # its ext_proc stream is gone too
        assert time.monotonic() < deadline
        time.sleep(0.1)
