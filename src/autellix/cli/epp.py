"""``autellix epp``: Autellix as the endpoint picker of a Gateway API Inference Extension gateway (Envoy's ext_proc)."""

from __future__ import annotations

from typing import Annotated

import typer

from autellix.backends import BACKENDS, DEFAULT_BACKEND
from autellix.cli import options
from autellix.cli.common import fail, one_of


@options.gateway_options(help_text={
    "engine": "Engine base URL, its host an IP address (repeatable; static)",
    "engine_selector": "kubernetes: label selector of the engines' EndpointSlices (the InferencePool's selector)",
    "api_keys_file": "Tenants' keys (file or Secret directory); also $AUTELLIX_API_KEYS. Without: calls are "
                     "anonymous",
    "allow_anonymous": "Listen beyond loopback without tenant keys (the gateway in front authenticates)"})
def epp(
    engines: options.EngineOptions = options.NO_ENGINES,
    host: Annotated[str, typer.Option(help="Address of the gRPC server and the HTTP listener")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="gRPC: Envoy's ext_proc service and gRPC health")] = 9002,
    metrics_port: Annotated[int, typer.Option(
        min=0, max=65535, help="HTTP: /metrics, /health, /ready")] = 9090,
    fallbacks: Annotated[int, typer.Option(
        min=0, help="Endpoints named after the chosen one, least loaded first (0 for a gateway that routes by "
                    "one endpoint: Envoy's ORIGINAL_DST cluster)")] = 0,
    decision_timeout: Annotated[float, typer.Option(
        min=0.001, help="Seconds from a call's body to its routing answer; then 503")] = 10.0,
    overrides: options.SchedulerOverrides = options.NO_OVERRIDES,
    backend: Annotated[str, typer.Option(help=f"The engines' kind: {one_of(BACKENDS)}")] = DEFAULT_BACKEND,
    tokenizer: options.TokenizerOption = None,
    kv_index: options.KvIndexOption = True,
    store: Annotated[str | None, typer.Option(
        envvar="AUTELLIX_STORE", help="Program store shared with other pickers and gateways, redis://HOST:PORT/DB; "
                                      "default: in memory")] = None,
    access: options.AccessOptions = options.NO_ACCESS,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Largest request body read (413 past it)")] = (
        4 * 1024 * 1024),
    max_n: Annotated[int, typer.Option(min=1, help="Largest 'n' a call may ask for")] = 16,
    max_tokens: Annotated[int, typer.Option(min=1, help="Largest 'max_tokens' a call may ask for")] = 32_768,
    shutdown_grace: Annotated[float, typer.Option(
        min=0, help="SIGTERM: seconds for the calls in flight to finish (unready meanwhile)")] = 30.0,
) -> None:
    """Serve Envoy's ext_proc as a GIE endpoint picker: Autellix's scheduling for any Gateway in front."""
    from autellix.control.keys import KeysError
    from autellix.epp.config import PickerConfig
    from autellix.epp.contract import NotAnEndpoint, endpoint_of
    from autellix.epp.serve import ExposedError, serve
    from autellix.gateway.config import GatewayConfig

    if backend not in BACKENDS:
        raise fail(f"unknown engine backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    urls, source = engines.source()
    try:
        for url in urls:
            endpoint_of(url)
    except NotAnEndpoint as exc:
        raise fail(str(exc)) from None
    gateway = GatewayConfig(engines=urls, scheduler=overrides.config(), tokenizer=tokenizer, kv_index=kv_index,
                            discovery=source,
                            backend=backend, **access.listeners(), tenant_limits=access.limits(),
                            max_body_bytes=max_body_bytes, max_n=max_n, max_tokens=max_tokens, store_url=store)
    try:
        config = PickerConfig(gateway=gateway, host=host, port=port, metrics_port=metrics_port, fallbacks=fallbacks,
                              decision_timeout=decision_timeout, shutdown_grace=shutdown_grace)
        serve(config)
    except (ExposedError, KeysError, ValueError, OSError) as exc:
        raise fail(str(exc)) from None
