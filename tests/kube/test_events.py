"""The operator's Events: the core/v1 Event built for a resource (pure), and the poster that posts a lasting
warning once per state (against the emulator; tests/cluster posts them to a real API server)."""

from __future__ import annotations

import datetime
import itertools
import logging
from typing import Any

import kubernetes_validate
import pytest

from autellix.kube.events import kube_event
from autellix.kube.kubeapi import KubeApi
from autellix.kube.recorder import EventRecorder
from tests.kube.conftest import NAMESPACE, events_about
from tests.kube.kmock_cluster import Cluster
from tests.kube.test_manifests import VERSIONS

NOW = datetime.datetime(2026, 3, 1, 12, 30, 5, 123456, tzinfo=datetime.UTC)
PROGRAMS = f"/apis/autellix.ai/v1alpha1/namespaces/{NAMESPACE}/agentprograms"


def program(name: str = "react", uid: str = "6f1c2d3e-0000-4000-8000-000000000001") -> dict[str, Any]:
    return {"apiVersion": "autellix.ai/v1alpha1", "kind": "AgentProgram",
            "metadata": {"name": name, "namespace": "team-a", "uid": uid, "resourceVersion": "42"},
            "spec": {"image": "agent:1"}}


@pytest.mark.parametrize("version", VERSIONS)
def test_an_event_names_its_object_as_kubectl_describe_matches_it(version: str) -> None:
    event = kube_event(program(), "Warning", "GatewayUnreachable", "Cannot open a session.", now=NOW,
                       instance="autellix-operator-7d9f-abcde")
    kubernetes_validate.validate(event, version, strict=True)
    assert event["involvedObject"] == {"apiVersion": "autellix.ai/v1alpha1", "kind": "AgentProgram", "name": "react",
                                       "namespace": "team-a", "uid": "6f1c2d3e-0000-4000-8000-000000000001"}
    assert event["metadata"]["namespace"] == "team-a" and event["metadata"]["name"].startswith("react.")
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "GatewayUnreachable",
                                                                  "Cannot open a session.")
    assert event["source"] == {"component": "autellix-operator"}  # kubectl describe's "From"
    assert (event["reportingComponent"], event["reportingInstance"]) == ("autellix-operator",
                                                                         "autellix-operator-7d9f-abcde")
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-03-01T12:30:05Z" and event["count"] == 1
    later = kube_event(program(), "Warning", "GatewayUnreachable", "x", now=NOW + datetime.timedelta(microseconds=1))
    assert later["metadata"]["name"] != event["metadata"]["name"]


def test_a_long_message_is_cut_to_what_the_api_server_takes() -> None:
    event = kube_event(program("p" * 253), "Normal", "Started", "m" * 5000, now=NOW)
    assert len(event["message"]) == 1024 and event["message"].endswith("...")
    assert len(event["metadata"]["name"]) <= 253


@pytest.mark.parametrize(("kind", "reason", "obj", "error"), [
    ("Error", "Started", program(), "type: expected Normal or Warning, got 'Error'"),
    ("Normal", "job failed", program(), "reason: expected a CamelCase word"),
    ("Normal", "", program(), "reason: expected a CamelCase word"),
    ("Normal", "Started", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "n"}},
     "an Event needs the object's uid"),
])
def test_a_bad_event_is_refused_naming_the_field(kind: Any, reason: str, obj: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        kube_event(obj, kind, reason, "m", now=NOW)


@pytest.mark.asyncio
async def test_a_lasting_warning_is_posted_once_per_state(cluster: Cluster, api: KubeApi) -> None:
    created = await api.create(PROGRAMS, {"apiVersion": "autellix.ai/v1alpha1", "kind": "AgentProgram",
                                          "metadata": {"name": "patient", "namespace": NAMESPACE},
                                          "spec": {"image": "agent:1"}})
    ticks = itertools.count()
    recorder = EventRecorder(api, clock=lambda: NOW + datetime.timedelta(seconds=next(ticks)))

    async def seen() -> list[tuple[str, str]]:
        return [(e["type"], e["reason"]) for e in await events_about(api, created)]

    posted = [await recorder.warning(created, "gateway", "GatewayUnreachable", f"refused, try {n}") for n in range(5)]
    assert posted == [True, False, False, False, False]
    assert await seen() == [("Warning", "GatewayUnreachable")]
    # another state of the same topic posts; a topic of its own is a state of its own
    assert await recorder.warning(created, "gateway", "GatewayError", "500")
    assert await recorder.warning(created, "spec", "InvalidSpec", "spec.image: required")
    # resolved, the state's return posts again
    assert recorder.resolved(created, "gateway") == "GatewayError"
    assert recorder.resolved(created, "gateway") is None
    assert await recorder.warning(created, "gateway", "GatewayError", "500")
    assert await recorder.post(created, "Normal", "Started", "Opened session s.")
    assert await seen() == [("Warning", "GatewayUnreachable"), ("Warning", "GatewayError"),
                            ("Warning", "InvalidSpec"), ("Warning", "GatewayError"), ("Normal", "Started")]


@pytest.mark.asyncio
async def test_an_event_that_cannot_be_posted_fails_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """An Event reports the work: when the API server cannot take it, it is dropped with one warning (then
    debug lines until a post succeeds), and nothing is raised into the work."""
    caplog.set_level(logging.DEBUG, logger="autellix.kube")
    away = KubeApi.for_server("http://127.0.0.1:9")
    try:
        recorder = EventRecorder(away)
        assert await recorder.post(program(), "Normal", "Started", "m") is False
        assert await recorder.warning(program(), "gateway", "GatewayUnreachable", "m") is True  # the state still counts
    finally:
        await away.close()
    levels = [r.levelno for r in caplog.records if r.getMessage().startswith("cannot post Event")]
    assert levels == [logging.WARNING, logging.DEBUG]
