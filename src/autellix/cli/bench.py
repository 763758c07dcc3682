"""``autellix bench``: agent-program benchmarks against any OpenAI endpoint; ``sweep``:
every system on a fresh local stack; ``cluster``: emulated engines behind the gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from autellix.child_processes import exit_on_sigterm
from autellix.cli.common import OutputFormat, comma_list, fail, numbers, one_of, progress, write_json
from autellix.cli.options import NO_OVERRIDES, SchedulerOverrides, scheduler_options
from autellix.core.config import BALANCERS
from autellix.workloads import WORKLOADS
from autellix.workloads.systems import REAL_SYSTEMS

app = typer.Typer(help="Agent-program benchmarks against any OpenAI endpoint.")


@app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    target: Annotated[str, typer.Option(help="Gateway or bare vLLM base URL")] = "http://127.0.0.1:8000",
    workload: Annotated[str, typer.Option(help=one_of(WORKLOADS))] = "bfcl",
    rate: Annotated[float, typer.Option(help="Program arrivals per second (Poisson)")] = 0.5,
    programs: Annotated[int, typer.Option(min=1, help="Programs to run")] = 50,
    seed: Annotated[int, typer.Option(help="Seed of programs and arrivals")] = 1,
    calibration: Annotated[str, typer.Option(help="paper or raw")] = "paper",
    model: Annotated[str, typer.Option(help="Model name to request")] = "tiny-llama",
    engine_metrics: Annotated[list[str] | None, typer.Option(
        "--engine-metrics", help="Engine URL to read prefix-cache counters from (repeatable)")] = None,
    ascii_replies: Annotated[bool, typer.Option(
        help="Limit replies to printable ASCII token ids (vLLM's allowed_token_ids), as `bench sweep` does for "
             "the byte-level tiny model, so each re-sent history holds exactly the tokens generated; leave off "
             "for any other model, whose token ids differ")] = False,
    output: Annotated[OutputFormat, typer.Option("--format", help="table or json")] = OutputFormat.table,
) -> None:
    """Run agent programs with Poisson arrivals and report program-level metrics."""
    if ctx.invoked_subcommand is not None:
        return
    import asyncio
    import json

    from rich.progress import Progress

    from autellix.engine.tiny_model import REPLY_TOKEN_IDS
    from autellix.loadgen.runner import run_programs
    from autellix.workloads import make_programs
    from autellix.workloads.run_metrics import summarize

    try:
        batch = make_programs(workload, programs, seed=seed, calibration=calibration)
    except (ValueError, FileNotFoundError) as exc:
        raise fail(str(exc)) from None
    with Progress(transient=True, disable=output is OutputFormat.json) as bar:
        task = bar.add_task(f"{workload} @ {rate}/s", total=programs)
        result = asyncio.run(run_programs(target, batch, rate=rate, seed=seed, model=model,
                                          engines=list(engine_metrics or []),
                                          reply_tokens=REPLY_TOKEN_IDS if ascii_replies else None,
                                          on_done=lambda _: bar.advance(task)))
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


@app.command("sweep")
@scheduler_options("beta", "backlog_factor", "quanta", "boundaries", "max_preemptions",
                   defaults="the workload's, loadgen/stack_sweep.py")
def bench_sweep(
    workload: Annotated[str, typer.Option(help=one_of(WORKLOADS))] = "bfcl",
    rates: Annotated[str | None, typer.Option(
        help="Comma-separated arrival rates (programs/s); default: the workload's (loadgen/stack_sweep.py)")] = None,
    programs: Annotated[int | None, typer.Option(min=1, help="Programs per rate (default: the workload's)")] = None,
    seed: Annotated[int, typer.Option(help="Seed of programs and arrivals")] = 1,
    systems: Annotated[str, typer.Option(
        help=f"Comma-separated: {', '.join(REAL_SYSTEMS)}")] = (
        "vllm,vllm-opt,client-plas,llmd-fairness,plas,autellix"),
    calibration: Annotated[str, typer.Option(help="paper or raw")] = "paper",
    stream: Annotated[bool, typer.Option(help="Stream calls (default: whole calls, so the client and the "
                                              "gateway spend CPU per call, not per token, beside the engine)")] = False,
    out: Annotated[Path, typer.Option(help="Folder for the JSON report and PNG plots")] = Path("bench-results"),
    overrides: SchedulerOverrides = NO_OVERRIDES,
    isolate_cores: Annotated[bool, typer.Option(
        help="Keep the model worker's cores to it: the engine's servers, the gateway and the client run on the "
             "others (docs/benchmarks.md)")] = False,
    rounds: Annotated[int, typer.Option(
        min=1, help="Run every system this many times, in turn, and report each system against client-plas "
                    "(else the first system) within each round: ratios with their spread")] = 1,
    keep_stacks: Annotated[bool, typer.Option(
        help="Start every system's stack once and keep them all up: each round runs the systems in turn, the "
             "order rotated every round, each run on an emptied prefix cache (runs a minute apart, not an "
             "engine start apart)")] = False,
    draw_per_round: Annotated[bool, typer.Option(
        help="Round n runs the programs of seed + n (every system the same ones within a round): the rounds "
             "sample the workload, not one draw of it")] = False,
    trace_steps: Annotated[bool, typer.Option(
        help="Record every engine step (steps-<system>.jsonl in the log folder) and add each run's step totals "
             "to the report, to set beside the simulator's (experiments/engine_steps_vs_profile.py)")] = False,
) -> None:
    """Every system on a fresh local stack over a range of rates: JSON, plots, throughput ratios."""
    from autellix.core import SchedulerConfig
    from autellix.loadgen.stack_sweep import ENGINE_SETTINGS, run_sweep, write_report

    try:
        rate_list = [float(r) for r in rates.split(",") if r.strip()] if rates else None
    except ValueError:
        raise fail(f"--rates: expected comma-separated numbers, got {rates!r}") from None
    scheduler = None
    if overrides.given:  # the workload's settings (not $AUTELLIX_*), with these
        base = ENGINE_SETTINGS[workload].scheduler if workload in ENGINE_SETTINGS else None
        scheduler = overrides.config(base or SchedulerConfig())
    try:
        with exit_on_sigterm():  # a stopped sweep stops its engines too
            report = run_sweep(workload, rate_list, programs=programs, seed=seed, calibration=calibration,
                               stream=stream, scheduler=scheduler, isolate_cores=isolate_cores,
                               systems=comma_list(systems), rounds=rounds, keep_stacks=keep_stacks,
                               trace_steps=trace_steps, draw_per_round=draw_per_round, progress=progress)
    except ValueError as exc:
        raise fail(str(exc)) from None
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
                   f"{row.get('p99_vs_vllm_opt', float('nan')):.2f}x vllm-opt's" + "".join(
                       f"; mean {row[k]:.2f}x {k[8:].replace('_', '-')}'s" for k in row if k.startswith("mean_vs_")))
    if "paired" in report:
        echo_paired(report["paired"])


@app.command("flow-control-proxy")
def bench_flow_control_proxy(
    engine: Annotated[str, typer.Option(help="Base URL of the stock vLLM engine behind it")],
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on (127.0.0.1)")] = 8300,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="The engine's running slots")] = 8,
) -> None:
    """The llmd-fairness system's gateway: llm-d's program-aware flow control in front of one engine
    (autellix/loadgen/flow_control_proxy.py); programs name themselves in x-llm-d-inference-fairness-id."""
    from autellix.loadgen.flow_control_proxy import serve

    serve(engine, port, slots=max_num_seqs)


def echo_paired(paired: dict[str, Any]) -> None:
    """Each system against the reference within rounds: geometric mean and range."""
    reference = paired["reference"]
    for rate, systems in paired["by_rate"].items():
        for name, entry in systems.items():
            line = f"at {rate}/s, {paired['rounds']} rounds: {name} mean {_ms(entry['mean'])} ms/token"
            if "mean_vs_reference" in entry:
                line += (f"; against {reference} in the same round: mean {_ratio(entry['mean_vs_reference'])}, "
                         f"P99 {_ratio(entry['p99_vs_reference'])}")
            typer.echo(line)


def _ms(spread: dict[str, Any]) -> str:
    return f"{spread['geomean'] * 1e3:.2f} ({spread['min'] * 1e3:.2f}-{spread['max'] * 1e3:.2f})"


def _ratio(spread: dict[str, Any]) -> str:
    return f"{spread['geomean']:.2f}x ({spread['min']:.2f}-{spread['max']:.2f})"


cluster_app = typer.Typer(help="Many emulated engines behind the real gateway (autellix emulate).")
app.add_typer(cluster_app, name="cluster")


@cluster_app.callback()
def bench_cluster(
    ctx: typer.Context,
    profile: Annotated[str, typer.Option(help="Engine profile of the emulated engines")] = "a100-llama3.1-8b",
    time_scale: Annotated[float, typer.Option(min=0.01, help="Wall seconds per modelled second")] = 0.25,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Running calls per engine")] = 4,
    arrival_seconds: Annotated[float, typer.Option(min=1, help="Seconds of arrivals per rate")] = 20.0,
    out: Annotated[Path, typer.Option(help="Folder for the JSON report")] = Path("bench-results"),
) -> None:
    """Settings shared by the studies (autellix/loadgen/cluster.py, docs/emulator.md)."""
    from autellix.loadgen.cluster import ClusterSettings

    ctx.obj = (ClusterSettings(profile=profile, time_scale=time_scale, max_num_seqs=max_num_seqs,
                               arrival_seconds=arrival_seconds), out)


@cluster_app.command("balancers")
def bench_cluster_balancers(
    ctx: typer.Context,
    workload: Annotated[str, typer.Option(help="sharegpt, bfcl, lats or mixed")] = "sharegpt",
    engines: Annotated[int, typer.Option(min=1, max=64, help="Emulated engines")] = 4,
    rates: Annotated[str | None, typer.Option(help="Comma-separated rates (default: engines x per-engine rates)")] = (
        None),
    balancers: Annotated[str, typer.Option(help=f"Comma-separated: {','.join(BALANCERS)}")] = (
        "round_robin,least_used,autellix"),
    seed: Annotated[int, typer.Option(help="Seed of programs and arrivals")] = 1,
) -> None:
    """Figure 14: the gateway's balancers side by side on emulated engines."""
    from autellix.loadgen.cluster import run_balancers

    settings, out = ctx.obj
    try:
        with exit_on_sigterm():
            report = run_balancers(workload, engines=engines, rates=numbers(rates), balancers=comma_list(balancers),
                                   settings=settings, seed=seed, progress=progress)
    except (ValueError, KeyError) as exc:
        raise fail(str(exc)) from None
    typer.echo(f"wrote {write_json(report, out, f'cluster-{workload}-{engines}-balancers.json')}")
    for key, ratio in report["sustained"]["ratios"].items():
        typer.echo(f"throughput at equal latency {key}: {ratio:.2f}x")


