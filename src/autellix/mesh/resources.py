"""Envoy's configuration for the gateway replicas, as the real Envoy API types.

One listener (the OpenAI endpoint) whose HTTP connection manager takes its routes
from RDS; one route configuration sending everything to the gateway cluster with
consistent hashing on the program key; one EDS cluster whose endpoints are the
gateway replicas. All of it comes over ADS, so Envoy's bootstrap only names the
control plane.

The program key, in order (the first one present wins, like the gateway's own
``Sessions.resolve``): ``X-Autellix-Session``, else each agent session header the
gateway accepts, else none (the call goes to any replica: it is a one-call
program). ``GET/DELETE /v1/sessions/{id}`` carry the id in the path, so that
route hashes the id taken out of ``:path``; Envoy hashes a header's value with
xxHash64 either way, so both land on the same replica.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import betterproto2
from envoy_data_plane.envoy.config.cluster.v3 import (
    CircuitBreakers,
    CircuitBreakersThresholds,
    CircuitBreakersThresholdsRetryBudget,
    Cluster,
    ClusterCommonLbConfig,
    ClusterDiscoveryType,
    ClusterEdsClusterConfig,
    ClusterLbPolicy,
    ClusterMaglevLbConfig,
    ClusterRingHashLbConfig,
    OutlierDetection,
)
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    AggregatedConfigSource,
    ApiVersion,
    ConfigSource,
    HealthCheck,
    HealthCheckHttpHealthCheck,
    Http1ProtocolOptions,
    HttpProtocolOptions,
    SocketAddress,
)
from envoy_data_plane.envoy.config.endpoint.v3 import ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
from envoy_data_plane.envoy.config.route.v3 import (
    RetryPolicy,
    RetryPolicyRetryHostPredicate,
    Route,
    RouteAction,
    RouteActionHashPolicy,
    RouteActionHashPolicyHeader,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerCodecType,
    HttpFilter,
    Rds,
)
from envoy_data_plane.envoy.extensions.retry.host.previous_hosts.v3 import PreviousHostsPredicate
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import HttpProtocolOptions as UpstreamHttpProtocolOptions
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import HttpProtocolOptionsExplicitHttpConfig
from envoy_data_plane.envoy.type.matcher.v3 import RegexMatchAndSubstitute, RegexMatcher
from envoy_data_plane.envoy.type.v3 import Percent
from envoy_data_plane.google.protobuf import Any

# The wire contract: Envoy must hash exactly the headers the gateway reads.
from autellix.protocol import PROGRAM_KEY_HEADERS, READY_PATH, SESSIONS_PATH

LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE_TYPE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
#: The order in which a new Envoy asks, and in which changes are safest to apply
#: (clusters before the endpoints and routes that name them).
RESOURCE_TYPES = (CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE)

#: ``/v1/sessions/{id}``: the program key is in the path.
SESSION_PATH_REGEX = rf"^{SESSIONS_PATH}/([^/?]+)(?:\?.*)?$"
#: Retry a call on another replica when its replica refused it or went away
#: before answering (a crash, a SIGKILL): the gateway's own rule for engines
#: (``docs/gateway.md``, Failures). A dead replica's connections to its engine
#: close with it, so the engine aborts the first attempt instead of finishing
#: it. Never once a response began (Envoy does not retry then), and never on a
#: replica's own 5xx: that is an answer, and another replica would give the same.
RETRY_ON = "connect-failure,refused-stream,reset"


class LoadBalancing(StrEnum):
    """Envoy's consistent-hash load balancers. Maglev is the default: when a replica
    leaves, only its own programs move. Envoy's ring hash keeps the ring's total size
    and splits it over the replicas left, so some programs move between survivors
    too: 18 of 104 with 3 replicas down to 2, against 0 of 390 for Maglev
    (measured through Envoy 1.40, ``docs/cluster.md``)."""

    maglev = "maglev"
    ring_hash = "ring_hash"


@dataclass(frozen=True)
class GatewayEndpoint:
    """One gateway replica as Envoy reaches it."""

    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class MeshSettings:
    """Everything in Envoy's configuration that is not the replica list."""

    listen_host: str = "127.0.0.1"
    listen_port: int = 8000
    listener_name: str = "autellix-openai"
    route_name: str = "autellix-routes"
    cluster_name: str = "autellix-gateways"
    load_balancing: LoadBalancing = LoadBalancing.maglev
    #: Active health checks on the replicas' readiness route: a replica that is
    #: not ready (no engine, or shutting down) stops getting new calls.
    health_path: str = READY_PATH
    health_interval_s: float = 1.0
    health_timeout_s: float = 1.0
    unhealthy_threshold: int = 2
    healthy_threshold: int = 1
    #: Outlier detection: a replica whose connections fail is ejected at once,
    #: without waiting for the health checks (a SIGKILLed replica refuses them).
    consecutive_gateway_failures: int = 2
    outlier_interval_s: float = 1.0
    base_ejection_s: float = 10.0
    max_ejection_percent: int = 50
    connect_timeout_s: float = 1.0
    upstream_idle_s: float = 60.0
    #: Retries of a call whose replica refused it or went away before answering (RETRY_ON),
    #: each on another replica.
    retries: int = 2
    #: Retries in flight at once: this share of the calls in flight, and at least this many.
    retry_budget_percent: float = 50.0
    min_retry_concurrency: int = 64
    #: Request bodies up to this size are kept for a retry (the gateway's default --max-body-bytes).
    retry_body_limit_bytes: int = 4 * 1024 * 1024
    #: No route timeout (a long LLM call or stream is never cut); only a stream that
    #: sends nothing in either direction for this long is ended. A whole (non-streamed)
    #: call sends nothing until its end, so this bounds the longest whole call.
    stream_idle_timeout_s: float = 3600.0
    session_headers: tuple[str, ...] = field(default=PROGRAM_KEY_HEADERS)


