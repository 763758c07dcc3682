"""Gateway replicas on the shared program store (real Redis) behind real Envoy: programs survive a move.

``POST /v1/sessions`` carries no program key, so Envoy opens the session on any
replica; the session's calls then hash to their own replica, which takes the
program over from Redis. A SIGKILLed replica's programs move to the others with
their state (everything up to the last write behind, at most 1 s old).
"""

from __future__ import annotations

import os
import threading
import time
import urllib.error
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPException

import pytest

from autellix.child_processes import free_port
from autellix.mesh.local import LocalMesh, LocalRedis
from autellix.mesh.resources import MeshSettings
from autellix.protocol import SESSION_HEADER
from tests.live import chat, http
from tests.mesh.conftest import REPLICAS, StandInEngine

# In CI (CI=true) a missing redis-server fails the tests instead of skipping them.
pytestmark = pytest.mark.skipif(not os.environ.get("CI") and not LocalRedis.available(),
                                reason="needs Debian's redis-server (.ci/run installs it)")


@pytest.fixture(scope="module")
def shared_mesh(engine: StandInEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMesh]:
    log_dir = tmp_path_factory.mktemp("shared-mesh")
    with LocalRedis(log_dir / "redis.log") as store, \
            LocalMesh([engine.url], REPLICAS, settings=MeshSettings(listen_port=free_port()), log_dir=log_dir,
                      store_url=store.url) as mesh:
        yield mesh


def open_session(mesh: LocalMesh) -> str:
    status, body = http("POST", mesh.url + "/v1/sessions", {})
    assert status == 201, body
    return body["id"]


def session_call(mesh: LocalMesh, session_id: str) -> tuple[int, dict]:
    return http("POST", mesh.url + "/v1/chat/completions", chat(max_tokens=1), headers={SESSION_HEADER: session_id})


def session_entry(mesh: LocalMesh, session_id: str) -> dict:
    status, body = http("GET", f"{mesh.url}/v1/sessions/{session_id}")
    assert status == 200, body
    return body


def test_a_session_opened_on_any_replica_serves_from_its_own(shared_mesh: LocalMesh) -> None:
    sessions = [open_session(shared_mesh) for _ in range(6)]
    for _ in range(3):
        for session_id in sessions:
            status, body = session_call(shared_mesh, session_id)
            assert status == 200, body  # without the shared store: 404 wherever the key hashes elsewhere
    for session_id in sessions:
        assert session_entry(shared_mesh, session_id)["calls_done"] == 3
        assert http("DELETE", f"{shared_mesh.url}/v1/sessions/{session_id}")[0] == 200
        status, body = session_call(shared_mesh, session_id)
        assert status == 404 and body["error"]["code"] == "session_not_found"


def test_programs_keep_their_state_when_their_replica_is_killed(shared_mesh: LocalMesh) -> None:
    sessions = [open_session(shared_mesh) for _ in range(24)]
    for _ in range(2):
        for session_id in sessions:
            assert session_call(shared_mesh, session_id)[0] == 200
    time.sleep(1.0)  # the interface's bound: state is written behind within a second
    before = {s: session_entry(shared_mesh, s) for s in sessions}
    victim = shared_mesh.gateways[0]

    results: list[tuple[str, int, dict]] = []
    client_retries: list[str] = []
    stop = threading.Event()

    def call_as_a_client(session_id: str) -> tuple[int, dict]:
        """What an OpenAI client does: one retry after a dropped connection or a 5xx. The issue
        allows a call in flight on the killed replica to fail once this way (counted below)."""
        try:
            status, body = session_call(shared_mesh, session_id)
        except (urllib.error.URLError, HTTPException, ConnectionError) as exc:
            status, body = 0, {"error": repr(exc)}
        if status == 0 or status >= 500:
            client_retries.append(f"{status}: {body}")
            return session_call(shared_mesh, session_id)
        return status, body

    def caller(offset: int) -> None:
        for n in range(300):  # bounded by count as well as by the stop below
            if stop.is_set():
                return
            session_id = sessions[(offset + n) % len(sessions)]
            results.append((session_id, *call_as_a_client(session_id)))

    with ThreadPoolExecutor(2) as pool:
        callers = [pool.submit(caller, offset) for offset in (0, len(sessions) // 2)]
        time.sleep(0.2)
        victim.kill()
        at_kill = len(results)
        deadline = time.monotonic() + 20
        while len(results) < at_kill + 6 * len(sessions) and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.set()
        for done in callers:
            done.result(30)
    assert [r for r in results if r[1] != 200] == []  # no 404, no 5xx: every program went on elsewhere
    # Envoy retries what the dead replica refused or reset; at most the calls in flight on it at
    # the kill (one per caller) may reach the client as a failure, and then succeed on its retry.
    assert len(client_retries) <= 2, client_retries
    # What the survivors served is written behind within a second; a replica's copy unused for a
    # second catches up with the store on its next read.
    time.sleep(2.5)  # (1 s, and margin for 2 loaded cores)
    after_kill = [r[0] for r in results[at_kill + 2:]]  # +2: calls in flight at the kill may count either way
    for session_id in sessions:
        after = session_entry(shared_mesh, session_id)
        # Nothing from before the kill is lost (the check: service at least its value a
        # second before it), and every call since the kill counts, on whichever survivor it ran
        # (calls Envoy retried on one survivor while ejecting the dead replica included).
        assert after["service"] >= before[session_id]["service"]
        assert after["calls_done"] >= before[session_id]["calls_done"] + after_kill.count(session_id), \
            (session_id, before[session_id]["calls_done"], after_kill.count(session_id), after["calls_done"])
    assert shared_mesh.envoy is not None  # and the kill was in the traffic: calls on their way to it moved
    stats = dict(line.split(": ", 1) for line in shared_mesh.envoy.admin("/stats").splitlines() if ": " in line)
    assert int(stats[f"cluster.{shared_mesh.settings.cluster_name}.upstream_rq_retry"]) > 0
