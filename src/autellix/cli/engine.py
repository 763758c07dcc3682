"""``autellix engine``: one vLLM OpenAI server with Autellix's scheduler (and ``drain-wait``)."""

from __future__ import annotations

from typing import Annotated

import typer

from autellix.cli.common import fail, one_of
from autellix.cli.options import NO_OVERRIDES, SchedulerOverrides, scheduler_options
from autellix.engine.launch import SCHEDULERS

#: Where ``autellix engine`` publishes KV cache events.
KV_EVENTS = ("auto", "ipc", "tcp", "off")
#: vLLM's own arguments pass through (``autellix.cli`` registers the command with these).
CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}


@scheduler_options("policy", "beta", "backlog_factor", "quanta", "boundaries", "multi_step", "max_preemptions")
def engine(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="Model path or name (default: the local tiny model)")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8100,
    scheduler: Annotated[str, typer.Option(help=one_of(SCHEDULERS))] = "autellix",
    overrides: SchedulerOverrides = NO_OVERRIDES,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Tiny model: running calls per batch")] = 64,
    kv_events: Annotated[str, typer.Option(help=f"Publish KV cache events (Autellix's scheduler): {one_of(KV_EVENTS)}; "
                                           "auto: IPC sockets on a loopback host, TCP port 5557 (and 5558 for "
                                           "replays) otherwise")] = "auto",
) -> None:
    """Run one vLLM OpenAI server with Autellix's scheduler. Arguments after the
    options (or after --) go to vLLM unchanged. `autellix engine drain-wait
    [--url URL] [--interval S] [--timeout S]`: wait until the engine holds no
    call (the engine pod's preStop hook, autellix.backends.drain)."""
    if ctx.args[:1] == ["drain-wait"]:
        from autellix.backends.drain import main as drain_wait

        raise typer.Exit(drain_wait(ctx.args[1:], default_url=f"http://{host}:{port}"))
    import os

    from autellix.engine.kv_events import kv_events_ipc_for, kv_events_tcp
    from autellix.engine.launch import engine_env, server_command, tiny_model_args
    from autellix.engine.tiny_model import build_tiny_model, default_model_dir

    if scheduler not in SCHEDULERS:
        raise fail(f"unknown engine scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
    if kv_events not in KV_EVENTS:
        raise fail(f"unknown --kv-events {kv_events!r}; expected one of {', '.join(KV_EVENTS)}")
    if kv_events == "auto":
        kv_events = "ipc" if host in ("127.0.0.1", "localhost", "::1") else "tcp"
    endpoints = None
    if scheduler == "autellix" and kv_events != "off":
        endpoints = kv_events_ipc_for(port) if kv_events == "ipc" else kv_events_tcp()
    config = overrides.config()
    extra = list(ctx.args)
    if model is None:
        model = str(build_tiny_model(default_model_dir()))
        extra = tiny_model_args(max_num_seqs=max_num_seqs) + extra
    cmd = server_command(model, port, host=host, scheduler=scheduler, extra_args=extra, kv_events=endpoints)
    typer.echo(" ".join(cmd), err=True)
    os.execvpe(cmd[0], cmd, engine_env(port, config))  # the engine replaces this process: signals reach it
