"""The control plane on its own: resources, snapshot versions, and the ADS protocol over a real gRPC stream.

The stream tests speak ADS with a grpclib client the way Envoy does (request,
ACK, NACK, stale nonce), including the cases Envoy will not show on demand: a
NACKed version must not come back, and a stale nonce must not be answered.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import grpclib.const
import pytest
import pytest_asyncio
from envoy_data_plane.envoy.config.core.v3 import Node
from envoy_data_plane.envoy.config.endpoint.v3 import ClusterLoadAssignment
from envoy_data_plane.envoy.service.discovery.v3 import DiscoveryRequest, DiscoveryResponse
from envoy_data_plane.google.rpc import Status
from grpclib.client import Channel, Stream

from autellix.mesh.ads import ADS_METHOD
from autellix.mesh.control_plane import ControlPlane
from autellix.mesh.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    SESSION_PATH_REGEX,
    GatewayEndpoint,
    MeshSettings,
    mesh_resources,
    route_configuration,
)
from autellix.mesh.snapshot import Snapshot
from autellix.protocol import IMPLICIT_SESSION_HEADERS, SESSION_HEADER

A, B, C = (GatewayEndpoint("127.0.0.1", port) for port in (9001, 9002, 9003))
SETTINGS = MeshSettings(listen_port=18000)


def test_a_membership_change_changes_only_the_endpoints_version() -> None:
    two = Snapshot.of(mesh_resources(SETTINGS, [A, B]))
    same = Snapshot.of(mesh_resources(SETTINGS, [B, A]))
    three = Snapshot.of(mesh_resources(SETTINGS, [A, B, C]))
    assert two.versions == same.versions  # order of the replica list is not a change
    changed = {t for t in two.versions if two.version(t) != three.version(t)}
    assert changed == {ENDPOINT_TYPE}
    endpoints = three.select(ENDPOINT_TYPE, [SETTINGS.cluster_name])
    assert len(endpoints) == 1 and isinstance(endpoints[0], ClusterLoadAssignment)
    assert sorted(e.endpoint.address.socket_address.port_value for e in endpoints[0].endpoints[0].lb_endpoints) \
        == [9001, 9002, 9003]


def test_the_program_key_is_the_session_header_then_the_agent_headers() -> None:
    routes = route_configuration(SETTINGS).virtual_hosts[0].routes
    by_path, default = routes[0], routes[-1]
    assert default.match.prefix == "/"
    policies = default.route.hash_policy
    assert [p.header.header_name for p in policies] == [SESSION_HEADER, *IMPLICIT_SESSION_HEADERS]
    assert all(p.terminal for p in policies)  # the first header present decides; none present: no key
    # /v1/sessions/{id}: the id from the path first, then the same headers.
    first = by_path.route.hash_policy[0].header
    assert first.header_name == ":path"
    assert re.sub(first.regex_rewrite.pattern.regex, first.regex_rewrite.substitution.replace("\\1", r"\1"),
                  "/v1/sessions/sess-42?verbose=1") == "sess-42"
    assert re.fullmatch(SESSION_PATH_REGEX, "/v1/sessions/a/b") is None
    # No route timeout: long calls and streams are never cut by Envoy.
    assert all(r.route.timeout is not None and r.route.timeout.total_seconds() == 0 for r in routes)


@pytest_asyncio.fixture
async def plane() -> AsyncIterator[ControlPlane]:
    control_plane = ControlPlane(SETTINGS)
    await control_plane.start()
    control_plane.publish([A, B])
    try:
        yield control_plane
    finally:
        await control_plane.close()


def request(type_url: str, *, names: list[str] | None = None, ack: DiscoveryResponse | None = None,
            nack: DiscoveryResponse | None = None, version: str = "") -> DiscoveryRequest:
    answered = ack or nack
    return DiscoveryRequest(
        node=Node(id="test-envoy"), type_url=type_url, resource_names=names or [],
        version_info=ack.version_info if ack else version,
        response_nonce=answered.nonce if answered else "",
        error_detail=Status(code=3, message="rejected by the test") if nack else None,
    )


async def open_ads(channel: Channel) -> Stream[DiscoveryRequest, DiscoveryResponse]:
    return channel.request(ADS_METHOD, grpclib.const.Cardinality.STREAM_STREAM, DiscoveryRequest, DiscoveryResponse)


@pytest.mark.asyncio
async def test_ads_answers_acks_and_pushes_changes_only(plane: ControlPlane) -> None:
    channel = Channel("127.0.0.1", plane.port)
    try:
        async with await open_ads(channel) as stream:
            await stream.send_message(request(CLUSTER_TYPE))
            clusters = await stream.recv_message()
            assert clusters is not None and clusters.type_url == CLUSTER_TYPE and len(clusters.resources) == 1
            await stream.send_message(request(CLUSTER_TYPE, ack=clusters))
            await stream.send_message(request(ENDPOINT_TYPE, names=[SETTINGS.cluster_name]))
            endpoints = await stream.recv_message()
            assert endpoints is not None and endpoints.type_url == ENDPOINT_TYPE
            first = ClusterLoadAssignment.parse(endpoints.resources[0].value)
            assert len(first.endpoints[0].lb_endpoints) == 2
            await stream.send_message(request(ENDPOINT_TYPE, names=[SETTINGS.cluster_name], ack=endpoints))

            plane.publish([A, B, C])  # only the endpoints change: only they are pushed
            pushed = await stream.recv_message()
            assert pushed is not None and pushed.type_url == ENDPOINT_TYPE
            assert pushed.version_info != endpoints.version_info and pushed.nonce != endpoints.nonce
            assert len(ClusterLoadAssignment.parse(pushed.resources[0].value).endpoints[0].lb_endpoints) == 3
            assert plane.ads.status("test-envoy").acked == {CLUSTER_TYPE: clusters.version_info,
                                                            ENDPOINT_TYPE: endpoints.version_info}

            # NACK it: the rejected version is not sent again; the next change replaces it.
            await stream.send_message(request(ENDPOINT_TYPE, names=[SETTINGS.cluster_name], nack=pushed,
                                              version=endpoints.version_info))
            # A NACK with a stale nonce (of a response since replaced) is ignored: not counted, not answered.
            await stream.send_message(request(ENDPOINT_TYPE, names=[SETTINGS.cluster_name], nack=endpoints))
            # The stream handles requests in order: once this one is answered, both above were handled.
            await stream.send_message(request(LISTENER_TYPE))
            listeners = await stream.recv_message()
            assert listeners is not None and listeners.type_url == LISTENER_TYPE
            plane.publish([A])
            after_nack = await stream.recv_message()
            assert after_nack is not None and after_nack.type_url == ENDPOINT_TYPE
            assert len(ClusterLoadAssignment.parse(after_nack.resources[0].value).endpoints[0].lb_endpoints) == 1
            status = plane.ads.status("test-envoy")
            assert [(t, v) for t, v, _ in status.nacks] == [(ENDPOINT_TYPE, pushed.version_info)]
            await stream.end()
    finally:
        channel.close()


@pytest.mark.asyncio
async def test_ads_sends_each_type_only_what_was_asked(plane: ControlPlane) -> None:
    channel = Channel("127.0.0.1", plane.port)
    try:
        async with await open_ads(channel) as stream:
            await stream.send_message(request(ROUTE_TYPE, names=["no-such-route"]))
            empty = await stream.recv_message()
            assert empty is not None and empty.type_url == ROUTE_TYPE and empty.resources == []
            await stream.send_message(request(ROUTE_TYPE, names=[SETTINGS.route_name], ack=empty))
            routes = await stream.recv_message()  # other names, same version: answered
            assert routes is not None and len(routes.resources) == 1
            await stream.send_message(request(LISTENER_TYPE))
            listeners = await stream.recv_message()
            assert listeners is not None and listeners.type_url == LISTENER_TYPE and len(listeners.resources) == 1
            await stream.end()
    finally:
        channel.close()


def test_a_node_with_its_own_snapshot_gets_it_and_the_others_share_the_default() -> None:
    plane = ControlPlane(SETTINGS)
    plane.publish([A, B])
    plane.publish([C], node_id="bench-envoy", settings=MeshSettings(listen_port=18001))
    own, shared = plane.cache.get("bench-envoy"), plane.cache.get("any-other-envoy")
    assert own is not None and shared is not None
    assert [ClusterLoadAssignment.parse(bytes(r)).endpoints[0].lb_endpoints[0].endpoint.address.socket_address
            .port_value for r in own.select(ENDPOINT_TYPE, [])] == [9003]
    listener = own.select(LISTENER_TYPE, [])[0]
    assert listener.address.socket_address.port_value == 18001  # type: ignore[attr-defined]
    assert shared.select(LISTENER_TYPE, [])[0].address.socket_address.port_value == 18000  # type: ignore[attr-defined]
    assert plane.gateways() == {A, B} and plane.gateways("bench-envoy") == {C}
