"""``autellix gateway``: the OpenAI-compatible gateway in front of running engines."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from autellix.backends import BACKENDS, DEFAULT_BACKEND
from autellix.cli import options
from autellix.cli.common import fail, one_of


@options.gateway_options(help_text={
    "api_keys_file": "Tenants' keys: a file ('KEY' or 'TENANT KEY' per line) or a mounted Secret's directory "
                     "(data key = tenant); also $AUTELLIX_API_KEYS"})
def gateway(
    engines: options.EngineOptions = options.NO_ENGINES,
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8000,
    overrides: options.SchedulerOverrides = options.NO_OVERRIDES,
    backend: Annotated[str, typer.Option(help=f"The engines' kind: {one_of(BACKENDS)}")] = DEFAULT_BACKEND,
    tokenizer: options.TokenizerOption = None,
    kv_index: options.KvIndexOption = True,
    access: options.AccessOptions = options.NO_ACCESS,
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
                                      "(programs, stored responses and engine drains); default: in memory")] = None,
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
    from autellix.gateway.config import GatewayConfig
    from autellix.gateway.serve import ExposedError, serve

    if backend not in BACKENDS:
        raise fail(f"unknown engine backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    urls, source = engines.source()
    limits = access.limits(tokens_per_minute=tenant_tpm, max_sessions=tenant_max_sessions)
    per_tenant = {}
    for item in tenant_concurrency or []:
        name, _, count = item.partition("=")
        if not name or not count.isdigit() or int(count) < 1:
            raise fail(f"--tenant-concurrency: expected TENANT=N (N >= 1), got {item!r}")
        per_tenant[name] = dataclasses.replace(limits, max_concurrent=int(count))
    config = GatewayConfig(engines=urls, scheduler=overrides.config(), tokenizer=tokenizer, kv_index=kv_index,
                           max_body_bytes=max_body_bytes, discovery=source,
                           stream_header_timeout=stream_header_timeout, backend=backend, **access.listeners(),
                           tenant_limits=limits, per_tenant_limits=per_tenant, max_n=max_n, max_tokens=max_tokens,
                           connect_timeout=connect_timeout, whole_timeout=whole_timeout,
                           idle_read_timeout=idle_read_timeout, attempt_timeout=attempt_timeout,
                           write_timeout=write_timeout, program_admission=program_admission,
                           engine_slots=engine_slots, store_url=store)
    try:
        serve(config, host, port, shutdown_grace=shutdown_grace, replica=replica_name)
    except (ExposedError, KeysError, ValueError) as exc:
        raise fail(str(exc)) from None

