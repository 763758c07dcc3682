"""``autellix sim``: the unit-step simulator, agent programs on modelled engines,
the paper's figures in simulation (``sweep``) and a benchmark replayed (``fidelity``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from autellix.cli.common import OutputFormat, comma_list, fail, one_of, progress
from autellix.cli.options import NO_OVERRIDES, SchedulerOverrides, scheduler_options
from autellix.core.config import BALANCERS, POLICIES
from autellix.sim.workloads import WORKLOADS as UNIT_WORKLOADS
from autellix.workloads import WORKLOADS
from autellix.workloads.systems import SYSTEMS

app = typer.Typer(help="Simulators: unit steps (the paper's toy figures) or agent programs on modelled engines.")


@app.callback(invoke_without_command=True)
@scheduler_options("boundaries", "quanta", "beta", "backlog_factor", "balancer", "max_preemptions", defaults=None,
                   help_text={
    "boundaries": "Queue boundaries: steps (unit steps, e.g. 1,2,4,8) or seconds of service (--engine-profile)",
    "quanta": "Quanta in steps, one per queue, e.g. 1,2,4,8,inf",
    "balancer": f"{one_of(BALANCERS)}; algorithm2 is autellix (default: $AUTELLIX_BALANCER)"})
def sim(
    ctx: typer.Context,
    workload: Annotated[str, typer.Option(
        help=f"Unit steps: {', '.join(UNIT_WORKLOADS)}; with --engine-profile: {', '.join(WORKLOADS)}")] = (
        "figure2"),
    batch_size: Annotated[int, typer.Option(min=1, help="Calls per batch step")] = 2,
    policies: Annotated[str, typer.Option(help=f"Comma-separated: {','.join(POLICIES)}")] = "fcfs,mlfq,plas,atlas",
    seed: Annotated[int, typer.Option(help="Seed of the random workload")] = 0,
    programs: Annotated[int, typer.Option(min=1, help="Programs in the random workload")] = 20,
    rate: Annotated[float | None, typer.Option(help="Random workload: programs per step (default: all at 0)")] = None,
    overrides: SchedulerOverrides = NO_OVERRIDES,
    output: Annotated[OutputFormat, typer.Option("--format", help="table or json")] = OutputFormat.table,
    engine_profile: Annotated[str | None, typer.Option(
        help="Simulate agent programs on engines of this profile (a bundled name or a JSON path)")] = None,
    system: Annotated[str, typer.Option(
        help=f"With --engine-profile, comma-separated: {', '.join(SYSTEMS)}")] = "autellix",
    engines: Annotated[int, typer.Option(min=1, help="With --engine-profile: engines behind the balancer")] = 1,
    calibration: Annotated[str, typer.Option(help="With --engine-profile: paper or raw programs")] = "paper",
    stats: Annotated[bool, typer.Option("--stats", help="Report the simulator's events/s and simulated/wall time")] = (
        False),
    max_num_seqs: Annotated[int | None, typer.Option(
        min=1, help="With --engine-profile: override the profile's running-call slots")] = None,
) -> None:
    """Run the policy core on the unit-cost step simulator and compare policies, or, with
    --engine-profile, the benchmark's agent programs on modelled engines in simulated time."""
    if ctx.invoked_subcommand is not None:
        return
    if engine_profile is not None:
        _sim_programs(engine_profile, workload=workload, programs=programs, rate=rate, seed=seed, systems=system,
                      engines=engines, calibration=calibration, stats=stats, output=output,
                      max_num_seqs=max_num_seqs, overrides=overrides)
        return
    from autellix.core import ConfigError, policy_by_name
    from autellix.sim import UNIT_STEP_CONFIG
    from autellix.sim.report import print_table, to_json
    from autellix.sim.unit import simulate
    from autellix.sim.workloads import random_programs

    if workload not in UNIT_WORKLOADS:
        raise fail(f"unknown workload {workload!r}; expected one of {', '.join(UNIT_WORKLOADS)} "
                   "(agent workloads need --engine-profile)")
    try:  # the unit steps have no engines to balance: --balancer is not read
        config = overrides.with_values(balancer=None).apply(UNIT_STEP_CONFIG)
        chosen = [policy_by_name(name) for name in comma_list(policies)]
    except ConfigError as exc:
        raise fail(str(exc)) from None
    specs = random_programs(seed, programs, rate=rate) if workload == "random" else UNIT_WORKLOADS[workload](seed)
    results = {p.name: simulate(specs, p, config, batch_size=batch_size).summary() for p in chosen}
    if output is OutputFormat.json:
        typer.echo(to_json(results))
    else:
        print_table(results, f"{workload}, batch size {batch_size}, quanta {list(config.quanta)}")


