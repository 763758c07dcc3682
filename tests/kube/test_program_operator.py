"""AgentProgram through kopf and the emulator, with a real gateway: Job, session, status and its reason,
Events, the end; no finalizer, whether an operator runs or not."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from autellix.kube import FINALIZER
from autellix.kube.kubeapi import KubeApi
from tests.kube.conftest import NAMESPACE, Gateway, OperatorFactory, events_about, eventually, free_port
from tests.kube.fake_engine import MODEL, FakeEngine, endpoint_slice
from tests.kube.kmock_cluster import Cluster

pytestmark = pytest.mark.asyncio

PROGRAMS = f"/apis/autellix.ai/v1alpha1/namespaces/{NAMESPACE}/agentprograms"
JOBS = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"


def program(name: str) -> dict[str, Any]:
    return {"apiVersion": "autellix.ai/v1alpha1", "kind": "AgentProgram",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"image": "python:3.12-slim", "command": ["python", "agent.py"], "model": MODEL,
                     "timeoutSeconds": 600, "env": [{"name": "STEPS", "value": "2"}]}}


@pytest_asyncio.fixture
async def engine(cluster: Cluster, api: KubeApi) -> AsyncIterator[FakeEngine]:
    """One engine behind the gateway, published as the cluster would: an EndpointSlice of its Service."""
    fake = await FakeEngine().start()
    await api.create(f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices",
                     endpoint_slice("llama", NAMESPACE, "llama-0", fake.port))
    yield fake
    await fake.stop()


async def session_entry(gateway: Gateway, session: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{gateway.url}/v1/sessions/{session}") as r:
        return r.status, await r.json()


async def agent_calls(base_url: str, session: str, calls: int) -> None:
    """What the Job's pod does: chat calls to OPENAI_BASE_URL in its session."""
    async with aiohttp.ClientSession() as http:
        for step in range(calls):
            body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": f"step {step}"}]}
            async with http.post(f"{base_url}/chat/completions", json=body,
                                 headers={"X-Autellix-Session": session}) as r:
                assert r.status == 200, await r.text()