@cluster_app.command("scaling")
def bench_cluster_scaling(
    ctx: typer.Context,
    workload: Annotated[str, typer.Option(help="sharegpt, bfcl, lats or mixed")] = "sharegpt",
    engines: Annotated[str, typer.Option(help="Comma-separated engine counts")] = "1,2,4,8",
    balancer: Annotated[str, typer.Option(help=one_of(BALANCERS))] = "autellix",
    rates_per_engine: Annotated[str | None, typer.Option(
        help="Comma-separated rates per engine (default: the workload's, autellix/loadgen/cluster.py)")] = None,
    seed: Annotated[int, typer.Option(help="Seed of programs and arrivals")] = 1,
) -> None:
    """Figure 15: sustainable rate against the engine count."""
    from autellix.loadgen.cluster import run_scaling

    settings, out = ctx.obj
    try:
        with exit_on_sigterm():
            report = run_scaling(workload, engine_counts=numbers(engines, int) or [1], balancer=balancer,
                                 rates_per_engine=numbers(rates_per_engine), settings=settings, seed=seed,
                                 progress=progress)
    except (ValueError, KeyError) as exc:
        raise fail(str(exc)) from None
    typer.echo(f"wrote {write_json(report, out, f'cluster-{workload}-scaling.json')}")
    for n, rate in report["sustained"].items():
        typer.echo(f"{n} engine(s): sustains {rate:.2f} programs/s ({report['speedup'][n]:.2f}x one engine's)")
