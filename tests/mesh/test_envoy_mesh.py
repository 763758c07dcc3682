"""Calls through real Envoy, configured by our xDS control plane, to real gateway replicas.

Which replica served a program is read back from the replicas themselves: an
agent session header opens an implicit session on the replica that gets the
program's first call, so a program whose calls were split would exist on two.
The tests run in file order on one cluster; the last one kills a replica.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection

from autellix.mesh.control_plane import ThreadedControlPlane
from autellix.mesh.local import LocalMesh
from autellix.mesh.resources import ENDPOINT_TYPE
from autellix.protocol import SESSION_HEADER
from tests.live import chat, http
from tests.mesh.conftest import REPLICAS, StandInEngine


def call(mesh: LocalMesh, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    return http("POST", mesh.url + "/v1/chat/completions", chat(max_tokens=1), headers=headers)


def owners(mesh: LocalMesh, session_id: str) -> list[str]:
    """The replicas (asked directly, not through Envoy) that hold this session."""
    return [g.endpoint.address for g in mesh.gateways
            if g.alive() and http("GET", f"{g.url}/v1/sessions/{session_id}")[0] == 200]


def acked_after(mesh: LocalMesh, since: float) -> float:
    """Seconds from ``since`` to Envoy's last ACK of the endpoints."""
    return mesh.control_plane.node_status(mesh.node_id).acked_at[ENDPOINT_TYPE] - since


def test_calls_through_envoy_reach_a_gateway(mesh: LocalMesh) -> None:
    status, body = call(mesh)
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == "ok"
    status, models = http("GET", mesh.url + "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["tiny-llama"]
    assert mesh.control_plane.node_status(mesh.node_id).nacks == []  # Envoy accepted every resource we sent


def replica_counters(mesh: LocalMesh) -> dict[str, tuple[float, float]]:
    """Each replica's ``autellix_replica_calls_total`` and ``autellix_replica_programs_total`` (its /metrics)."""
    counters = {}
    for g in mesh.gateways:
        text = http("GET", g.url + "/metrics")[1]["text"]
        values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith(("autellix_replica_calls_total{", "autellix_replica_programs_total{"))
                  and f'replica="gateway-{g.endpoint.port}"' in line}
        counters[g.endpoint.address] = (values["autellix_replica_calls_total"],
                                        values["autellix_replica_programs_total"])
    return counters


def test_all_calls_of_a_program_go_through_one_replica(mesh: LocalMesh) -> None:
    programs = [f"mesh-prog-{i}" for i in range(12)]
    before = replica_counters(mesh)
    for _ in range(4):  # interleaved, so consecutive calls of one program are not back to back
        for program in programs:
            status, body = call(mesh, {"x-session-id": program})
            assert status == 200, body
    placement = {program: owners(mesh, program) for program in programs}
    assert all(len(where) == 1 for where in placement.values()), placement
    # ... and the programs are spread over the replicas, not all on one.
    assert len({where[0] for where in placement.values()}) > 1, placement
    # The per-replica counters in /metrics say the same: each replica served 4 calls per program it
    # served, and the programs counted over all replicas are the 12 (none counted on two).
    after = replica_counters(mesh)
    added = {address: (after[address][0] - before[address][0], after[address][1] - before[address][1])
             for address in after}
    assert sum(programs_here for _, programs_here in added.values()) == len(programs), added
    for address, (calls_here, programs_here) in added.items():
        assert calls_here == 4 * programs_here, added
        assert programs_here == sum(where == [address] for where in placement.values()), (added, placement)


def test_session_header_agent_header_and_session_path_hash_alike(mesh: LocalMesh) -> None:
    """The same id as ``x-session-id``, ``X-Autellix-Session`` and in ``/v1/sessions/{id}`` reaches
    the one replica that holds it (another replica would answer 404), and ``X-Autellix-Session``
    wins over an agent header naming another program."""
    for i in range(6):
        program = f"mesh-same-{i}"
        assert call(mesh, {"x-session-id": program})[0] == 200
        status, body = call(mesh, {SESSION_HEADER: program, "x-session-id": f"mesh-other-{i}"})
        assert status == 200, body
        status, entry = http("GET", f"{mesh.url}/v1/sessions/{program}")
        assert status == 200, entry
        assert http("DELETE", f"{mesh.url}/v1/sessions/{program}")[0] == 200
        assert owners(mesh, program) == []
        assert owners(mesh, f"mesh-other-{i}") == []  # the agent header was not the key


