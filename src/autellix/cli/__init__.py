"""The ``autellix`` command: the single entry point. Nothing imports this package
but ``autellix.__main__`` (and the ``autellix`` script).

One module per command group (``gateway``, ``epp``, ``up``, ``engine``, ``kube`` for
``operator`` and ``autellix kube``, ``profile``, ``emulate``, ``sim``, ``bench``); the scheduler
options they share (``--policy``, ``--beta``, ...) are generated once from
``autellix.core.SchedulerConfig`` (``options``). Each command is a thin shell
over an adapter; heavy imports stay inside the command so ``autellix --help``
is instant.
"""

from __future__ import annotations

import typer

from autellix.cli import bench, emulate, engine, epp, gateway, kube, profile, sim, up

app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.callback()
def main() -> None:
    """Autellix: program-aware LLM serving."""


app.command()(gateway.gateway)
app.command()(epp.epp)
app.command()(up.up)
app.command(context_settings=engine.CONTEXT_SETTINGS)(engine.engine)
app.command("operator")(kube.operator)
app.add_typer(kube.app, name="kube")
app.command()(profile.profile)
app.command()(emulate.emulate)
app.add_typer(sim.app, name="sim")
app.add_typer(bench.app, name="bench")

__all__ = ["app"]