def job_env(job: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


def no_finalizer(obj: dict[str, Any] | None) -> bool:
    return obj is not None and FINALIZER not in (obj["metadata"].get("finalizers") or [])


async def test_program_runs_to_completion(cluster: Cluster, api: KubeApi, gateway: Gateway, engine: FakeEngine,
                                          operator: OperatorFactory) -> None:
    await operator(gateway_url=gateway.url)
    created = await api.create(PROGRAMS, program("react"))

    job = await eventually(lambda: api.get(f"{JOBS}/react"), what="the Job")
    status = await eventually(lambda: _status(api, "react", "sessionId"), what="the session id")
    env = job_env(job)
    assert env["OPENAI_BASE_URL"] == f"{gateway.url}/v1"
    assert env["AUTELLIX_SESSION"] == status["sessionId"]
    assert env["AUTELLIX_MODEL"] == MODEL and env["STEPS"] == "2"
    assert job["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert (status["phase"], status["reason"]) == ("Pending", "Started")
    assert status["message"] == f"Session {status['sessionId']} open in the gateway {gateway.url}; Job react created."
    code, entry = await session_entry(gateway, status["sessionId"])
    assert code == 200 and entry["calls_done"] == 0  # opened in the gateway's process table

    # The pod runs: its calls land in the session, and the status mirrors the table entry.
    await api.merge_patch(f"{JOBS}/react/status", {"status": {"active": 1}})
    await eventually(lambda: gateway.engines_healthy(1), what="the engine in the gateway's pool")
    await agent_calls(env["OPENAI_BASE_URL"], env["AUTELLIX_SESSION"], calls=2)
    running = await eventually(lambda: _status(api, "react", "calls", 2), what="2 calls mirrored")
    assert running["phase"] == "Running" and running["reason"] == "Started"
    assert running["completionTokens"] == 8 and running["attainedService"] >= 0
    # Its session is open, and it carries no finalizer: deleting it would never wait for an operator.
    assert no_finalizer(await api.get(f"{PROGRAMS}/react"))

    # The Job completes: the session ends and the final numbers stay in status.
    await api.merge_patch(f"{JOBS}/react/status", {"status": {"active": 0, "succeeded": 1, "conditions": [
        {"type": "Complete", "status": "True"}]}})
    done = await eventually(lambda: _status(api, "react", "phase", "Succeeded"), what="phase Succeeded")
    assert done["sessionEnded"] is True and done["calls"] == 2 and done["programTokenLatency"] > 0
    assert done["reason"] == "Succeeded"
    assert done["message"] == f"Job react completed. Session {status['sessionId']} ended after 2 calls."
    code, _ = await session_entry(gateway, status["sessionId"])
    assert code == 404

    # What `kubectl describe` shows: the operator's Events on the program, what it did and why.
    events = await eventually(lambda: _events(api, "react", 2), what="two Events")
    assert [(e["type"], e["reason"]) for e in events] == [("Normal", "Started"), ("Normal", "Succeeded")]
    assert events[0]["message"] == (f"Opened session {status['sessionId']} in the gateway {gateway.url}; "
                                    "created Job react.")
    assert events[1]["message"] == done["message"]
    ref = events[0]["involvedObject"]
    assert (ref["kind"], ref["name"], ref["namespace"], ref["uid"], ref["apiVersion"]) == (
        "AgentProgram", "react", NAMESPACE, created["metadata"]["uid"], "autellix.ai/v1alpha1")
    assert {e["source"]["component"] for e in events} == {"autellix-operator"}

    await api.delete(f"{PROGRAMS}/react")
    await eventually(lambda: _gone(api, f"{PROGRAMS}/react"), what="the AgentProgram deleted")
    await eventually(lambda: _gone(api, f"{JOBS}/react"), what="the Job deleted")


async def test_deleting_a_running_program_ends_its_session(cluster: Cluster, api: KubeApi, gateway: Gateway,
                                                           operator: OperatorFactory) -> None:
    """Its DELETED watch event ends the session: no finalizer held it while the operator did."""
    await operator(gateway_url=gateway.url)
    await api.create(PROGRAMS, program("chat"))
    status = await eventually(lambda: _status(api, "chat", "sessionId"), what="the session id")
    assert (await session_entry(gateway, status["sessionId"]))[0] == 200
    assert no_finalizer(await api.get(f"{PROGRAMS}/chat"))

    await api.delete(f"{PROGRAMS}/chat")
    assert await api.get(f"{PROGRAMS}/chat") is None  # at once: nothing waits for the operator

    async def ended() -> bool:
        code, error = await session_entry(gateway, status["sessionId"])
        return code == 404 and "has ended" in error["error"]["message"]

    await eventually(ended, what="the session ended")
    await eventually(lambda: _gone(api, f"{JOBS}/chat"), what="the Job deleted")


async def test_a_program_is_deleted_at_once_while_no_operator_runs(cluster: Cluster, api: KubeApi,
                                                                     gateway: Gateway,
                                                                     operator: OperatorFactory) -> None:
    """The operator went (helm uninstall takes it): a program whose session is open goes at once; its session
    is left to the gateway's idle TTL."""
    stop = await operator(gateway_url=gateway.url)
    await api.create(PROGRAMS, program("orphan"))
    status = await eventually(lambda: _status(api, "orphan", "sessionId"), what="the session id")
    await stop()
    await api.delete(f"{PROGRAMS}/orphan")
    assert await api.get(f"{PROGRAMS}/orphan") is None
    assert (await session_entry(gateway, status["sessionId"]))[0] == 200  # nobody ended it: the idle TTL will


async def test_programs_an_older_operator_finalized_are_released(cluster: Cluster, api: KubeApi, gateway: Gateway,
                                                                 operator: OperatorFactory) -> None:
    """Older versions held a program's finalizer while its session was open; kopf drops it: from a program
    being deleted (it goes) and from one that runs on (its session opens, and it stays unheld)."""
    await api.create(PROGRAMS, {**program("stuck"), "metadata": {
        "name": "stuck", "namespace": NAMESPACE, "finalizers": [FINALIZER]}})
    await api.delete(f"{PROGRAMS}/stuck")
    await api.create(PROGRAMS, {**program("kept"), "metadata": {
        "name": "kept", "namespace": NAMESPACE, "finalizers": [FINALIZER]}})
    assert (await api.get(f"{PROGRAMS}/stuck"))["metadata"]["deletionTimestamp"]

    await operator(gateway_url=gateway.url)
    await eventually(lambda: _gone(api, f"{PROGRAMS}/stuck"), what="the program being deleted gone")
    await eventually(lambda: _status(api, "kept", "sessionId"), what="the other one's session")

    async def released() -> bool:
        return no_finalizer(await api.get(f"{PROGRAMS}/kept"))

    await eventually(released, what="its finalizer dropped")
    await asyncio.sleep(1.0)  # several passes and status writes later, still unheld
    assert await released()


async def test_an_unreachable_gateway_is_a_reason_one_warning_and_no_traceback(
        cluster: Cluster, api: KubeApi, operator: OperatorFactory, caplog: pytest.LogCaptureFixture) -> None:
    """The gateway is down when the program is made: phase Pending, reason GatewayUnreachable, one Warning
    Event and one log line however many passes try; once it is up, the program starts."""
    caplog.set_level(logging.DEBUG)
    port, admin_port = free_port(), free_port()
    url, admin_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
    await operator(gateway_url=url, gateway_admin_url=admin_url)
    created = await api.create(PROGRAMS, program("patient"))

    status = await eventually(lambda: _status(api, "patient", "reason", "GatewayUnreachable"),
                              what="reason GatewayUnreachable")
    assert status["phase"] == "Pending" and "sessionId" not in status
    assert status["message"].startswith(f"Cannot open a session in the gateway {url}: POST {admin_url}/admin/sessions")
    await asyncio.sleep(1.5)  # the programs' pass tries again every 0.2 s
    tries = [r for r in caplog.records if "Cannot open a session" in r.getMessage()]
    assert len(tries) > 3, "the pass tries again"
    warnings = [r for r in tries if r.levelno >= logging.WARNING]
    assert [r.name for r in warnings] == ["autellix.kube"], [r.getMessage() for r in warnings]
    assert not [r for r in caplog.records if r.exc_info], "no traceback"
    events = await events_about(api, created)
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "GatewayUnreachable")]
    assert events[0]["message"] == status["message"]
    assert await api.get(f"{JOBS}/patient") is None

    # The gateway comes up: the next pass opens the session and creates the Job.
    async with Gateway(lambda: set(), port=port, admin_port=admin_port) as gateway:
        started = await eventually(lambda: _status(api, "patient", "reason", "Started"), what="reason Started")
        assert started["phase"] == "Pending" and started["gateway"] == gateway.url
        assert (await session_entry(gateway, started["sessionId"]))[0] == 200
        assert await api.get(f"{JOBS}/patient") is not None
        events = await eventually(lambda: _events(api, "patient", 2), what="the Started Event")
        assert [e["reason"] for e in events] == ["GatewayUnreachable", "Started"]


