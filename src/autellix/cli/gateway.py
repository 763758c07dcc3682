"""``autellix gateway``: the OpenAI-compatible gateway in front of running engines."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from autellix.backends import BACKENDS, DEFAULT_BACKEND
from autellix.cli.common import fail, one_of
from autellix.cli.options import NO_OVERRIDES, SchedulerOverrides, scheduler_options

if TYPE_CHECKING:
    from autellix.gateway.engines import Discovery


class DiscoveryKind(enum.StrEnum):
    static = "static"
    kubernetes = "kubernetes"


#: Options the gateway and the endpoint picker share (``autellix gateway``, ``autellix epp``).
AdminHost = Annotated[str, typer.Option(help="The admin listener's address")]
AdminKeysFile = Annotated[Path | None, typer.Option(
    help="Admin keys (file or Secret directory); also $AUTELLIX_ADMIN_KEYS; needed beyond loopback")]
TenantMaxConcurrent = Annotated[int | None, typer.Option(min=1, help="Calls one tenant may run at once")]
TenantMaxQueued = Annotated[int, typer.Option(min=0, help="Calls one tenant may queue beyond those")]
TenantQueueTimeout = Annotated[float, typer.Option(min=0.1, help="Seconds a queued call waits, then 429")]
TenantRpm = Annotated[float | None, typer.Option(min=0.001, help="Requests per minute per tenant")]


def engine_source(engine: list[str] | None, discovery: DiscoveryKind, engine_selector: str, namespace: str | None,
                  engine_port_name: str) -> tuple[list[str], Discovery | None]:
    """The static engine URLs, or the Kubernetes discovery that finds them (the gateway's and the picker's)."""
    engines = list(engine or [])
    if discovery is DiscoveryKind.static and not engines:
        raise fail("give at least one --engine URL, or --discovery kubernetes")
    if discovery is DiscoveryKind.static:
        return engines, None
    if engines:
        raise fail("--engine is for --discovery static; kubernetes discovery finds the engines itself")
    from autellix.gateway.kube_discovery import KubeDiscovery

    return [], KubeDiscovery(engine_selector, namespace or None, port_name=engine_port_name)


@scheduler_options("policy", "beta", "backlog_factor", "balancer")
def gateway(
    engine: Annotated[list[str] | None, typer.Option("--engine", help="Engine base URL (repeatable; static)")] = None,
    discovery: Annotated[DiscoveryKind, typer.Option(
        help="static: the --engine URLs; kubernetes: ready endpoints of the engine Services")] = DiscoveryKind.static,
    engine_selector: Annotated[str, typer.Option(
        help="kubernetes: label selector of the engines' EndpointSlices")] = "app.kubernetes.io/component=engine",
    namespace: Annotated[str | None, typer.Option(help="kubernetes: namespace to watch (default: all)")] = None,
    engine_port_name: Annotated[str, typer.Option(
        help="kubernetes: name of the engines' HTTP port (8000 when a slice has none of that name)")] = "http",
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8000,
    overrides: SchedulerOverrides = NO_OVERRIDES,
    backend: Annotated[str, typer.Option(help=f"The engines' kind: {one_of(BACKENDS)}")] = DEFAULT_BACKEND,
    tokenizer: Annotated[Path | None, typer.Option(help="tokenizer.json for exact prompt lengths")] = None,
    api_keys_file: Annotated[Path | None, typer.Option(
        help="Tenants' keys: a file ('KEY' or 'TENANT KEY' per line) or a mounted Secret's directory "
             "(data key = tenant); also $AUTELLIX_API_KEYS")] = None,
    allow_anonymous: Annotated[bool, typer.Option(
        help="Serve beyond loopback without tenant keys (refused otherwise)")] = False,
    admin_port: Annotated[int | None, typer.Option(
        min=0, help="The admin listener's port (engines, drain, calls, sessions for tenants); none without")] = None,
    admin_host: AdminHost = "127.0.0.1",
    admin_keys_file: AdminKeysFile = None,
    tenant_max_concurrent: TenantMaxConcurrent = None,
    tenant_max_queued: TenantMaxQueued = 0,
    tenant_queue_timeout: TenantQueueTimeout = 30.0,
    tenant_rpm: TenantRpm = None,
    tenant_tpm: Annotated[float | None, typer.Option(
        min=1, help="Tokens (prompt + output) a minute, per tenant")] = None,
    tenant_max_sessions: Annotated[int | None, typer.Option(min=1, help="Live sessions per tenant")] = None,
    tenant_concurrency: Annotated[list[str] | None, typer.Option(
        help="TENANT=N: that tenant's own concurrent-call limit (repeatable)")] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest accepted request body")] = 4 * 1024 * 1024,
    max_n: Annotated[int, typer.Option(min=1, help="Largest 'n' a call may ask for")] = 16,
    max_tokens: Annotated[int, typer.Option(min=1, help="Largest 'max_tokens' a call may ask for")] = 32_768,
    stream_header_timeout: Annotated[float, typer.Option(
        min=0.1, help="Seconds an engine has to start answering a streamed call before it moves to another")] = 30.0,
    connect_timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to connect to an engine")] = 5.0,
    whole_timeout: Annotated[float, typer.Option(
        min=0.1, help="Seconds an engine has to answer a whole (non-streamed) call")] = 600.0,
    idle_read_timeout: Annotated[float, typer.Option(
        min=0.1, help="Seconds a stream may stay silent between two chunks")] = 120.0,
    attempt_timeout: Annotated[float, typer.Option(min=0.1, help="Seconds one attempt at an engine may take")] = (
        1800.0),
    write_timeout: Annotated[float, typer.Option(
        min=0.1, help="Seconds a client may read nothing of its stream before its call is given up")] = 60.0,
    store: Annotated[str | None, typer.Option(
        envvar="AUTELLIX_STORE", help="Shared program store of gateway replicas, redis://HOST:PORT/DB "
                                      "(programs and engine drains); default: in memory")] = None,
    shutdown_grace: Annotated[float, typer.Option(
        min=0, help="SIGTERM: seconds for calls and streams in flight to finish (not ready meanwhile)")] = 30.0,
    program_admission: Annotated[bool, typer.Option(
        help="New programs wait while the engines are saturated (docs/gateway.md, 'Program admission')")] = True,
    engine_slots: Annotated[int, typer.Option(
        min=1, help="Running slots of each engine (vLLM's --max-num-seqs): program admission's queue bound")] = 256,
    replica_name: Annotated[str | None, typer.Option(
        envvar="AUTELLIX_REPLICA_NAME", help="This replica's label in /metrics (default: HOSTNAME:PORT)")] = None,
) -> None:
    """Run the OpenAI-compatible gateway in front of running engines."""
    from autellix.control.keys import KeysError
    from autellix.control.limits import TenantLimits
    from autellix.gateway.config import GatewayConfig
    from autellix.gateway.serve import ExposedError, serve

    if backend not in BACKENDS:
        raise fail(f"unknown engine backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    engines, source = engine_source(engine, discovery, engine_selector, namespace, engine_port_name)
    limits = TenantLimits(max_concurrent=tenant_max_concurrent, max_queued=tenant_max_queued,
                          queue_timeout_s=tenant_queue_timeout, requests_per_minute=tenant_rpm,
                          tokens_per_minute=tenant_tpm, max_sessions=tenant_max_sessions)
    per_tenant = {}
    for item in tenant_concurrency or []:
        name, _, count = item.partition("=")
        if not name or not count.isdigit() or int(count) < 1:
            raise fail(f"--tenant-concurrency: expected TENANT=N (N >= 1), got {item!r}")
        per_tenant[name] = dataclasses.replace(limits, max_concurrent=int(count))
    config = GatewayConfig(engines=engines, scheduler=overrides.config(),
                           tokenizer=tokenizer, api_keys_file=api_keys_file, max_body_bytes=max_body_bytes,
                           discovery=source, stream_header_timeout=stream_header_timeout, backend=backend,
                           allow_anonymous=allow_anonymous, admin_port=admin_port, admin_host=admin_host,
                           admin_keys_file=admin_keys_file, tenant_limits=limits, per_tenant_limits=per_tenant,
                           max_n=max_n,
                           max_tokens=max_tokens, connect_timeout=connect_timeout, whole_timeout=whole_timeout,
                           idle_read_timeout=idle_read_timeout, attempt_timeout=attempt_timeout,
                           write_timeout=write_timeout, program_admission=program_admission,
                           engine_slots=engine_slots)
    try:
        serve(config, host, port, store_url=store, shutdown_grace=shutdown_grace, replica=replica_name)
    except (ExposedError, KeysError, ValueError) as exc:
        raise fail(str(exc)) from None

