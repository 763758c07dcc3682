"""The aggregated discovery service: Envoy's listeners, routes, clusters and endpoints over one gRPC stream.

State of the world (SotW) ADS, as in the xDS protocol: for each resource type
Envoy sends a request; we answer with the node's resources of that type, a
version and a nonce; Envoy's next request for the type ACKs (same version,
our nonce) or NACKs (its previous version and an ``error_detail``). That next
request is also the next watch: one answer in flight per type, as
go-control-plane does. A type is answered again when its version in the node's
snapshot differs from what was last sent, or when Envoy asks for other names.
A NACKed version is not resent; the next change replaces it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field

import grpclib.const
import grpclib.server
from envoy_data_plane.envoy.service.discovery.v3 import DiscoveryRequest, DiscoveryResponse
from envoy_data_plane.google.protobuf import Any

from autellix.mesh.resources import RESOURCE_TYPES
from autellix.mesh.snapshot import SnapshotCache

log = logging.getLogger(__name__)

ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"


def _type_order(type_url: str) -> int:
    return RESOURCE_TYPES.index(type_url) if type_url in RESOURCE_TYPES else len(RESOURCE_TYPES)


@dataclass
class _TypeWatch:
    """One resource type on one stream."""

    names: tuple[str, ...] = ()
    #: A request arrived since our last answer: we may answer.
    open: bool = False
    sent_version: str | None = None
    sent_names: tuple[str, ...] | None = None
    nonce: str = ""


@dataclass
class NodeStatus:
    """What a node last accepted or refused, per type URL (for tests, logs and readiness)."""

    acked: dict[str, str] = field(default_factory=dict)
    acked_at: dict[str, float] = field(default_factory=dict)
    nacks: list[tuple[str, str, str]] = field(default_factory=list)  # (type URL, version, error)
    streams: int = 0


class AggregatedDiscoveryService:
    """A grpclib service (``Server([service])``) over a :class:`SnapshotCache`."""

    def __init__(self, cache: SnapshotCache) -> None:
        self.cache = cache
        self.nodes: dict[str, NodeStatus] = {}
        self._nonces = itertools.count(1)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {ADS_METHOD: grpclib.const.Handler(self._stream, grpclib.const.Cardinality.STREAM_STREAM,
                                                  DiscoveryRequest, DiscoveryResponse)}

    def status(self, node_id: str) -> NodeStatus:
        return self.nodes.setdefault(node_id, NodeStatus())

    async def _stream(self, stream: grpclib.server.Stream[DiscoveryRequest, DiscoveryResponse]) -> None:
        requests: asyncio.Queue[DiscoveryRequest | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for request in stream:
                    await requests.put(request)
            finally:
                await requests.put(None)

        reader = asyncio.create_task(read())
        changed = self.cache.watch()
        watches: dict[str, _TypeWatch] = {}
        node_id: str | None = None
        next_request: asyncio.Task[DiscoveryRequest | None] = asyncio.create_task(requests.get())
        next_change: asyncio.Task[bool] = asyncio.create_task(changed.wait())
        try:
            while True:
                await asyncio.wait({next_request, next_change}, return_when=asyncio.FIRST_COMPLETED)
                if next_request.done():
                    request = next_request.result()
                    if request is None:
                        return  # Envoy closed the stream
                    next_request = asyncio.create_task(requests.get())
                    if node_id is None:
                        # The node is only required on a stream's first request.
                        node_id = request.node.id if request.node is not None else ""
                        self.status(node_id).streams += 1
                        log.info("ADS stream from node %r", node_id)
                    self._on_request(node_id, request, watches)
                    await self._answer(stream, node_id, request.type_url, watches)
                if next_change.done():
                    changed.clear()
                    next_change = asyncio.create_task(changed.wait())
                    if node_id is not None:
                        # Clusters before endpoints before listeners before routes: what a
                        # resource names exists in Envoy before the resource arrives.
                        for type_url in sorted(watches, key=_type_order):
                            await self._answer(stream, node_id, type_url, watches)
        finally:
            self.cache.unwatch(changed)
            for task in (reader, next_request, next_change):
                task.cancel()
            await asyncio.gather(reader, next_request, next_change, return_exceptions=True)

    def _on_request(self, node_id: str, request: DiscoveryRequest, watches: dict[str, _TypeWatch]) -> None:
        watch = watches.setdefault(request.type_url, _TypeWatch())
        if request.response_nonce and request.response_nonce != watch.nonce:
            return  # answers a response we have since replaced: the newer one's ACK/NACK follows
        status = self.status(node_id)
        if request.error_detail is not None:  # its presence makes the request a NACK
            status.nacks.append((request.type_url, watch.sent_version or "", request.error_detail.message))
            log.warning("node %r rejected %s version %s: %s", node_id, request.type_url, watch.sent_version,
                        request.error_detail.message)
        elif request.response_nonce:
            status.acked[request.type_url] = request.version_info
            status.acked_at[request.type_url] = time.monotonic()
        watch.names = tuple(request.resource_names)
        watch.open = True

    async def _answer(self, stream: grpclib.server.Stream[DiscoveryRequest, DiscoveryResponse], node_id: str,
                      type_url: str, watches: dict[str, _TypeWatch]) -> None:
        watch = watches[type_url]
        snapshot = self.cache.get(node_id)
        if not watch.open or snapshot is None:
            return
        version = snapshot.version(type_url)
        if version == watch.sent_version and watch.names == watch.sent_names:
            return
        watch.nonce = str(next(self._nonces))
        resources = [Any.pack(r) for r in snapshot.select(type_url, watch.names)]
        await stream.send_message(DiscoveryResponse(version_info=version, resources=resources,
                                                    type_url=type_url, nonce=watch.nonce))
        watch.open = False
        watch.sent_version, watch.sent_names = version, watch.names
