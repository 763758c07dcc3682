"""AgentProgram through kopf and the emulator, with a real gateway: Job, session, status, the end."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from autellix.kube import FINALIZER
from autellix.kube.kubeapi import KubeApi
from tests.kube.conftest import NAMESPACE, Gateway, OperatorFactory, eventually
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
    code, entry = await session_entry(gateway, status["sessionId"])
    assert code == 200 and entry["calls_done"] == 0  # opened in the gateway's process table

    # The pod runs: its calls land in the session, and the status mirrors the table entry.
    await api.merge_patch(f"{JOBS}/react/status", {"status": {"active": 1}})
    await eventually(lambda: gateway.engines_healthy(1), what="the engine in the gateway's pool")
    await agent_calls(env["OPENAI_BASE_URL"], env["AUTELLIX_SESSION"], calls=2)
    running = await eventually(lambda: _status(api, "react", "calls", 2), what="2 calls mirrored")
    assert running["phase"] == "Running"
    assert running["completionTokens"] == 8 and running["attainedService"] >= 0

    # The Job completes: the session ends and the final numbers stay in status.
    await api.merge_patch(f"{JOBS}/react/status", {"status": {"active": 0, "succeeded": 1, "conditions": [
        {"type": "Complete", "status": "True"}]}})
    done = await eventually(lambda: _status(api, "react", "phase", "Succeeded"), what="phase Succeeded")
    assert done["sessionEnded"] is True and done["calls"] == 2 and done["programTokenLatency"] > 0
    code, _ = await session_entry(gateway, status["sessionId"])
    assert code == 404

    # Its session ended, it no longer holds the finalizer: deleting it needs no operator; the Job goes with it.
    async def unheld() -> bool:
        return FINALIZER not in ((await api.get(f"{PROGRAMS}/react"))["metadata"].get("finalizers") or [])

    await eventually(unheld, what="the finalizer dropped once the session ended")
    await api.delete(f"{PROGRAMS}/react")
    await eventually(lambda: _gone(api, f"{PROGRAMS}/react"), what="the AgentProgram deleted")
    await eventually(lambda: _gone(api, f"{JOBS}/react"), what="the Job deleted")


async def test_deleting_a_running_program_ends_its_session(cluster: Cluster, api: KubeApi, gateway: Gateway,
                                                           operator: OperatorFactory) -> None:
    await operator(gateway_url=gateway.url)
    await api.create(PROGRAMS, program("chat"))
    status = await eventually(lambda: _status(api, "chat", "sessionId"), what="the session id")
    assert (await session_entry(gateway, status["sessionId"]))[0] == 200
    async def held() -> bool:  # its session is open (kopf adds the finalizer on the status write's event)
        return FINALIZER in ((await api.get(f"{PROGRAMS}/chat"))["metadata"].get("finalizers") or [])

    await eventually(held, what="the finalizer while the session is open")

    await api.delete(f"{PROGRAMS}/chat")
    await eventually(lambda: _gone(api, f"{PROGRAMS}/chat"), what="the AgentProgram deleted")
    code, error = await session_entry(gateway, status["sessionId"])
    assert code == 404 and "has ended" in error["error"]["message"]
    await eventually(lambda: _gone(api, f"{JOBS}/chat"), what="the Job deleted")


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
    assert status["sessionEnded"] is True and "is gone" in status["message"]
    assert (await session_entry(gateway, status["sessionId"]))[0] == 404


async def test_bad_gateway_url_in_spec_fails_the_program(cluster: Cluster, api: KubeApi,
                                                         operator: OperatorFactory) -> None:
    """A spec the schema's pattern would refuse, written past it: reported, no Job, no session."""
    await operator(gateway_url="http://127.0.0.1:9")
    bad = program("bad")
    bad["spec"]["gateway"] = "ftp://gateway"
    await api.create(PROGRAMS, bad)
    status = await eventually(lambda: _status(api, "bad", "phase", "Failed"), what="phase Failed")
    assert status["message"] == "spec.gateway: expected an http(s) URL, got 'ftp://gateway'"
    assert "sessionId" not in status and await api.get(f"{JOBS}/bad") is None
    assert not (await api.get(f"{PROGRAMS}/bad"))["metadata"].get("finalizers")  # no session: nothing held


async def _status(api: KubeApi, name: str, key: str, value: Any = None) -> dict[str, Any] | None:
    obj = await api.get(f"{PROGRAMS}/{name}")
    status = (obj or {}).get("status") or {}
    if key in status and (value is None or status[key] == value):
        return status
    return None


async def _gone(api: KubeApi, path: str) -> bool:
    return await api.get(path) is None