def _sim_programs(profile_name: str, *, workload: str, programs: int, rate: float | None, seed: int, systems: str,
                  engines: int, calibration: str, stats: bool, output: OutputFormat, max_num_seqs: int | None,
                  overrides: SchedulerOverrides) -> None:
    import json

    from autellix.core import SchedulerConfig
    from autellix.sim.engine_profile import EngineProfile
    from autellix.sim.serving import balancer_name, sim_summary, simulate_programs, speed_stats
    from autellix.workloads import make_programs

    names = comma_list(systems)
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown or not names:
        raise fail(f"unknown system(s) {unknown}; expected some of {', '.join(SYSTEMS)}")
    try:
        profile = EngineProfile.load(profile_name).with_overrides(max_num_seqs=max_num_seqs)
        base = SchedulerConfig.from_env()
        config = overrides.with_values(balancer=balancer_name(overrides.values.get("balancer"))).apply(base)
        batch = make_programs(workload, programs, seed=seed, calibration=calibration)
    except (ValueError, FileNotFoundError) as exc:  # ConfigError is a ValueError
        raise fail(str(exc)) from None
    rate = 1.0 if rate is None else rate
    if rate <= 0:
        raise fail("--rate must be > 0 programs per second")
    results = {}
    for name in names:
        run = simulate_programs(batch, profile=profile, system=name, rate=rate, seed=seed, engines=engines,
                                config=config)
        results[name] = sim_summary(run) | ({"simulator": speed_stats(run)} if stats else {})
    if output is OutputFormat.json:
        typer.echo(json.dumps(results, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    columns = [("completed", "done"), ("mean_token_latency", "mean s/tok"), ("p95_token_latency", "P95"),
               ("p99_token_latency", "P99"), ("programs_per_s", "prog/s"), ("mean_call_queue_s", "queue s"),
               ("jain_fairness", "Jain"), ("prefix_cache_hit_rate", "cache hit"), ("engine_utilization", "busy")]
    if stats:
        columns += [("events_per_second", "events/s"), ("sim_to_wall_ratio", "sim/wall")]
    table = Table(title=f"{workload}: {programs} programs at {rate}/s on {engines} x {profile.name} "
                        f"(balancer {config.balancer})")
    table.add_column("system")
    for _, label in columns:
        table.add_column(label, justify="right")
    for name in names:
        row = results[name] | results[name].get("simulator", {})
        table.add_row(name, *(f"{row[k]:.4g}" if isinstance(row[k], float) else str(row[k]) for k, _ in columns))
    Console().print(table)


@app.command("sweep")
def sim_sweep(
    engine_profile: Annotated[str, typer.Option(help="Engine profile (bundled name or JSON path)")] = (
        "a100-llama3.1-8b"),
    figures: Annotated[str, typer.Option(help="Comma-separated: 12 (systems), 14 (engines x balancers), check "
                                         "(autellix vs vllm-opt, plas, client-plas and llmd-fairness; all "
                                         "workloads, --slots, --seeds)")] = "12,14",
    slots: Annotated[str, typer.Option(help="check: comma-separated running-call slots")] = "32,256",
    seeds: Annotated[str, typer.Option(help="check: comma-separated seeds")] = "1,2,3",
    jobs: Annotated[int, typer.Option(min=1, help="check: simulations run in parallel processes")] = 2,
    systems: Annotated[str | None, typer.Option(
        help="check: comma-separated systems (default: autellix and the baselines it is held to)")] = None,
    ours: Annotated[str, typer.Option(help="check: the system held to the baselines")] = "autellix",
    ceiling: Annotated[bool, typer.Option(help="check: run the clairvoyant order and autellix-declared at each "
                                               "overloaded point and report their means over the ceiling's")] = True,
    workloads: Annotated[str | None, typer.Option(
        help="Comma-separated workloads (default: all five for 12 and check, sharegpt and lats for 14)")] = None,
    engines: Annotated[str, typer.Option(help="Figure 14: comma-separated engine counts")] = "1,2,4,8",
    seed: Annotated[int, typer.Option(help="Seed of programs and arrivals")] = 1,
    max_num_seqs: Annotated[int | None, typer.Option(min=1, help="Override the profile's running-call slots")] = None,
    out: Annotated[Path, typer.Option(help="Folder for sim-sweep.json and the PNG plots")] = Path("sim-results"),
) -> None:
    """The paper's Figure 12 (4 workloads x 4 systems, one engine) and Figures 14/15 (1-8 engines,
    round robin vs least used vs Algorithm 2) in simulation: JSON, plots, throughput ratios."""
    import time

    from autellix.sim.engine_profile import EngineProfile
    from autellix.sim.sweep import A100_LOADS, MULTI_LOADS, figure12, figure14, write_report

    chosen = set(comma_list(figures))
    if not chosen or not chosen <= {"12", "14", "check"}:
        raise fail(f"--figures: expected 12, 14 and/or check, got {figures!r}")
    if "check" in chosen:
        _sim_check(engine_profile, slots=slots, seeds=seeds, jobs=jobs, workloads=workloads, systems=systems,
                   ours=ours, ceiling=ceiling, out=out)
        chosen.discard("check")
        if not chosen:
            return
    names = comma_list(workloads) if workloads else None
    try:
        profile = EngineProfile.load(engine_profile).with_overrides(max_num_seqs=max_num_seqs)
        counts = [int(n) for n in engines.split(",") if n.strip()]
    except ValueError as exc:
        raise fail(str(exc)) from None
    for name in names or ():
        if name not in A100_LOADS:
            raise fail(f"unknown workload {name!r}; expected some of {', '.join(A100_LOADS)}")
    if "14" in chosen and names and not set(names) & set(MULTI_LOADS):
        raise fail(f"figure 14 runs {', '.join(MULTI_LOADS)}")
    if any(n < 1 for n in counts):
        raise fail("--engines: counts must be >= 1")
    started = time.perf_counter()
    report: dict[str, Any] = {"profile": profile.name, "max_num_seqs": profile.max_num_seqs, "seed": seed}
    if "12" in chosen:
        report["figure12"] = figure12(profile, workloads=names or tuple(A100_LOADS), seed=seed, progress=progress)
    if "14" in chosen:
        multi = [w for w in (names or MULTI_LOADS) if w in MULTI_LOADS]
        report["figure14"] = figure14(profile, workloads=multi, engine_counts=counts, seed=seed, progress=progress)
    report["wall_seconds"] = time.perf_counter() - started
    for path in write_report(report, out):
        typer.echo(f"wrote {path}")
    for line in _sustained_lines(report):
        typer.echo(line)


def _sim_check(engine_profile: str, *, slots: str, seeds: str, jobs: int, workloads: str | None,
               systems: str | None, ours: str, ceiling: bool, out: Path) -> None:
    """``sim sweep --figures check``: ``sim-check.json``, its table and ``sim-check.png``."""
    import json

    from autellix.sim.sweep import CHECK_LOADS, CHECK_SYSTEMS, check, check_table, plot_check

    try:
        slot_list = [int(n) for n in slots.split(",") if n.strip()]
        seed_list = [int(n) for n in seeds.split(",") if n.strip()]
    except ValueError:
        raise fail("--slots and --seeds: expected comma-separated integers") from None
    if not slot_list or not set(slot_list) <= set(CHECK_LOADS):
        raise fail(f"--slots: the check has loads for {', '.join(map(str, CHECK_LOADS))} slots")
    names = comma_list(workloads) if workloads else list(CHECK_LOADS[32])
    unknown = [w for w in names if w not in CHECK_LOADS[32]]
    if unknown:
        raise fail(f"unknown workload(s) {unknown}; expected some of {', '.join(CHECK_LOADS[32])}")
    chosen = comma_list(systems) if systems else [*CHECK_SYSTEMS, *([ours] if ours not in CHECK_SYSTEMS else [])]
    unknown = [n for n in [*chosen, ours] if n not in SYSTEMS]
    if unknown:
        raise fail(f"unknown system(s) {unknown}; expected some of {', '.join(SYSTEMS)}")
    if ours not in chosen:
        raise fail(f"--ours {ours!r} must be one of the systems run")
    report = check(engine_profile, slots=slot_list, workloads=names, seeds=seed_list, systems=chosen, ours=ours,
                   jobs=jobs, ceiling=ceiling, progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sim-check.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    typer.echo("\n".join(check_table(report)))
    typer.echo(f"wrote {path}\nwrote {plot_check(report, out)}")


def _sustained_lines(report: dict[str, Any]) -> list[str]:
    """Figure 12's and 14's sustained rates and throughput ratios, a line per workload (and engine count)."""
    lines = []
    for workload, data in (report.get("figure12") or {}).items():
        sustained = data["sustained"]
        lines.append(f"figure 12 {workload}: sustained rates " + ", ".join(
            f"{k} {v:.3g}/s" for k, v in sustained["rates"].items()) + "; " + ", ".join(
            f"{k} {v:.2f}x" for k, v in sustained["ratios"].items()))
    for workload, data in (report.get("figure14") or {}).items():
        for n, by_n in data["engines"].items():
            lines.append(f"figure 14 {workload} {n} engines: sustained " + ", ".join(
                f"{k} {v:.3g}/s" for k, v in by_n["sustained"]["rates"].items()) + "; " + ", ".join(
                f"{k} {v:.2f}x" for k, v in by_n["ratios"].items()))
    return lines


@app.command("fidelity")
def sim_fidelity(
    measured: Annotated[Path, typer.Option(help="An `autellix bench sweep` report (JSON)")] = Path(
        "docs/img/bfcl-whole-sweep.json"),
    engine_profile: Annotated[str, typer.Option(help="Engine profile of the engine that was measured")] = "cpu-tiny",
    systems: Annotated[str | None, typer.Option(help="Comma-separated systems (default: all in the report)")] = None,
    output: Annotated[OutputFormat, typer.Option("--format", help="table or json")] = OutputFormat.table,
) -> None:
    """Replay a real benchmark sweep in the simulator: simulated vs measured program token latency."""
    import json

    from autellix.sim.engine_profile import EngineProfile
    from autellix.sim.fidelity import compare_file

    try:
        profile = EngineProfile.load(engine_profile)
        rows = compare_file(measured, profile, [s.strip() for s in systems.split(",")] if systems else None)
    except (ValueError, FileNotFoundError) as exc:
        raise fail(str(exc)) from None
    if output is OutputFormat.json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{measured}: measured vs simulated on {profile.name}")
    for column in ("system", "rate", "measured ms/token", "simulated ms/token", "error"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(row["system"], f"{row['rate']}", f"{1e3 * row['measured']['mean_token_latency']:.2f}",
                      f"{1e3 * row['simulated']['mean_token_latency']:.2f}", f"{100 * row['error']:+.1f}%")
    Console().print(table)
