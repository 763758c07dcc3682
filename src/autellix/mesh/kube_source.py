"""In a cluster, the xDS control plane's membership: the gateway pods behind the gateway Service.

The operator serves xDS (``autellix operator --xds-port 18000``): Envoy's
bootstrap names the operator's Service as its ADS server. The gateway replicas
are the ready endpoints of the gateway Service's EndpointSlices, read with the
same list-then-watch as the gateway's engine discovery
(:class:`~autellix.gateway.kube_discovery.KubeDiscovery`, ``autellix.endpointslices``:
each ready endpoint is one replica, ``<pod IP>:<port named "http">``). A pod that
turns unready or starts terminating (SIGTERM: a rolling update, a scale-down, a
node drain) leaves its slice's ready endpoints and so leaves Envoy's cluster, as
one whose readiness probe passes joins it. :class:`GatewayMembership` publishes
each change to the :class:`~autellix.mesh.control_plane.ControlPlane` at once
(it checks the watched slices every ``interval``, 0.1 s, in memory), so a change
reaches Envoy well within a second of the API server's event.

Every operator replica serves xDS, not only the leader: the membership is read,
never written, so any replica that Envoy reaches gives it the same answer. It
listens on one address (the chart passes the pod's IP), and the chart's
NetworkPolicy lets only Envoy pods reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import Awaitable
from typing import Any, TypeVar

from autellix.endpointslices import DEFAULT_PORT, DEFAULT_PORT_NAME
from autellix.gateway.kube_discovery import KubeDiscovery
from autellix.mesh.control_plane import ControlPlane
from autellix.mesh.resources import GatewayEndpoint, MeshSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The EndpointSlices of a Service carry this label with the Service's name.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
#: The operator's requests are named so in the API server's audit log (and in the tests' RBAC check).
USER_AGENT = "autellix-operator (xds)"


def endpoint_of(url: str) -> GatewayEndpoint:
    """``http://10.1.2.3:8000`` (or ``http://[fd00::1]:8000``) as Envoy's socket address."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"not a host:port URL: {url!r}")
    return GatewayEndpoint(parts.hostname, parts.port)


class GatewayMembership:
    """The ready gateway pods of one Service, published to ``plane`` whenever they change."""

    def __init__(self, plane: ControlPlane, service: str, namespace: str, *, port_name: str = DEFAULT_PORT_NAME,
                 default_port: int = DEFAULT_PORT, configuration: Any = None, interval: float = 0.1) -> None:
        self.plane = plane
        self.discovery = KubeDiscovery(f"{SERVICE_NAME_LABEL}={service}", namespace, port_name=port_name,
                                       default_port=default_port, configuration=configuration,
                                       user_agent=USER_AGENT)
        self.interval = interval
        self.published: frozenset[GatewayEndpoint] | None = None

    async def run(self) -> None:
        while True:
            members = frozenset(endpoint_of(url) for url in await self.discovery.urls())
            if members != self.published:
                self.plane.publish(members)
                log.info("gateway replicas: %s", ", ".join(sorted(g.address for g in members)) or "none")
                self.published = members
            await asyncio.sleep(self.interval)

    async def aclose(self) -> None:
        await self.discovery.aclose()


async def serve_xds_with(main: Awaitable[T], settings: MeshSettings, service: str, namespace: str, *,
                         host: str = "127.0.0.1", port: int = 18000, configuration: Any = None) -> T:
    """Run ``main`` (the operator) while serving xDS on ``host:port`` with the gateway pods of ``service``
    (in a pod ``host`` is the pod's IP: what the xDS Service reaches, and nothing else)."""
    plane = ControlPlane(settings, host=host, port=port)
    await plane.start()
    membership = GatewayMembership(plane, service, namespace, configuration=configuration)
    watching = asyncio.create_task(membership.run(), name="xds-membership")
    log.info("xDS (ADS) on %s:%d; gateway replicas from the EndpointSlices of %s/%s", host, plane.port,
             namespace, service)
    try:
        return await main
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        await membership.aclose()
        await plane.close()
