"""``autellix up --gateways N`` past its engines: ``serve_mesh`` as its own process, in front of the stand-in.

(``autellix up`` itself first starts vLLM engines, most of a minute each on
this CPU; what it does after them is this one call.)
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from autellix.child_processes import free_port
from autellix.mesh.local import LocalRedis
from autellix.protocol import SESSION_HEADER
from tests.live import chat, http
from tests.mesh.conftest import StandInEngine


def test_up_serves_one_endpoint_and_stops_everything_on_sigterm(engine: StandInEngine, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    script = ("from autellix.mesh.local import serve_mesh; "
              f"serve_mesh([{engine.url!r}], 2, port={port}, gateway_args=[], gateway_env={{}})")
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        up = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert up.poll() is None, log.read_text()
            with contextlib.suppress(urllib.error.URLError, OSError), \
                    urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        while f"Envoy on {url} (the one endpoint) -> 2 gateway replicas" not in (printed := log.read_text()):
            assert time.monotonic() < deadline, printed
            time.sleep(0.1)
        replica_urls = [u.rstrip(",;") for u in printed.split() if u.startswith("http://") and u.rstrip(",;") != url]
        assert len(replica_urls) == 2
        status, session = http("POST", url + "/v1/sessions", {})
        assert status == 201
        for _ in range(3):
            assert http("POST", url + "/v1/chat/completions", chat(max_tokens=1),
                        headers={SESSION_HEADER: session["id"]})[0] == 200
        if LocalRedis.available():
            assert "program store redis://" in printed  # a local Redis, so sessions work on any replica
        up.send_signal(signal.SIGTERM)
        assert up.wait(20) == 0
        for base in [url, *replica_urls]:  # Envoy and the replicas went with it
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                raise AssertionError(f"{base} still answers after `up` stopped")
            except (urllib.error.URLError, OSError):
                pass
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)
