"""The endpoint picker's composition root: the gateway's parts (``build_gateway``), and the picker over them.

The picker runs the aiohttp gateway's parts, built by the gateway's own
composition root from the same configuration: the store (shared through
Redis with ``gateway.store_url``) and the session rules, the engine pool and its
discovery, the request controller and its policy, tenants' keys and limits, the
metrics registry and the admin listener. Only the transport differs: Envoy's
ext_proc stream (``autellix.epp.exchange``) instead of the tenants' HTTP routes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from autellix.epp.config import PickerConfig
from autellix.epp.metrics import PickerMetrics
from autellix.epp.picker import Picker
from autellix.gateway.compose import build_gateway
from autellix.gateway.parts import Gateway


@dataclass(frozen=True)
class PickerParts:
    gateway: Gateway
    picker: Picker
    metrics: PickerMetrics
    #: Set while the picker takes calls: from the server's start until SIGTERM.
    ready: asyncio.Event


def build_picker(config: PickerConfig) -> PickerParts:
    gateway = build_gateway(config.gateway)
    metrics, ready = PickerMetrics(gateway.metrics.registry), asyncio.Event()
    return PickerParts(gateway=gateway, picker=Picker(gateway, config, metrics, ready), metrics=metrics, ready=ready)


__all__ = ["PickerParts", "build_picker"]
