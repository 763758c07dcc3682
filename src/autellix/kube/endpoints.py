"""Which pod is behind which engine URL (pure), from the engine Service's EndpointSlices.

The URL of an endpoint is the gateway discovery's own (``slice_urls``), so the
operator names engines exactly as the gateway's pool does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from autellix.endpointslices import slice_urls


def endpoint_pods(slices: Iterable[Mapping[str, Any]]) -> dict[str, str | None]:
    """Engine URL -> pod name, for every ready endpoint of the slices."""
    pods: dict[str, str | None] = {}
    for eps in slices:
        for endpoint in eps.get("endpoints") or ():
            for url in slice_urls([{**eps, "endpoints": [endpoint]}]):
                pods[url] = (endpoint.get("targetRef") or {}).get("name")
    return pods
