"""The endpoint picker's configuration: the gateway's (engines, scheduler, tenants, store) and the picker's own."""

from __future__ import annotations

from dataclasses import dataclass, field

from autellix.gateway.config import GatewayConfig


@dataclass
class PickerConfig:
    #: Everything the picker shares with the aiohttp gateway: engines and their discovery, the scheduler, the
    #: backend, tenant keys and limits, the checks of a call's body, the admin listener, and the store shared
    #: with other pickers and gateways (``gateway.store_url``; None: in memory).
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    #: Where the gRPC server listens: Envoy's ext_proc service and the gRPC health services.
    host: str = "127.0.0.1"
    port: int = 9002
    #: HTTP: ``/metrics`` (Prometheus), ``/health``, ``/ready``; None: no HTTP listener.
    metrics_port: int | None = 9090
    #: Endpoints named after the chosen one, least loaded first, for the gateway to try in order when the
    #: chosen one cannot take the call. 0 for a gateway that reads one endpoint (Envoy's ORIGINAL_DST
    #: cluster); a gateway with Envoy's override-host policy, or GIE's implementations, take a list.
    fallbacks: int = 0
    #: Seconds from a call's last body byte to the routing answer (the program store's round trips, say);
    #: past it the call gets a 503. A tenant's queue wait is bounded on its own (``tenant_limits``).
    decision_timeout: float = 10.0
    #: SIGTERM: seconds the picker stays up, unready, for the calls in flight to finish.
    shutdown_grace: float = 30.0

    def __post_init__(self) -> None:
        if self.fallbacks < 0:
            raise ValueError(f"fallbacks: expected 0 or more, got {self.fallbacks}")
        if not self.decision_timeout > 0:
            raise ValueError(f"decision_timeout: expected seconds > 0, got {self.decision_timeout}")


__all__ = ["PickerConfig"]