async def test_a_failed_job_fails_the_program_and_says_why(cluster: Cluster, api: KubeApi, gateway: Gateway,
                                                           operator: OperatorFactory) -> None:
    await operator(gateway_url=gateway.url)
    await api.create(PROGRAMS, program("crash"))
    status = await eventually(lambda: _status(api, "crash", "sessionId"), what="the session id")
    await api.merge_patch(f"{JOBS}/crash/status", {"status": {"active": 0, "failed": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}]}})
    failed = await eventually(lambda: _status(api, "crash", "phase", "Failed"), what="phase Failed")
    assert failed["reason"] == "JobFailed" and failed["sessionEnded"] is True
    assert failed["message"] == (f"Job crash failed: BackoffLimitExceeded: Job has reached the specified backoff "
                                 f"limit. Session {status['sessionId']} ended after 0 calls.")
    events = await eventually(lambda: _events(api, "crash", 2), what="two Events")
    assert [(e["type"], e["reason"], e["message"]) for e in events][1] == ("Warning", "JobFailed", failed["message"])
    assert (await session_entry(gateway, status["sessionId"]))[0] == 404


async def test_a_job_gone_before_its_outcome_fails_the_program(cluster: Cluster, api: KubeApi, gateway: Gateway,
                                                                operator: OperatorFactory) -> None:
    """Its Job deleted by hand, or collected (ttlSecondsAfterFinished) while the operator was away: the
    session ends, the program is Failed and says why."""
    await operator(gateway_url=gateway.url)
    await api.create(PROGRAMS, program("lost"))
    await eventually(lambda: api.get(f"{JOBS}/lost"), what="the Job")
    job = await api.get(f"{JOBS}/lost")
    assert job["spec"]["ttlSecondsAfterFinished"] == 3600
    await api.merge_patch(f"{JOBS}/lost/status", {"status": {"active": 1}})
    status = await eventually(lambda: _status(api, "lost", "phase", "Running"), what="phase Running")
    await api.delete(f"{JOBS}/lost")
    status = await eventually(lambda: _status(api, "lost", "phase", "Failed"), what="phase Failed")
    assert status["sessionEnded"] is True and "is gone" in status["message"] and status["reason"] == "JobGone"
    assert (await session_entry(gateway, status["sessionId"]))[0] == 404
    events = await eventually(lambda: _events(api, "lost", 2), what="two Events")
    assert (events[1]["type"], events[1]["reason"]) == ("Warning", "JobGone")


async def test_bad_gateway_url_in_spec_fails_the_program(cluster: Cluster, api: KubeApi,
                                                         operator: OperatorFactory) -> None:
    """A spec the schema's pattern would refuse, written past it: reported, no Job, no session."""
    await operator(gateway_url="http://127.0.0.1:9")
    bad = program("bad")
    bad["spec"]["gateway"] = "ftp://gateway"
    await api.create(PROGRAMS, bad)
    status = await eventually(lambda: _status(api, "bad", "phase", "Failed"), what="phase Failed")
    assert status["message"] == "spec.gateway: expected an http(s) URL, got 'ftp://gateway'"
    assert status["reason"] == "InvalidSpec"
    assert "sessionId" not in status and await api.get(f"{JOBS}/bad") is None
    assert no_finalizer(await api.get(f"{PROGRAMS}/bad"))
    events = await eventually(lambda: _events(api, "bad", 1), what="the Warning")
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "InvalidSpec")]
    assert events[0]["message"] == f"Invalid spec: {status['message']}"


async def _events(api: KubeApi, name: str, count: int) -> list[dict[str, Any]] | None:
    """The program's Events once there are ``count`` of them."""
    obj = await api.get(f"{PROGRAMS}/{name}")
    events = await events_about(api, obj) if obj else []
    return events if len(events) >= count else None


async def _status(api: KubeApi, name: str, key: str, value: Any = None) -> dict[str, Any] | None:
    obj = await api.get(f"{PROGRAMS}/{name}")
    status = (obj or {}).get("status") or {}
    if key in status and (value is None or status[key] == value):
        return status
    return None


async def _gone(api: KubeApi, path: str) -> bool:
    return await api.get(path) is None