def _seconds(value: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=value)


def _ads_source() -> ConfigSource:
    return ConfigSource(ads=AggregatedConfigSource(), resource_api_version=ApiVersion.V3)


def hash_policies(header_names: Sequence[str]) -> list[RouteActionHashPolicy]:
    """One terminal policy per header, in order: Envoy stops at the first header
    present, and with none present the call has no key (any replica)."""
    return [RouteActionHashPolicy(header=RouteActionHashPolicyHeader(header_name=name), terminal=True)
            for name in header_names]


def _session_path_policy() -> RouteActionHashPolicy:
    return RouteActionHashPolicy(
        header=RouteActionHashPolicyHeader(
            header_name=":path",
            regex_rewrite=RegexMatchAndSubstitute(pattern=RegexMatcher(regex=SESSION_PATH_REGEX), substitution=r"\1"),
        ),
        terminal=True,
    )


def _route_action(settings: MeshSettings, policies: list[RouteActionHashPolicy]) -> RouteAction:
    return RouteAction(
        cluster=settings.cluster_name,
        timeout=_seconds(0),  # 0 disables the route timeout: streams and long calls run to their end
        hash_policy=policies,
        retry_policy=RetryPolicy(
            retry_on=RETRY_ON,
            num_retries=settings.retries,
            # A retry goes to another replica (Maglev and ring hash offset the key per attempt).
            retry_host_predicate=[RetryPolicyRetryHostPredicate(
                name="envoy.retry_host_predicates.previous_hosts",
                typed_config=Any.pack(PreviousHostsPredicate()))],
            host_selection_retry_max_attempts=5,
        ),
    )


def route_configuration(settings: MeshSettings) -> RouteConfiguration:
    session_route = Route(
        name="session-by-path",
        match=RouteMatch(safe_regex=RegexMatcher(regex=rf"^{SESSIONS_PATH}/[^/]+$")),
        route=_route_action(settings, [_session_path_policy(), *hash_policies(settings.session_headers)]),
        request_body_buffer_limit=settings.retry_body_limit_bytes,
    )
    default_route = Route(
        name="program-key",
        match=RouteMatch(prefix="/"),
        route=_route_action(settings, hash_policies(settings.session_headers)),
        request_body_buffer_limit=settings.retry_body_limit_bytes,
    )
    return RouteConfiguration(
        name=settings.route_name,
        virtual_hosts=[VirtualHost(name="autellix", domains=["*"], routes=[session_route, default_route])],
    )


def listener(settings: MeshSettings) -> Listener:
    manager = HttpConnectionManager(
        stat_prefix="autellix",
        codec_type=HttpConnectionManagerCodecType.AUTO,
        rds=Rds(config_source=_ads_source(), route_config_name=settings.route_name),
        http_filters=[HttpFilter(name="envoy.filters.http.router", typed_config=Any.pack(Router()))],
        stream_idle_timeout=_seconds(settings.stream_idle_timeout_s),
        request_timeout=_seconds(0),
    )
    return Listener(
        name=settings.listener_name,
        address=Address(socket_address=SocketAddress(address=settings.listen_host, port_value=settings.listen_port)),
        filter_chains=[FilterChain(filters=[Filter(name="envoy.filters.network.http_connection_manager",
                                                   typed_config=Any.pack(manager))])],
    )