def test_streams_pass_through_envoy_unbuffered(mesh: LocalMesh, engine: StandInEngine) -> None:
    """The first chunk reaches the client while the engine still holds the rest of the stream."""
    engine.hold()
    url = urllib.parse.urlsplit(mesh.url)
    conn = HTTPConnection(url.hostname, url.port, timeout=15)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(chat(stream=True)),
                     headers={"Content-Type": "application/json", "x-session-id": "mesh-stream"})
        response = conn.getresponse()
        assert response.status == 200
        assert response.getheader("content-type", "").startswith("text/event-stream")
        first = response.readline()
        assert b'"first"' in first, first  # arrived while the engine waits: nothing buffered it
        engine.release()
        rest = response.read()
        assert b'"second"' in rest and rest.rstrip().endswith(b"data: [DONE]"), rest
    finally:
        engine.release()
        conn.close()


def test_membership_changes_reach_envoy_within_a_second(mesh: LocalMesh) -> None:
    """A replica published to the control plane is in Envoy's cluster within a second (Envoy ACKed
    the endpoints and lists the host), and takes calls; one taken out leaves as fast. Nothing restarts."""
    assert mesh.envoy is not None
    cluster = mesh.settings.cluster_name
    original = {g.endpoint.address for g in mesh.gateways}
    added = mesh.add_replica(publish=False)  # started and ready, not yet a member
    assert added.endpoint.address not in mesh.envoy.gateway_hosts(cluster)

    published = time.monotonic()
    version = mesh.control_plane.add_gateway(added.endpoint)
    assert mesh.control_plane.wait_acked(mesh.node_id, ENDPOINT_TYPE, version, timeout=10)
    # When Envoy's ACK arrived (stamped by the control plane), not when this test got to look.
    assert acked_after(mesh, published) < 1.0
    assert added.endpoint.address in mesh.envoy.gateway_hosts(cluster)
    mesh.wait_routable(original | {added.endpoint.address}, timeout=10)  # after its first health check

    programs = [f"mesh-grow-{i}" for i in range(40)]  # enough that some hash to the new replica
    for program in programs:
        assert call(mesh, {"x-session-id": program})[0] == 200
    on_added = [p for p in programs if owners(mesh, p) == [added.endpoint.address]]
    assert on_added

    withdrawn = time.monotonic()
    version = mesh.control_plane.remove_gateway(added.endpoint)
    assert mesh.control_plane.wait_acked(mesh.node_id, ENDPOINT_TYPE, version, timeout=10)
    assert acked_after(mesh, withdrawn) < 1.0
    assert added.endpoint.address not in mesh.envoy.gateway_hosts(cluster)
    # The replica still runs and is healthy, but no call reaches it any more.
    assert added.ready()
    for program in on_added:
        assert call(mesh, {"x-session-id": program})[0] == 200
        assert added.endpoint.address in owners(mesh, program) and len(owners(mesh, program)) == 2
    mesh.remove_replica(added)
    assert mesh.envoy.alive() and mesh.control_plane.node_status(mesh.node_id).streams == 1  # one stream all along


def test_envoy_outlives_the_control_plane_and_resyncs_when_it_returns(mesh: LocalMesh) -> None:
    """Envoy keeps serving with the configuration it has while the control plane is away, and a
    new control plane on the same address brings it up to date (Envoy reconnects by itself)."""
    old = mesh.control_plane
    members = set(old.gateways)
    old.stop()
    for i in range(5):
        assert call(mesh, {"x-session-id": f"mesh-cp-down-{i}"})[0] == 200
    leaving = sorted(members, key=lambda g: g.address)[0]
    mesh.control_plane = ThreadedControlPlane(mesh.settings, port=old.port)
    mesh.control_plane.start()
    version = mesh.control_plane.set_gateways(members - {leaving})  # a change made while Envoy was away
    assert mesh.control_plane.wait_acked(mesh.node_id, ENDPOINT_TYPE, version, timeout=15)
    assert leaving.address not in mesh.envoy.gateway_hosts(mesh.settings.cluster_name)  # type: ignore[union-attr]
    published = time.monotonic()
    version = mesh.control_plane.set_gateways(members)
    assert mesh.control_plane.wait_acked(mesh.node_id, ENDPOINT_TYPE, version, timeout=10)
    assert acked_after(mesh, published) < 1.0
    mesh.wait_routable({g.address for g in members}, timeout=10)
    assert mesh.control_plane.node_status(mesh.node_id).nacks == []


