"""The ``autellix`` command: the single entry point. Nothing imports this module.

Each command is a thin shell over an adapter; heavy imports stay inside the
command so ``autellix --help`` is instant.
"""

from __future__ import annotations

import enum
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__.splitlines()[0])


class OutputFormat(enum.StrEnum):
    table = "table"
    json = "json"


@app.callback()
def main() -> None:
    """Autellix: program-aware LLM serving."""


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


@app.command()
def sim(
    workload: Annotated[str, typer.Option(help="figure2, figure9 or random")] = "figure2",
    batch_size: Annotated[int, typer.Option(min=1, help="Calls per batch step")] = 2,
    policies: Annotated[str, typer.Option(help="Comma-separated: fcfs,mlfq,plas,atlas")] = "fcfs,mlfq,plas,atlas",
    seed: Annotated[int, typer.Option(help="Seed of the random workload")] = 0,
    programs: Annotated[int, typer.Option(min=1, help="Programs in the random workload")] = 20,
    rate: Annotated[float | None, typer.Option(help="Random workload: programs per step (default: all at 0)")] = None,
    boundaries: Annotated[str | None, typer.Option(help="Queue boundaries in steps, e.g. 1,2,4,8")] = None,
    quanta: Annotated[str | None, typer.Option(help="Quanta in steps, one per queue, e.g. 1,2,4,8,inf")] = None,
    beta: Annotated[float | None, typer.Option(help="Anti-starvation ratio (inf disables)")] = None,
    output: Annotated[OutputFormat, typer.Option("--format", help="table or json")] = OutputFormat.table,
) -> None:
    """Run the policy core on the unit-cost step simulator and compare policies."""
    from autellix.core import ConfigError, policy_by_name
    from autellix.sim import UNIT_STEP_CONFIG
    from autellix.sim.report import print_table, to_json
    from autellix.sim.unit import simulate
    from autellix.sim.workloads import WORKLOADS, random_programs

    if workload not in WORKLOADS:
        raise _fail(f"unknown workload {workload!r}; expected one of {', '.join(WORKLOADS)}")
    try:
        config = UNIT_STEP_CONFIG.with_overrides(boundaries=boundaries, quanta=quanta, beta=beta)
        chosen = [policy_by_name(name.strip()) for name in policies.split(",") if name.strip()]
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    specs = random_programs(seed, programs, rate=rate) if workload == "random" else WORKLOADS[workload](seed)
    results = {p.name: simulate(specs, p, config, batch_size=batch_size).summary() for p in chosen}
    if output is OutputFormat.json:
        typer.echo(to_json(results))
    else:
        print_table(results, f"{workload}, batch size {batch_size}, quanta {list(config.quanta)}")
