"""The endpoint picker protocol of the Gateway API Inference Extension: its names and the shape of its values.

GIE's proposal 004 (``docs/proposals/004-endpoint-picker-protocol``) over Envoy's
``ext_proc`` stream, as far as a picker sees it:

* request, gateway -> picker: optionally, the endpoints the picker must choose
  from (``SUBSET_KEY`` in the ``SUBSET_NAMESPACE`` filter metadata);
* answer, picker -> gateway: the chosen endpoint and, after it, the fallbacks in
  order, as ``ip:port,ip:port`` in the ``DESTINATION_HEADER`` request header and
  the same value under ``DESTINATION_NAMESPACE`` in the dynamic metadata; or an
  immediate 503 (no endpoint ready) or 429 (shed);
* response, gateway -> picker: the endpoint that served the call (``SERVED_KEY``
  in the ``DESTINATION_NAMESPACE`` filter metadata). A plain Envoy reports it
  through its override-host policy's ``selected_host_key``, or as the
  ``upstream.address`` attribute of the response (``UPSTREAM_ADDRESS_ATTRIBUTE``);
* the gRPC health services the picker answers (``HEALTH_SERVICES``).

Pure functions over plain values: an engine's URL as an endpoint (``ip:port``,
an IPv6 address in brackets) and back. No gRPC, no protobuf.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

#: The request header that names the chosen endpoints (primary first), and the same key in the dynamic metadata.
DESTINATION_HEADER = "x-gateway-destination-endpoint"
#: The dynamic metadata namespace of the answer, and of the served endpoint on the response.
DESTINATION_NAMESPACE = "envoy.lb"
#: The endpoint that served the call, as the gateway reports it on the response.
SERVED_KEY = "x-gateway-destination-endpoint-served"
#: Where a gateway narrows the endpoints a call may go to.
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
#: Envoy's attribute for the address of the upstream host that answered (``response_attributes``), and
#: the namespace ext_proc puts attributes under.
UPSTREAM_ADDRESS_ATTRIBUTE = "upstream.address"
EXT_PROC_ATTRIBUTES_NAMESPACE = "envoy.filters.http.ext_proc"

#: The gRPC health services: the process is up; it takes calls; the ext_proc service takes calls (what a
#: gateway's health check of the picker asks); the name GIE's charts probe.
LIVENESS, READINESS = "liveness", "readiness"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
INFERENCE_EXTENSION = "inference-extension"
HEALTH_SERVICES = ("", LIVENESS, READINESS, EXT_PROC_SERVICE, INFERENCE_EXTENSION)
#: Services that answer SERVING only while the picker takes calls (the others: while the process runs).
READY_SERVICES = frozenset({READINESS, EXT_PROC_SERVICE, INFERENCE_EXTENSION})

#: Largest body chunk sent back in one message: Envoy implementations cap a streamed chunk at 64 KiB.
BODY_CHUNK_BYTES = 62_000


class NotAnEndpoint(ValueError):
    """An engine URL whose host is not an IP address: a gateway routes to ``ip:port`` only."""


@functools.lru_cache(maxsize=4096)  # the pool's few URLs, asked about on every call
def endpoint_of(url: str) -> str:
    """An engine's base URL as an endpoint: ``http://10.0.0.5:8000`` -> ``10.0.0.5:8000``,
    ``http://[fd00::5]:8000`` -> ``[fd00::5]:8000``; ``NotAnEndpoint`` for a host name or no port."""
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    try:
        address = ipaddress.ip_address(host or "")
    except ValueError:
        raise NotAnEndpoint(f"{url}: an endpoint's host must be an IP address (a gateway routes to ip:port)") from None
    if port is None:
        raise NotAnEndpoint(f"{url}: no port")
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def endpoint_list(endpoints: Iterable[str]) -> str:
    """The answer's value: endpoints in order, comma-separated."""
    return ",".join(endpoints)


def parse_endpoints(value: Any) -> list[str]:
    """Endpoints from a metadata value or header: ``"a,b"``, ``" a , b "`` or a list of them; empty items dropped."""
    items = value if isinstance(value, list) else [value]
    return [part.strip() for item in items if isinstance(item, str) for part in item.split(",") if part.strip()]


def subset_of(metadata: Mapping[str, Mapping[str, Any]]) -> list[str] | None:
    """The endpoints a gateway allows this call (None: no subset given, any endpoint of the pool)."""
    namespace = metadata.get(SUBSET_NAMESPACE)
    if namespace is None or SUBSET_KEY not in namespace:
        return None
    return parse_endpoints(namespace[SUBSET_KEY])


def served_of(metadata: Mapping[str, Mapping[str, Any]], attributes: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The endpoint that served the call, as the gateway reports it: the protocol's metadata first, else
    Envoy's ``upstream.address`` attribute; None when neither says."""
    served = parse_endpoints((metadata.get(DESTINATION_NAMESPACE) or {}).get(SERVED_KEY))
    if served:
        return served[0]
    address = (attributes.get(EXT_PROC_ATTRIBUTES_NAMESPACE) or {}).get(UPSTREAM_ADDRESS_ATTRIBUTE)
    return address if isinstance(address, str) and address else None


__all__ = ["BODY_CHUNK_BYTES", "DESTINATION_HEADER", "DESTINATION_NAMESPACE", "EXT_PROC_ATTRIBUTES_NAMESPACE",
           "EXT_PROC_SERVICE", "HEALTH_SERVICES", "INFERENCE_EXTENSION", "LIVENESS", "READINESS", "READY_SERVICES",
           "SERVED_KEY", "SUBSET_KEY", "SUBSET_NAMESPACE", "UPSTREAM_ADDRESS_ATTRIBUTE", "NotAnEndpoint",
           "endpoint_list", "endpoint_of", "parse_endpoints", "served_of", "subset_of"]
