"""``autellix emulate``: the simulator's engine model behind vLLM's HTTP API, in real time."""

from __future__ import annotations

from typing import Annotated

import typer

from autellix.cli.common import fail, one_of
from autellix.cli.options import NO_OVERRIDES, SchedulerOverrides, scheduler_options
from autellix.sim.engine_model import SCHEDULERS


@scheduler_options("policy")
def emulate(
    port: Annotated[list[int] | None, typer.Option(
        "--port", help="Engine port (repeatable, one engine each); one port and --engines N: N from there")] = None,
    engines: Annotated[int, typer.Option(min=1, max=64, help="Emulated engines, one port each")] = 1,
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    profile: Annotated[str, typer.Option(help="Engine profile: a name in autellix/sim/profiles or a JSON path")] = (
        "cpu-tiny"),
    scheduler: Annotated[str, typer.Option(help=one_of(SCHEDULERS))] = "autellix",
    overrides: SchedulerOverrides = NO_OVERRIDES,
    time_scale: Annotated[float, typer.Option(min=0.001, help="Wall seconds per model second (0.1: 10x faster)")] = (
        1.0),
    model: Annotated[str, typer.Option(help="Served model name")] = "emulated",
    prefix_caching: Annotated[bool, typer.Option(help="Model prefix caching")] = True,
    kv_events: Annotated[bool, typer.Option(
        help="Publish each engine's KV cache events as vLLM does, on IPC sockets named for its port (Autellix's "
             "scheduler, prefix caching; needs pyzmq and msgspec)")] = True,
    max_num_seqs: Annotated[int | None, typer.Option(min=1, help="Override the profile's running-call limit")] = None,
    coalesce_ms: Annotated[float, typer.Option(min=0, help="Run decode-only steps in stretches of this many "
                                                          "modelled ms (0: step by step)")] = 0.0,
) -> None:
    """Emulated vLLM engines: the simulator's engine model behind vLLM's HTTP API, in real time."""
    import asyncio
    import contextlib

    from autellix.core import SchedulerConfig
    from autellix.engine.kv_events import kv_events_ipc_for
    from autellix.sim.emulator import EmulatedEngine, serve
    from autellix.sim.engine_profile import EngineProfile

    if scheduler not in SCHEDULERS:
        raise fail(f"unknown scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
    try:
        config = overrides.apply(SchedulerConfig.from_env())
        engine_profile = EngineProfile.load(profile)
        if max_num_seqs is not None:
            engine_profile = engine_profile.with_overrides(max_num_seqs=max_num_seqs)
    except (OSError, ValueError) as exc:  # ConfigError is a ValueError
        raise fail(str(exc)) from None

    ports = list(port or [8100])
    if len(ports) == 1:
        ports = list(range(ports[0], ports[0] + engines))
    elif engines not in (1, len(ports)):
        raise fail(f"--engines {engines} but {len(ports)} ports given")

    publish = kv_events and prefix_caching and scheduler == "autellix" and _can_publish()

    async def main() -> None:
        pool = [EmulatedEngine(engine_profile, model_name=model, scheduler=scheduler, config=config,
                               prefix_caching=prefix_caching, time_scale=time_scale, coalesce=coalesce_ms / 1e3,
                               kv_events=kv_events_ipc_for(p) if publish else None)
                for p in ports]
        typer.echo(f"{len(ports)} emulated engine(s) ({engine_profile.name}, {scheduler}, time x{time_scale}) on "
                   + ", ".join(f"http://{host}:{p}" for p in ports), err=True)
        await serve(pool, host, ports)

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how it stops
        asyncio.run(main())


def _can_publish() -> bool:
    try:
        import msgspec  # noqa: F401
        import zmq  # noqa: F401
    except ImportError:
        typer.echo("no KV cache events: pyzmq and msgspec are not installed (the kv-index extra)", err=True)
        return False
    return True
