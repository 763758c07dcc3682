"""The ``autellix`` command: the single entry point. Nothing imports this module.

Each command is a thin shell over an adapter; heavy imports stay inside the
command so ``autellix --help`` is instant.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False)


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


def _scheduler_config(policy: str | None, beta: float | None, balancer: str | None):
    from autellix.core import ConfigError, SchedulerConfig

    try:
        return SchedulerConfig.from_env().with_overrides(policy=policy, beta=beta, balancer=balancer)
    except ConfigError as exc:
        raise _fail(str(exc)) from None


@app.command()
def gateway(
    engine: Annotated[list[str], typer.Option("--engine", help="Engine base URL (repeatable)")],
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8000,
    policy: Annotated[str | None, typer.Option(help="atlas, plas, mlfq or fcfs (default: $AUTELLIX_POLICY)")] = None,
    beta: Annotated[float | None, typer.Option(help="Anti-starvation ratio")] = None,
    balancer: Annotated[str | None, typer.Option(help="autellix, least_used or round_robin")] = None,
    tokenizer: Annotated[Path | None, typer.Option(help="tokenizer.json for exact prompt lengths")] = None,
    api_keys_file: Annotated[Path | None, typer.Option(help="File of API keys, one per line")] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest accepted request body")] = 4 * 1024 * 1024,
) -> None:
    """Run the OpenAI-compatible gateway in front of running engines."""
    from autellix.gateway.app import GatewayConfig
    from autellix.gateway.serve import serve

    config = GatewayConfig(engines=engine, scheduler=_scheduler_config(policy, beta, balancer),
                           tokenizer=tokenizer, api_keys_file=api_keys_file, max_body_bytes=max_body_bytes)
    serve(config, host, port)


@app.command()
def up(
    port: Annotated[int, typer.Option(help="Gateway port")] = 8000,
    engines: Annotated[int, typer.Option(min=1, help="Local vLLM engines to start")] = 1,
    policy: Annotated[str | None, typer.Option(help="atlas, plas, mlfq or fcfs")] = None,
    scheduler: Annotated[str, typer.Option(help="Engine scheduler: autellix, vllm-priority or fcfs")] = "autellix",
    engine_arg: Annotated[list[str] | None, typer.Option("--engine-arg", help="Extra vLLM argument (repeatable)")] = (
        None
    ),
    engine_port: Annotated[int, typer.Option(help="First engine port")] = 8100,
) -> None:
    """The embedded default: local vLLM engines (tiny model) plus the gateway."""
    from autellix.engine.launch import SCHEDULERS
    from autellix.launcher import run_local

    if scheduler not in SCHEDULERS:
        raise _fail(f"unknown engine scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
    run_local(port=port, engines=engines, scheduler_config=_scheduler_config(policy, None, None),
              engine_scheduler=scheduler, engine_args=list(engine_arg or []), first_engine_port=engine_port)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def engine(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="Model path or name (default: the local tiny model)")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8100,
    scheduler: Annotated[str, typer.Option(help="autellix, vllm-priority or fcfs")] = "autellix",
    policy: Annotated[str | None, typer.Option(help="atlas, plas, mlfq or fcfs (default: $AUTELLIX_POLICY)")] = None,
    beta: Annotated[float | None, typer.Option(help="Anti-starvation ratio")] = None,
    quanta: Annotated[str | None, typer.Option(help="Steps per queue, e.g. 64,128,256,512,inf")] = None,
    boundaries: Annotated[str | None, typer.Option(help="Queue boundaries in seconds of service")] = None,
    multi_step: Annotated[int | None, typer.Option(min=1, help="Re-plan the queues every N steps")] = None,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Tiny model: running calls per batch")] = 64,
) -> None:
    """Run one vLLM OpenAI server with Autellix's scheduler. Arguments after the
    options (or after --) go to vLLM unchanged."""
    import os

    from autellix.core import ConfigError, SchedulerConfig
    from autellix.engine.launch import SCHEDULERS, engine_env, server_command, tiny_model_args
    from autellix.engine.tiny_model import build_tiny_model, default_model_dir

    if scheduler not in SCHEDULERS:
        raise _fail(f"unknown engine scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
    try:
        config = SchedulerConfig.from_env().with_overrides(policy=policy, beta=beta, quanta=quanta,
                                                           boundaries=boundaries, multi_step=multi_step)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    extra = list(ctx.args)
    if model is None:
        model = str(build_tiny_model(default_model_dir()))
        extra = tiny_model_args(max_num_seqs=max_num_seqs) + extra
    cmd = server_command(model, port, host=host, scheduler=scheduler, extra_args=extra)
    typer.echo(" ".join(cmd), err=True)
    os.execvpe(cmd[0], cmd, engine_env(port, config))  # the engine replaces this process: signals reach it


bench_app = typer.Typer(help="Agent-program benchmarks against any OpenAI endpoint.")
app.add_typer(bench_app, name="bench")


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    target: Annotated[str, typer.Option(help="Gateway or bare vLLM base URL")] = "http://127.0.0.1:8000",
    workload: Annotated[str, typer.Option(help="sharegpt, bfcl, lats or mixed")] = "bfcl",
    rate: Annotated[float, typer.Option(help="Program arrivals per second (Poisson)")] = 0.5,
    programs: Annotated[int, typer.Option(min=1, help="Programs to run")] = 50,
    seed: Annotated[int, typer.Option(help="Seed of programs and arrivals")] = 1,
    calibration: Annotated[str, typer.Option(help="paper or raw")] = "paper",
    model: Annotated[str, typer.Option(help="Model name to request")] = "tiny-llama",
    engine_metrics: Annotated[list[str] | None, typer.Option(
        "--engine-metrics", help="Engine URL to read prefix-cache counters from (repeatable)")] = None,
    output: Annotated[OutputFormat, typer.Option("--format", help="table or json")] = OutputFormat.table,
) -> None:
    """Run agent programs with Poisson arrivals and report program-level metrics."""
    if ctx.invoked_subcommand is not None:
        return
    import asyncio
    import json

    from rich.progress import Progress

    from autellix.bench import make_programs
    from autellix.bench.runner import run_programs, summarize

    try:
        batch = make_programs(workload, programs, seed=seed, calibration=calibration)
    except (ValueError, FileNotFoundError) as exc:
        raise _fail(str(exc)) from None
    with Progress(transient=True, disable=output is OutputFormat.json) as progress:
        task = progress.add_task(f"{workload} @ {rate}/s", total=programs)
        result = asyncio.run(run_programs(target, batch, rate=rate, seed=seed, model=model,
                                          engines=list(engine_metrics or []),
                                          on_done=lambda _: progress.advance(task)))
    summary = summarize(result)
    if output is OutputFormat.json:
        typer.echo(json.dumps(summary, indent=2, default=str))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{workload}: {programs} programs at {rate}/s against {target}")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in summary.items():
            table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
        Console().print(table)


@bench_app.command("sweep")
def bench_sweep(
    workload: Annotated[str, typer.Option(help="sharegpt, bfcl, lats or mixed")] = "bfcl",
    rates: Annotated[str | None, typer.Option(
        help="Comma-separated arrival rates (programs/s); default: the workload's (bench/sweep.py)")] = None,
    programs: Annotated[int | None, typer.Option(min=1, help="Programs per rate (default: the workload's)")] = None,
    seed: Annotated[int, typer.Option(help="Seed of programs and arrivals")] = 1,
    systems: Annotated[str, typer.Option(help="Comma-separated: vllm,vllm-opt,mlfq,autellix")] = (
        "vllm,vllm-opt,mlfq,autellix"),
    calibration: Annotated[str, typer.Option(help="paper or raw")] = "paper",
    out: Annotated[Path, typer.Option(help="Folder for the JSON report and PNG plots")] = Path("bench-results"),
) -> None:
    """Every system on a fresh local stack over a range of rates: JSON, plots, throughput ratios."""
    from autellix.bench.sweep import run_sweep, write_report

    try:
        rate_list = [float(r) for r in rates.split(",") if r.strip()] if rates else None
    except ValueError:
        raise _fail(f"--rates: expected comma-separated numbers, got {rates!r}") from None
    try:
        report = run_sweep(workload, rate_list, programs=programs, seed=seed, calibration=calibration,
                           systems=[s.strip() for s in systems.split(",") if s.strip()],
                           progress=lambda line: typer.echo(line, err=True))
    except ValueError as exc:
        raise _fail(str(exc)) from None
    for path in write_report(report, out):
        typer.echo(f"wrote {path}")
    sustained = report["sustained"]
    typer.echo(f"latency bound {sustained['latency_bound']:.4f} s/token; sustained rates "
               + ", ".join(f"{k} {v:.2f}/s" for k, v in sustained["rates"].items()))
    for key, ratio in sustained["ratios"].items():
        typer.echo(f"throughput {key}: {ratio:.2f}x")
    for row in report["under_load"]:
        typer.echo(f"at {row['rate']}/s (vllm at {row['vllm_load']:.1f}x its unloaded latency): autellix cuts mean "
                   f"token latency {row['latency_cut_vs_vllm']:.2f}x; its P99 is "
                   f"{row.get('p99_vs_vllm_opt', float('nan')):.2f}x vllm-opt's")
