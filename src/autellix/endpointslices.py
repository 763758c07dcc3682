"""Engine URLs from Kubernetes EndpointSlices: the pure part, shared by the
gateway's discovery (``autellix.gateway.kube_discovery``) and the operator
(``autellix.kube``), so both name an engine by the same URL.

Each ready endpoint of a slice is one engine, ``http://<pod IP>:<port named
"http">``: the gateway balances over pods, not over Services (Algorithm 2
needs to know which pod holds a program's KV cache). Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

DEFAULT_ENGINE_SELECTOR = "app.kubernetes.io/component=engine"
DEFAULT_PORT_NAME = "http"
DEFAULT_PORT = 8000

SliceKey = tuple[str, str]  # (namespace, name)


def _host(address: str, address_type: str) -> str:
    """An IPv6 address goes in brackets in a URL."""
    return f"[{address}]" if address_type == "IPv6" or ":" in address else address


def slice_port(ports: Iterable[Mapping[str, Any]] | None, port_name: str, default_port: int) -> int:
    """The slice's port named ``port_name``; ``default_port`` when it has none of that name."""
    for port in ports or ():
        if port.get("name") == port_name and isinstance(port.get("port"), int):
            return port["port"]
    return default_port


def endpoint_ready(endpoint: Mapping[str, Any]) -> bool:
    """Kubernetes: a missing ``ready`` is unknown and to be read as ready;
    a terminating pod's endpoint is not ready."""
    conditions = endpoint.get("conditions") or {}
    return conditions.get("ready") is not False


def slice_urls(slices: Iterable[Mapping[str, Any]], *, port_name: str = DEFAULT_PORT_NAME,
               default_port: int = DEFAULT_PORT) -> set[str]:
    """Engine base URLs of every ready endpoint of the given EndpointSlices (JSON form)."""
    urls: set[str] = set()
    for eps in slices:
        address_type = eps.get("addressType", "IPv4")
        port = slice_port(eps.get("ports"), port_name, default_port)
        for endpoint in eps.get("endpoints") or ():
            if not endpoint_ready(endpoint):
                continue
            addresses = endpoint.get("addresses") or []
            if addresses:  # every address of one endpoint is the same pod: Kubernetes says use the first
                urls.add(f"http://{_host(addresses[0], address_type)}:{port}")
    return urls


def slice_key(eps: Mapping[str, Any]) -> SliceKey:
    meta = eps.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""
