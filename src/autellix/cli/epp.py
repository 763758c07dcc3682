"""``autellix epp``: Autellix as the endpoint picker of a Gateway API Inference Extension gateway (Envoy's ext_proc)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autellix.backends import BACKENDS, DEFAULT_BACKEND
from autellix.cli.common import fail, one_of
from autellix.cli.gateway import (
    AdminHost,
    AdminKeysFile,
    DiscoveryKind,
    TenantMaxConcurrent,
    TenantMaxQueued,
    TenantQueueTimeout,
    TenantRpm,
    engine_source,
)
from autellix.cli.options import NO_OVERRIDES, SchedulerOverrides, scheduler_options


@scheduler_options("policy", "beta", "backlog_factor", "balancer")
def epp(
    engine: Annotated[list[str] | None, typer.Option(
        "--engine", help="Engine base URL, its host an IP address (repeatable; static)")] = None,
    discovery: Annotated[DiscoveryKind, typer.Option(
        help="static: the --engine URLs; kubernetes: ready endpoints of the engine Services")] = DiscoveryKind.static,
    engine_selector: Annotated[str, typer.Option(
        help="kubernetes: label selector of the engines' EndpointSlices (the InferencePool's selector)")] = (
        "app.kubernetes.io/component=engine"),
    namespace: Annotated[str | None, typer.Option(help="kubernetes: namespace to watch (default: all)")] = None,
    engine_port_name: Annotated[str, typer.Option(
        help="kubernetes: name of the engines' HTTP port (8000 when a slice has none of that name)")] = "http",
    host: Annotated[str, typer.Option(help="Address of the gRPC server and the HTTP listener")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="gRPC: Envoy's ext_proc service and gRPC health")] = 9002,
    metrics_port: Annotated[int, typer.Option(
        min=0, max=65535, help="HTTP: /metrics, /health, /ready")] = 9090,
    fallbacks: Annotated[int, typer.Option(
        min=0, help="Endpoints named after the chosen one, least loaded first (0 for a gateway that routes by "
                    "one endpoint: Envoy's ORIGINAL_DST cluster)")] = 0,
    decision_timeout: Annotated[float, typer.Option(
        min=0.001, help="Seconds from a call's body to its routing answer; then 503")] = 10.0,
    overrides: SchedulerOverrides = NO_OVERRIDES,
    backend: Annotated[str, typer.Option(help=f"The engines' kind: {one_of(BACKENDS)}")] = DEFAULT_BACKEND,
    tokenizer: Annotated[Path | None, typer.Option(help="tokenizer.json for exact prompt lengths")] = None,
    store: Annotated[str | None, typer.Option(
        envvar="AUTELLIX_STORE", help="Program store shared with other pickers and gateways, redis://HOST:PORT/DB; "
                                      "default: in memory")] = None,
    api_keys_file: Annotated[Path | None, typer.Option(
        help="Tenants' keys (file or Secret directory); also $AUTELLIX_API_KEYS. Without: calls are anonymous")] = None,
    allow_anonymous: Annotated[bool, typer.Option(
        help="Listen beyond loopback without tenant keys (the gateway in front authenticates)")] = False,
    admin_port: Annotated[int | None, typer.Option(
        min=0, help="The admin listener's port (engines, drain, calls, sessions); none without")] = None,
    admin_host: AdminHost = "127.0.0.1",
    admin_keys_file: AdminKeysFile = None,
    tenant_max_concurrent: TenantMaxConcurrent = None,
    tenant_max_queued: TenantMaxQueued = 0,
    tenant_queue_timeout: TenantQueueTimeout = 30.0,
    tenant_rpm: TenantRpm = None,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Largest request body read (413 past it)")] = (
        4 * 1024 * 1024),
    max_n: Annotated[int, typer.Option(min=1, help="Largest 'n' a call may ask for")] = 16,
    max_tokens: Annotated[int, typer.Option(min=1, help="Largest 'max_tokens' a call may ask for")] = 32_768,
    shutdown_grace: Annotated[float, typer.Option(
        min=0, help="SIGTERM: seconds for the calls in flight to finish (unready meanwhile)")] = 30.0,
) -> None:
    """Serve Envoy's ext_proc as a GIE endpoint picker: Autellix's scheduling for any Gateway in front."""
    from autellix.control.keys import KeysError
    from autellix.control.limits import TenantLimits
    from autellix.epp.config import PickerConfig
    from autellix.epp.contract import NotAnEndpoint, endpoint_of
    from autellix.epp.serve import ExposedError, serve
    from autellix.gateway.config import GatewayConfig

    if backend not in BACKENDS:
        raise fail(f"unknown engine backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    engines, source = engine_source(engine, discovery, engine_selector, namespace, engine_port_name)
    try:
        for url in engines:
            endpoint_of(url)
    except NotAnEndpoint as exc:
        raise fail(str(exc)) from None
    limits = TenantLimits(max_concurrent=tenant_max_concurrent, max_queued=tenant_max_queued,
                          queue_timeout_s=tenant_queue_timeout, requests_per_minute=tenant_rpm)
    gateway = GatewayConfig(engines=engines, scheduler=overrides.config(), tokenizer=tokenizer,
                            api_keys_file=api_keys_file, discovery=source, backend=backend,
                            allow_anonymous=allow_anonymous, admin_port=admin_port, admin_host=admin_host,
                            admin_keys_file=admin_keys_file, tenant_limits=limits, max_body_bytes=max_body_bytes,
                            max_n=max_n, max_tokens=max_tokens)
    try:
        config = PickerConfig(gateway=gateway, host=host, port=port, metrics_port=metrics_port, fallbacks=fallbacks,
                              decision_timeout=decision_timeout, store_url=store, shutdown_grace=shutdown_grace)
        serve(config)
    except (ExposedError, KeysError, ValueError, OSError) as exc:
        raise fail(str(exc)) from None