def cluster(settings: MeshSettings) -> Cluster:
    balancing: dict[str, object]
    if settings.load_balancing is LoadBalancing.ring_hash:
        balancing = {"lb_policy": ClusterLbPolicy.RING_HASH,
                     "ring_hash_lb_config": ClusterRingHashLbConfig(minimum_ring_size=1024)}
    else:
        balancing = {"lb_policy": ClusterLbPolicy.MAGLEV, "maglev_lb_config": ClusterMaglevLbConfig()}
    return Cluster(
        name=settings.cluster_name,
        type=ClusterDiscoveryType.EDS,
        eds_cluster_config=ClusterEdsClusterConfig(eds_config=_ads_source()),
        connect_timeout=_seconds(settings.connect_timeout_s),
        health_checks=[HealthCheck(
            timeout=_seconds(settings.health_timeout_s),
            interval=_seconds(settings.health_interval_s),
            # Before its first call Envoy checks at this interval, not 60 s.
            no_traffic_interval=_seconds(settings.health_interval_s),
            unhealthy_threshold=settings.unhealthy_threshold,
            healthy_threshold=settings.healthy_threshold,
            http_health_check=HealthCheckHttpHealthCheck(path=settings.health_path),
        )],
        outlier_detection=OutlierDetection(
            consecutive_gateway_failure=settings.consecutive_gateway_failures,
            enforcing_consecutive_gateway_failure=100,
            interval=_seconds(settings.outlier_interval_s),
            base_ejection_time=_seconds(settings.base_ejection_s),
            max_ejection_percent=settings.max_ejection_percent,
        ),
        # Idle upstream connections close before aiohttp's keep-alive (75 s) closes them under a call.
        typed_extension_protocol_options={"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": Any.pack(
            UpstreamHttpProtocolOptions(
                common_http_protocol_options=HttpProtocolOptions(idle_timeout=_seconds(settings.upstream_idle_s)),
                explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
                    http_protocol_options=Http1ProtocolOptions())))},
        # Envoy allows 3 retries in flight per cluster by default; a replica's death makes
        # every call in flight on it retry at once (1/N of the cluster's), and the rest
        # would get 503 (upstream_rq_retry_overflow: 8 of 400 calls with 16 callers, real
        # vLLM). Retries stay bounded: only resets and refusals are retried.
        circuit_breakers=CircuitBreakers(thresholds=[CircuitBreakersThresholds(
            retry_budget=CircuitBreakersThresholdsRetryBudget(
                budget_percent=Percent(value=settings.retry_budget_percent),
                min_retry_concurrency=settings.min_retry_concurrency))]),
        # A replica removed from membership leaves at once, not after failing its checks.
        ignore_health_on_host_removal=True,
        # No panic mode: with most replicas unhealthy Envoy would spread calls over
        # dead ones too. Only healthy replicas serve; none healthy gives a clear 503.
        common_lb_config=ClusterCommonLbConfig(
            healthy_panic_threshold=Percent(value=0.0),
            # Health changes reach the load balancer at once, not merged over Envoy's default 1 s:
            # a replica that passed its first check takes programs, a failing one sheds them, now.
            update_merge_window=_seconds(0),
        ),
        **balancing,  # type: ignore[arg-type]
    )


def load_assignment(settings: MeshSettings, endpoints: Sequence[GatewayEndpoint]) -> ClusterLoadAssignment:
    return ClusterLoadAssignment(
        cluster_name=settings.cluster_name,
        endpoints=[LocalityLbEndpoints(lb_endpoints=[
            LbEndpoint(endpoint=Endpoint(address=Address(socket_address=SocketAddress(address=e.host,
                                                                                   port_value=e.port))))
            for e in sorted(set(endpoints), key=lambda e: (e.host, e.port))])],
    )


def mesh_resources(settings: MeshSettings, endpoints: Sequence[GatewayEndpoint]
                   ) -> dict[str, dict[str, betterproto2.Message]]:
    """Every resource Envoy needs, by type URL and name."""
    return {
        CLUSTER_TYPE: {settings.cluster_name: cluster(settings)},
        ENDPOINT_TYPE: {settings.cluster_name: load_assignment(settings, endpoints)},
        LISTENER_TYPE: {settings.listener_name: listener(settings)},
        ROUTE_TYPE: {settings.route_name: route_configuration(settings)},
    }


def content_version(resources: dict[str, betterproto2.Message]) -> str:
    """A version that changes exactly when the resources' bytes do."""
    digest = hashlib.sha256()
    for name in sorted(resources):
        digest.update(name.encode() + b"\0" + bytes(resources[name]) + b"\0")
    return digest.hexdigest()[:16]
