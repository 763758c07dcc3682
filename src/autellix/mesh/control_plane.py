"""The xDS control plane: gateway membership in, Envoy configuration out.

:class:`ControlPlane` runs on the caller's event loop (the operator's, in a cluster);
:class:`ThreadedControlPlane` runs one on its own thread for synchronous callers
(``autellix up``, tests). Either way, a membership change builds a new snapshot
for every node and the ADS streams send Envoy the types that changed (only the
endpoints, for a replica joining or leaving), which Envoy applies without a restart.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import socket
import threading
import time
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

from grpclib.protocol import H2Protocol
from grpclib.server import Server

from autellix.mesh.ads import AggregatedDiscoveryService, NodeStatus
from autellix.mesh.resources import ENDPOINT_TYPE, GatewayEndpoint, MeshSettings, mesh_resources
from autellix.mesh.snapshot import ANY_NODE, Snapshot, SnapshotCache

T = TypeVar("T")


class _Server(Server):
    """grpclib's server, closing its clients' connections on close as well (Python 3.11's asyncio
    has no ``close_clients``): otherwise an Envoy connected to a control plane stopped in-process
    keeps a silent connection, sends its next stream down it, and never reconnects."""

    def __init__(self, handlers: list[Any]) -> None:
        super().__init__(handlers)
        self._transports: set[asyncio.BaseTransport] = set()

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        made, lost = protocol.connection_made, protocol.connection_lost
        opened: list[asyncio.BaseTransport] = []

        def connection_made(transport: asyncio.BaseTransport) -> None:
            self._transports.add(transport)
            opened.append(transport)
            made(transport)

        def connection_lost(exc: BaseException | None) -> None:
            self._transports.difference_update(opened)
            lost(exc)

        protocol.connection_made = connection_made  # type: ignore[method-assign]
        protocol.connection_lost = connection_lost  # type: ignore[method-assign]
        return protocol

    def close_clients(self) -> None:
        for transport in self._transports:
            transport.close()
        self._transports.clear()


class ControlPlane:
    def __init__(self, settings: MeshSettings, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.settings = settings
        self.host, self.port = host, port
        self.cache = SnapshotCache()
        self.ads = AggregatedDiscoveryService(self.cache)
        self._server: _Server | None = None
        # Per node: its replica set and its settings (listener port, ...); ANY_NODE for the rest.
        self._gateways: dict[str, frozenset[GatewayEndpoint]] = {}
        self._node_settings: dict[str, MeshSettings] = {}

    async def start(self) -> None:
        """Serve ADS; ``port`` 0 picks a free one (read ``self.port`` after)."""
        if ANY_NODE not in self._gateways:
            self.publish([])  # a snapshot from the first request on: a cluster with no endpoints yet
        # Bound here, so port 0 gives a free port we can read back without a race.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET  # a pod's IP may be IPv6
        listening = socket.socket(family, socket.SOCK_STREAM)
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind((self.host, self.port))
        self.port = listening.getsockname()[1]
        self._server = _Server([self.ads])
        await self._server.start(sock=listening)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server.close_clients()

    def gateways(self, node_id: str = ANY_NODE) -> frozenset[GatewayEndpoint]:
        return self._gateways.get(node_id, frozenset())

    def publish(self, gateways: Iterable[GatewayEndpoint], *, node_id: str = ANY_NODE,
                settings: MeshSettings | None = None) -> Snapshot:
        """Make ``gateways`` the replica set of Envoy node ``node_id`` (``ANY_NODE``: every node
        without its own snapshot), with ``settings`` if given (else the node's last, else the
        control plane's); returns the new snapshot."""
        if settings is not None:
            self._node_settings[node_id] = settings
        self._gateways[node_id] = frozenset(gateways)
        members = sorted(self._gateways[node_id], key=lambda g: g.address)
        snapshot = Snapshot.of(mesh_resources(self._node_settings.get(node_id, self.settings), members))
        self.cache.set_snapshot(node_id, snapshot)
        return snapshot


class ThreadedControlPlane:
    """A :class:`ControlPlane` on a thread of its own, driven from synchronous code."""

    def __init__(self, settings: MeshSettings, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.plane = ControlPlane(settings, host=host, port=port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="xds-control-plane", daemon=True)

    @property
    def port(self) -> int:
        return self.plane.port

    @property
    def address(self) -> str:
        return f"{self.plane.host}:{self.plane.port}"

    def __enter__(self) -> ThreadedControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()
        self._call(self.plane.start())

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self.plane.close(), timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 10) -> T:
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def set_gateways(self, gateways: Iterable[GatewayEndpoint], *, node_id: str = ANY_NODE,
                     settings: MeshSettings | None = None) -> str:
        """Replace a node's replica set (see :meth:`ControlPlane.publish`); returns the new
        endpoints version, the one Envoy ACKs once it applied it."""
        gateways = list(gateways)

        async def publish() -> Snapshot:
            return self.plane.publish(gateways, node_id=node_id, settings=settings)

        return self._call(publish()).version(ENDPOINT_TYPE)

    def add_gateway(self, gateway: GatewayEndpoint) -> str:
        return self.set_gateways(self.gateways | {gateway})

    def remove_gateway(self, gateway: GatewayEndpoint) -> str:
        return self.set_gateways(self.gateways - {gateway})

    @property
    def gateways(self) -> frozenset[GatewayEndpoint]:
        """The replica set of every node without its own."""
        return self.plane.gateways()

    def node_status(self, node_id: str) -> NodeStatus:
        """A copy of what the node has ACKed and NACKed so far."""

        async def read() -> NodeStatus:
            return copy.deepcopy(self.plane.ads.status(node_id))

        return self._call(read())

    def wait_acked(self, node_id: str, type_url: str, version: str, timeout: float) -> bool:
        """Until the node ACKs ``version`` of ``type_url`` (it applied it), or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            if self.node_status(node_id).acked.get(type_url) == version:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
