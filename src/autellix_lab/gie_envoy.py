"""Envoy configured as a GIE gateway configures it: an ext_proc filter that asks the picker, a cluster that
routes by its answer.

``gie_bootstrap`` writes a static Envoy bootstrap (plain JSON, Envoy's own
schema, checked by Envoy when it loads it) with, per listener:

* a header-mutation filter that drops a client's own ``x-gateway-destination-endpoint``
  (a client never chooses its engine), then the ``ext_proc`` filter (the picker;
  request and response bodies ``FULL_DUPLEX_STREAMED``, headers and trailers sent,
  as GIE's reference gateway has it; ``failure_mode_allow`` for FailOpen, else
  FailClose with a 503; the response's upstream address, and the ``envoy.lb``
  metadata, forwarded to the picker so that it learns which endpoint served),
  then the router;
* the routing, one of two as GIE's gateways do it:

  - ``original_dst`` (GIE's reference Envoy): a request that carries the picker's
    header goes to an ``ORIGINAL_DST`` cluster that connects to the address in
    it (one endpoint: run the picker with ``--fallbacks 0``); one without it
    (FailOpen, the picker down) to the pool's endpoints, round robin;
  - ``override_host`` (Envoy 1.35 and later): one cluster of the pool's
    endpoints whose override-host policy takes the picker's list (header or
    metadata) in order, retries going down it, falls back to round robin without
    one, and reports the endpoint it picked (``x-gateway-destination-endpoint-served``).

The picker's cluster is health-checked over gRPC (the ext_proc service's
name), every second, so that a picker that stops is out within two seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from autellix.epp.contract import (
    DESTINATION_HEADER,
    DESTINATION_NAMESPACE,
    EXT_PROC_SERVICE,
    SERVED_KEY,
    SUBSET_KEY,
    SUBSET_NAMESPACE,
    UPSTREAM_ADDRESS_ATTRIBUTE,
)

Balancing = Literal["original_dst", "override_host"]
PICKER_CLUSTER, POOL_CLUSTER, PICKED_CLUSTER = "autellix-epp", "gie-pool", "gie-picked"
_TYPES = "type.googleapis.com/envoy."


@dataclass(frozen=True)
class GatewayListener:
    """One listener of the gateway: its port, what it does when the picker cannot answer (FailOpen: route
    anyway, FailClose: 503), how request and response bodies go to the picker (``FULL_DUPLEX_STREAMED``,
    GIE's, or ``BUFFERED``), and the endpoints it lets a request go to (a subset hint; None: any of the
    pool's).

    FailOpen needs ``BUFFERED`` request bodies: Envoy streams a ``FULL_DUPLEX_STREAMED`` body to the picker
    without waiting, and when the picker cannot be reached that body is gone, so Envoy answers 503 even
    with ``failure_mode_allow``; a buffered body is sent only once the picker took the headers."""

    port: int
    fail_open: bool = False
    request_body: str = "FULL_DUPLEX_STREAMED"
    response_body: str = "FULL_DUPLEX_STREAMED"
    subset_hint: tuple[str, ...] | None = None
    host: str = "127.0.0.1"
    #: False: no picker at all, the pool round robin (Envoy's own cost, for comparisons).
    picker: bool = True

    @classmethod
    def failing_open(cls, port: int, **fields: Any) -> GatewayListener:
        """A FailOpen listener: requests go on to any engine of the pool while the picker cannot answer."""
        return cls(port, fail_open=True, request_body="BUFFERED", **fields)


def _address(endpoint: str) -> dict[str, Any]:
    host, _, port = endpoint.rpartition(":")
    return {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}


def _cluster(name: str, endpoints: Sequence[str], **fields: Any) -> dict[str, Any]:
    return {"name": name, "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": name, "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _address(e)}} for e in endpoints]}]}, **fields}


def _override_host_policy() -> dict[str, Any]:
    return {"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {
            "@type": _TYPES + "extensions.load_balancing_policies.override_host.v3.OverrideHost",
            "override_host_sources": [
                {"header": DESTINATION_HEADER},
                {"metadata": {"key": DESTINATION_NAMESPACE, "path": [{"key": DESTINATION_HEADER}]}}],
            "selected_host_key": {"key": DESTINATION_NAMESPACE, "path": [{"key": SERVED_KEY}]},
            "fallback_policy": {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.round_robin",
                "typed_config": {"@type": _TYPES + "extensions.load_balancing_policies.round_robin.v3.RoundRobin"},
            }}]},
        }}}]}


def _routes(balancing: Balancing, retries: int, upstream_header: str | None) -> list[dict[str, Any]]:
    retry = {"retry_on": "connect-failure,refused-stream,reset-before-request,retriable-status-codes",
             "retriable_status_codes": [503], "num_retries": retries}
    extra: dict[str, Any] = {}
    if upstream_header is not None:  # an observation point for tests: which upstream answered
        extra["response_headers_to_add"] = [{"header": {"key": upstream_header,
                                                        "value": "%UPSTREAM_REMOTE_ADDRESS%"}}]
    to_pool = {"match": {"prefix": "/"}, "route": {"cluster": POOL_CLUSTER, "timeout": "0s", "retry_policy": retry},
               **extra}
    if balancing == "override_host":
        return [to_pool]
    picked = {"match": {"prefix": "/", "headers": [{"name": DESTINATION_HEADER, "present_match": True}]},
              "route": {"cluster": PICKED_CLUSTER, "timeout": "0s"}, **extra}
    return [picked, to_pool]


def _filters(listener: GatewayListener) -> list[dict[str, Any]]:
    hint = [] if listener.subset_hint is None else [{"name": "envoy.filters.http.set_metadata", "typed_config": {
        "@type": _TYPES + "extensions.filters.http.set_metadata.v3.Config",
        "metadata": [{"metadata_namespace": SUBSET_NAMESPACE,
                      "value": {SUBSET_KEY: list(listener.subset_hint)}}]}}]
    router = {"name": "envoy.filters.http.router", "typed_config": {
        "@type": _TYPES + "extensions.filters.http.router.v3.Router", "suppress_envoy_headers": True}}
    strip = {"name": "envoy.filters.http.header_mutation", "typed_config": {
        "@type": _TYPES + "extensions.filters.http.header_mutation.v3.HeaderMutation",
        "mutations": {"request_mutations": [{"remove": DESTINATION_HEADER}]}}}
    if not listener.picker:
        return [strip, router]
    return [
        strip,
        *hint,
        {"name": "envoy.filters.http.ext_proc", "typed_config": {
            "@type": _TYPES + "extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": PICKER_CLUSTER}, "timeout": "30s"},
            "failure_mode_allow": listener.fail_open,
            "status_on_error": {"code": "ServiceUnavailable"},
            "processing_mode": {"request_header_mode": "SEND", "response_header_mode": "SEND",
                                "request_body_mode": listener.request_body,
                                "response_body_mode": listener.response_body,
                                "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"},
            "message_timeout": "10s",
            "response_attributes": [UPSTREAM_ADDRESS_ATTRIBUTE],
            "metadata_options": {"forwarding_namespaces": {"untyped": [DESTINATION_NAMESPACE, SUBSET_NAMESPACE]}}}},
        router,
    ]


def gie_bootstrap(*, picker: str, pool: Sequence[str], listeners: Sequence[GatewayListener],
                  balancing: Balancing = "original_dst", retries: int = 2, admin_port: int = 0,
                  upstream_header: str | None = None) -> dict[str, Any]:
    """The bootstrap of a gateway in front of ``pool`` (``ip:port`` endpoints: the InferencePool's) whose
    endpoint picker listens at ``picker`` (``ip:port``). ``retries``: attempts after the first, down the
    picker's list (``override_host``) or over the pool (FailOpen); an engine that refuses the connection
    or answers 503 took nothing, so the next one may. ``upstream_header``:
    a response header naming the upstream that answered (tests); None: none."""
    routes = _routes(balancing, retries, upstream_header)
    clusters: list[dict[str, Any]] = [
        _cluster(PICKER_CLUSTER, [picker], connect_timeout="0.25s",
                 typed_extension_protocol_options={"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                     "@type": _TYPES + "extensions.upstreams.http.v3.HttpProtocolOptions",
                     "explicit_http_config": {"http2_protocol_options": {}}}},
                 health_checks=[{"timeout": "1s", "interval": "1s", "unhealthy_threshold": 2,
                                 "healthy_threshold": 1, "no_traffic_interval": "1s",
                                 "grpc_health_check": {"service_name": EXT_PROC_SERVICE}}],
                 circuit_breakers={"thresholds": [{"max_connections": 100_000, "max_pending_requests": 100_000,
                                                   "max_requests": 100_000}]}),
        _cluster(POOL_CLUSTER, pool, **({"load_balancing_policy": _override_host_policy()}
                                        if balancing == "override_host" else {})),
    ]
    if balancing == "original_dst":
        clusters.append({"name": PICKED_CLUSTER, "type": "ORIGINAL_DST", "connect_timeout": "1s",
                         "lb_policy": "CLUSTER_PROVIDED",
                         "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER}})
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [{
                "name": f"gie-{listener.port}",
                "address": {"socket_address": {"address": listener.host, "port_value": listener.port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": _TYPES + "extensions.filters.network.http_connection_manager.v3."
                                          "HttpConnectionManager",
                        "stat_prefix": f"gie_{listener.port}",
                        "route_config": {"name": "gie", "virtual_hosts": [
                            {"name": "pool", "domains": ["*"], "routes": routes}]},
                        "http_filters": _filters(listener)}}]}],
            } for listener in listeners],
            "clusters": clusters,
        },
    }


__all__ = ["PICKED_CLUSTER", "PICKER_CLUSTER", "POOL_CLUSTER", "Balancing", "GatewayListener", "gie_bootstrap"]