def test_a_killed_replica_is_taken_out_and_calls_carry_on(mesh: LocalMesh) -> None:
    programs = [f"mesh-kill-{i}" for i in range(30)]
    for program in programs:
        assert call(mesh, {"x-session-id": program})[0] == 200
    placement = {program: owners(mesh, program) for program in programs}
    victim = next(g for g in mesh.gateways if [g.endpoint.address] in placement.values())
    survivors = {g.endpoint.address for g in mesh.gateways} - {victim.endpoint.address}
    assert len(survivors) == REPLICAS - 1

    # Two callers keep the programs busy while the replica dies: some calls are on it or on their
    # way to it. The control plane is not told: health checks and outlier detection must find out.
    results: list[tuple[str, int, dict]] = []
    stop = threading.Event()

    def caller(offset: int) -> None:
        for n in range(500):  # bounded by count as well as by the stop below
            if stop.is_set():
                return
            program = programs[(offset + n) % len(programs)]
            status, body = call(mesh, {"x-session-id": program})
            results.append((program, status, body))

    def wait_for_calls(count: int) -> None:
        deadline = time.monotonic() + 20
        while len(results) < count and time.monotonic() < deadline:
            time.sleep(0.01)

    with ThreadPoolExecutor(2) as pool:
        callers = [pool.submit(caller, offset) for offset in (0, len(programs) // 2)]
        wait_for_calls(20)
        victim.kill()
        wait_for_calls(len(results) + 90)
        stop.set()
        for done in callers:
            done.result(30)
    # A call whose replica refused it or died under it is retried by Envoy on another replica:
    # the client sees no failure at all, before or after Envoy takes the replica out.
    assert [r for r in results if r[1] != 200] == []
    assert mesh.envoy is not None
    stats = dict(line.split(": ", 1) for line in mesh.envoy.admin("/stats").splitlines() if ": " in line)
    assert int(stats[f"cluster.{mesh.settings.cluster_name}.upstream_rq_retry"]) > 0  # the kill was in the traffic
    mesh.wait_routable(survivors, timeout=10)
    health = mesh.envoy.gateway_hosts(mesh.settings.cluster_name)[victim.endpoint.address]  # type: ignore[union-attr]
    assert health.get("failed_active_health_check") or health.get("failed_outlier_check"), health
    # Consistent hashing: only the dead replica's programs moved; the others kept their replica.
    for program, where in placement.items():
        assert call(mesh, {"x-session-id": program})[0] == 200
        if where == [victim.endpoint.address]:
            assert owners(mesh, program), program
        else:
            assert owners(mesh, program) == where, (program, where, owners(mesh, program))

    # Restarted on its port (what `autellix up` does for a replica that exits): the health
    # checks bring it back into rotation, with no word from the control plane.
    restarted = mesh.supervise()  # its first exit: at once
    assert [(r.name, r.exit_code, r.delay_s) for r in restarted] == [(victim.name, -9, 0.0)] and victim.alive()
    mesh.wait_routable(survivors | {victim.endpoint.address}, timeout=15)
    assert mesh.control_plane.node_status(mesh.node_id).nacks == []


def test_calls_in_flight_on_a_dying_replica_are_retried_on_another(mesh: LocalMesh, engine: StandInEngine) -> None:
    """Whole calls held at the engine when their replica dies: Envoy sees the connection reset
    before any answer and sends each again, to another replica, all at once (not 3 at a time:
    Envoy's default retry limit would give the rest a 503)."""
    assert mesh.envoy is not None
    cluster = mesh.settings.cluster_name

    def retries() -> int:
        stats = dict(line.split(": ", 1) for line in mesh.envoy.admin("/stats").splitlines() if ": " in line)
        return int(stats[f"cluster.{cluster}.upstream_rq_retry"])

    def wait_holding(count: int) -> None:
        deadline = time.monotonic() + 20
        while engine.holding != count:
            assert time.monotonic() < deadline, f"{engine.holding} calls held at the engine, expected {count}"
            time.sleep(0.02)

    mesh.wait_routable({g.endpoint.address for g in mesh.gateways if g.alive()}, timeout=15)
    programs = [f"mesh-inflight-{i}" for i in range(24)]
    engine.hold()
    retried_before = retries()
    with ThreadPoolExecutor(len(programs)) as pool:
        calls = [pool.submit(http, "POST", mesh.url + "/v1/chat/completions", chat("hold", max_tokens=1),
                             {"x-session-id": program}) for program in programs]
        try:
            wait_holding(len(programs))
            held = {g.endpoint.address: [p for p in programs if owners(mesh, p) == [g.endpoint.address]]
                    for g in mesh.gateways}
            victim = max(mesh.gateways, key=lambda g: len(held[g.endpoint.address]))
            on_victim = held[victim.endpoint.address]
            assert len(on_victim) > 3  # more than Envoy's default of 3 retries at once
            victim.kill()
            wait_holding(len(programs))  # its calls were cut at the engine and arrived again elsewhere
        finally:
            engine.release()
        answers = [c.result(30) for c in calls]
    assert [status for status, _ in answers] == [200] * len(programs), answers
    assert retries() - retried_before >= len(on_victim)
