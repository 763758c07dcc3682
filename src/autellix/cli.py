"""The ``autellix`` command: the single entry point. Nothing imports this module.

Each command is a thin shell over an adapter; heavy imports stay inside the
command so ``autellix --help`` is instant.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import typer

from autellix.backends import BACKENDS, DEFAULT_BACKEND
from autellix.core.config import BALANCERS, POLICIES

app = typer.Typer(no_args_is_help=True, add_completion=False)


def _one_of(names: Iterable[str]) -> str:
    """A registry's names for help text: "a, b or c" (registered once, never typed here)."""
    listed = list(names)
    return ", ".join(listed[:-1]) + " or " + listed[-1] if len(listed) > 1 else "".join(listed)


class OutputFormat(enum.StrEnum):
    table = "table"
    json = "json"


@app.callback()
def main() -> None:
    """Autellix: program-aware LLM serving."""


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


sim_app = typer.Typer(help="Simulators: unit steps (the paper's toy figures) or agent programs on modelled engines.")
app.add_typer(sim_app, name="sim")


@sim_app.callback(invoke_without_command=True)
def sim(
    ctx: typer.Context,
    workload: Annotated[str, typer.Option(
        help="Unit steps: figure2, figure9, random; with --engine-profile: sharegpt, bfcl, lats, fanout, mixed")] = (
        "figure2"),
    batch_size: Annotated[int, typer.Option(min=1, help="Calls per batch step")] = 2,
    policies: Annotated[str, typer.Option(help="Comma-separated: fcfs,mlfq,plas,atlas")] = "fcfs,mlfq,plas,atlas",
    seed: Annotated[int, typer.Option(help="Seed of the random workload")] = 0,
    programs: Annotated[int, typer.Option(min=1, help="Programs in the random workload")] = 20,
    rate: Annotated[float | None, typer.Option(help="Random workload: programs per step (default: all at 0)")] = None,
    boundaries: Annotated[str | None, typer.Option(
        help="Queue boundaries: steps (unit steps, e.g. 1,2,4,8) or seconds of service (--engine-profile)")] = None,
    quanta: Annotated[str | None, typer.Option(help="Quanta in steps, one per queue, e.g. 1,2,4,8,inf")] = None,
    beta: Annotated[float | None, typer.Option(help="Anti-starvation ratio (inf disables)")] = None,
    output: Annotated[OutputFormat, typer.Option("--format", help="table or json")] = OutputFormat.table,
    engine_profile: Annotated[str | None, typer.Option(
        help="Simulate agent programs on engines of this profile (a bundled name or a JSON path)")] = None,
    system: Annotated[str, typer.Option(help="With --engine-profile, comma-separated: vllm, vllm-opt, "
                                        "vllm-priority, client-plas, mlfq, plas, autellix")] = "autellix",
    engines: Annotated[int, typer.Option(min=1, help="With --engine-profile: engines behind the balancer")] = 1,
    balancer: Annotated[str | None, typer.Option(
        help="algorithm2 (autellix), least_used or round_robin (default: $AUTELLIX_BALANCER)")] = None,
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
    from autellix.core import ConfigError, policy_by_name

    if engine_profile is not None:
        _sim_programs(engine_profile, workload=workload, programs=programs, rate=rate, seed=seed, systems=system,
                      engines=engines, balancer=balancer, calibration=calibration, beta=beta, stats=stats,
                      output=output, max_num_seqs=max_num_seqs, boundaries=boundaries, quanta=quanta)
        return
    from autellix.sim import UNIT_STEP_CONFIG
    from autellix.sim.report import print_table, to_json
    from autellix.sim.unit import simulate
    from autellix.sim.workloads import WORKLOADS, random_programs

    if workload not in WORKLOADS:
        raise _fail(f"unknown workload {workload!r}; expected one of {', '.join(WORKLOADS)} "
                    "(agent workloads need --engine-profile)")
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


@sim_app.command("sweep")
def sim_sweep(
    engine_profile: Annotated[str, typer.Option(help="Engine profile (bundled name or JSON path)")] = (
        "a100-llama3.1-8b"),
    figures: Annotated[str, typer.Option(help="Comma-separated: 12 (systems), 14 (engines x balancers), check "
                                         "(issue 15: autellix vs vllm-opt, plas, client-plas; all workloads, "
                                         "--slots, --seeds)")] = "12,14",
    slots: Annotated[str, typer.Option(help="check: comma-separated running-call slots")] = "32,256",
    seeds: Annotated[str, typer.Option(help="check: comma-separated seeds")] = "1,2,3",
    jobs: Annotated[int, typer.Option(min=1, help="check: simulations run in parallel processes")] = 2,
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

    from autellix.sim.engine_model import EngineProfile
    from autellix.sim.sweep import A100_LOADS, MULTI_LOADS, figure12, figure14, write_report

    chosen = {f.strip() for f in figures.split(",") if f.strip()}
    if not chosen or not chosen <= {"12", "14", "check"}:
        raise _fail(f"--figures: expected 12, 14 and/or check, got {figures!r}")
    if "check" in chosen:
        import json

        from autellix.sim.sweep import CHECK_LOADS, check, check_table, plot_check

        try:
            slot_list = [int(n) for n in slots.split(",") if n.strip()]
            seed_list = [int(n) for n in seeds.split(",") if n.strip()]
        except ValueError:
            raise _fail("--slots and --seeds: expected comma-separated integers") from None
        if not set(slot_list) <= set(CHECK_LOADS):
            raise _fail(f"--slots: the check has loads for {', '.join(map(str, CHECK_LOADS))} slots")
        names = [w.strip() for w in workloads.split(",") if w.strip()] if workloads else list(CHECK_LOADS[32])
        unknown = [w for w in names if w not in CHECK_LOADS[32]]
        if unknown:
            raise _fail(f"unknown workload(s) {unknown}; expected some of {', '.join(CHECK_LOADS[32])}")
        report = check(engine_profile, slots=slot_list, workloads=names, seeds=seed_list, jobs=jobs,
                       progress=lambda line: typer.echo(line, err=True))
        out.mkdir(parents=True, exist_ok=True)
        path = out / "sim-check.json"
        path.write_text(json.dumps(report, indent=2, default=str))
        typer.echo("\n".join(check_table(report)))
        typer.echo(f"wrote {path}\nwrote {plot_check(report, out)}")
        chosen.discard("check")
        if not chosen:
            return
    names = [w.strip() for w in workloads.split(",") if w.strip()] if workloads else None
    try:
        profile = EngineProfile.load(engine_profile).with_overrides(max_num_seqs=max_num_seqs)
        counts = [int(n) for n in engines.split(",") if n.strip()]
    except ValueError as exc:
        raise _fail(str(exc)) from None
    for name in names or ():
        if name not in A100_LOADS:
            raise _fail(f"unknown workload {name!r}; expected some of {', '.join(A100_LOADS)}")
    if "14" in chosen and names and not set(names) & set(MULTI_LOADS):
        raise _fail(f"figure 14 runs {', '.join(MULTI_LOADS)}")
    if any(n < 1 for n in counts):
        raise _fail("--engines: counts must be >= 1")
    progress = lambda line: typer.echo(line, err=True)  # noqa: E731
    started = time.perf_counter()
    report: dict = {"profile": profile.name, "max_num_seqs": profile.max_num_seqs, "seed": seed}
    if "12" in chosen:
        report["figure12"] = figure12(profile, workloads=names or tuple(A100_LOADS), seed=seed, progress=progress)
    if "14" in chosen:
        multi = [w for w in (names or MULTI_LOADS) if w in MULTI_LOADS]
        report["figure14"] = figure14(profile, workloads=multi, engine_counts=counts, seed=seed, progress=progress)
    report["wall_seconds"] = time.perf_counter() - started
    for path in write_report(report, out):
        typer.echo(f"wrote {path}")
    for workload, data in (report.get("figure12") or {}).items():
        sustained = data["sustained"]
        typer.echo(f"figure 12 {workload}: sustained rates " + ", ".join(
            f"{k} {v:.3g}/s" for k, v in sustained["rates"].items()) + "; " + ", ".join(
            f"{k} {v:.2f}x" for k, v in sustained["ratios"].items()))
    for workload, data in (report.get("figure14") or {}).items():
        for n, by_n in data["engines"].items():
            typer.echo(f"figure 14 {workload} {n} engines: sustained " + ", ".join(
                f"{k} {v:.3g}/s" for k, v in by_n["sustained"]["rates"].items()) + "; " + ", ".join(
                f"{k} {v:.2f}x" for k, v in by_n["ratios"].items()))


@sim_app.command("fidelity")
def sim_fidelity(
    measured: Annotated[Path, typer.Option(help="An `autellix bench sweep` report (JSON)")] = Path(
        "docs/img/bfcl-whole-sweep.json"),
    engine_profile: Annotated[str, typer.Option(help="Engine profile of the engine that was measured")] = "cpu-tiny",
    systems: Annotated[str | None, typer.Option(help="Comma-separated systems (default: all in the report)")] = None,
    output: Annotated[OutputFormat, typer.Option("--format", help="table or json")] = OutputFormat.table,
) -> None:
    """Replay a real benchmark sweep in the simulator: simulated vs measured program token latency."""
    import json

    from autellix.sim.engine_model import EngineProfile
    from autellix.sim.fidelity import compare_file

    try:
        profile = EngineProfile.load(engine_profile)
        rows = compare_file(measured, profile, [s.strip() for s in systems.split(",")] if systems else None)
    except (ValueError, FileNotFoundError) as exc:
        raise _fail(str(exc)) from None
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


def _sim_programs(profile_name: str, *, workload: str, programs: int, rate: float | None, seed: int, systems: str,
                  engines: int, balancer: str | None, calibration: str, beta: float | None, stats: bool,
                  output: OutputFormat, max_num_seqs: int | None = None, boundaries: str | None = None,
                  quanta: str | None = None) -> None:
    import json

    from autellix.core import ConfigError, SchedulerConfig
    from autellix.sim.engine_model import EngineProfile
    from autellix.sim.serving import SYSTEMS, balancer_name, sim_summary, simulate_programs, speed_stats
    from autellix.workloads import make_programs

    names = [s.strip() for s in systems.split(",") if s.strip()]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown or not names:
        raise _fail(f"unknown system(s) {unknown}; expected some of {', '.join(SYSTEMS)}")
    try:
        profile = EngineProfile.load(profile_name).with_overrides(max_num_seqs=max_num_seqs)
        config = SchedulerConfig.from_env().with_overrides(beta=beta, balancer=balancer_name(balancer),
                                                           boundaries=boundaries, quanta=quanta)
        batch = make_programs(workload, programs, seed=seed, calibration=calibration)
    except (ValueError, ConfigError, FileNotFoundError) as exc:
        raise _fail(str(exc)) from None
    rate = 1.0 if rate is None else rate
    if rate <= 0:
        raise _fail("--rate must be > 0 programs per second")
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


def _scheduler_config(policy: str | None, beta: float | None, balancer: str | None):
    from autellix.core import ConfigError, SchedulerConfig

    try:
        return SchedulerConfig.from_env().with_overrides(policy=policy, beta=beta, balancer=balancer)
    except ConfigError as exc:
        raise _fail(str(exc)) from None


class DiscoveryKind(enum.StrEnum):
    static = "static"
    kubernetes = "kubernetes"


@app.command()
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
    policy: Annotated[str | None, typer.Option(help=f"{_one_of(POLICIES)} (default: $AUTELLIX_POLICY)")] = None,
    beta: Annotated[float | None, typer.Option(help="Anti-starvation ratio")] = None,
    balancer: Annotated[str | None, typer.Option(help=f"{_one_of(BALANCERS)} (default: $AUTELLIX_BALANCER)")] = None,
    backend: Annotated[str, typer.Option(help=f"The engines' kind: {_one_of(BACKENDS)}")] = DEFAULT_BACKEND,
    tokenizer: Annotated[Path | None, typer.Option(help="tokenizer.json for exact prompt lengths")] = None,
    api_keys_file: Annotated[Path | None, typer.Option(
        help="Tenants' keys: a file ('KEY' or 'TENANT KEY' per line) or a mounted Secret's directory "
             "(data key = tenant); also $AUTELLIX_API_KEYS")] = None,
    allow_anonymous: Annotated[bool, typer.Option(
        help="Serve beyond loopback without tenant keys (refused otherwise)")] = False,
    admin_port: Annotated[int | None, typer.Option(
        min=0, help="The admin listener's port (engines, drain, calls, sessions for tenants); none without")] = None,
    admin_host: Annotated[str, typer.Option(help="The admin listener's address")] = "127.0.0.1",
    admin_keys_file: Annotated[Path | None, typer.Option(
        help="Admin keys (file or Secret directory); also $AUTELLIX_ADMIN_KEYS; needed beyond loopback")] = None,
    tenant_max_concurrent: Annotated[int | None, typer.Option(min=1, help="Calls one tenant may run at once")] = None,
    tenant_max_queued: Annotated[int, typer.Option(min=0, help="Calls one tenant may queue beyond those")] = 0,
    tenant_queue_timeout: Annotated[float, typer.Option(min=0.1, help="Seconds a queued call waits, then 429")] = 30.0,
    tenant_rpm: Annotated[float | None, typer.Option(min=0.001, help="Requests per minute per tenant")] = None,
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
    replica_name: Annotated[str | None, typer.Option(
        envvar="AUTELLIX_REPLICA_NAME", help="This replica's label in /metrics (default: HOSTNAME:PORT)")] = None,
) -> None:
    """Run the OpenAI-compatible gateway in front of running engines."""
    from autellix.control.keys import KeysError
    from autellix.control.limits import TenantLimits
    from autellix.gateway.app import GatewayConfig
    from autellix.gateway.serve import ExposedError, serve

    if backend not in BACKENDS:
        raise _fail(f"unknown engine backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    engines = list(engine or [])
    source = None
    if discovery is DiscoveryKind.static and not engines:
        raise _fail("give at least one --engine URL, or --discovery kubernetes")
    if discovery is DiscoveryKind.kubernetes:
        if engines:
            raise _fail("--engine is for --discovery static; kubernetes discovery finds the engines itself")
        from autellix.gateway.kube_discovery import KubeDiscovery

        source = KubeDiscovery(engine_selector, namespace or None, port_name=engine_port_name)
    limits = TenantLimits(max_concurrent=tenant_max_concurrent, max_queued=tenant_max_queued,
                          queue_timeout_s=tenant_queue_timeout, requests_per_minute=tenant_rpm,
                          tokens_per_minute=tenant_tpm, max_sessions=tenant_max_sessions)
    per_tenant = {}
    for item in tenant_concurrency or []:
        name, _, count = item.partition("=")
        if not name or not count.isdigit() or int(count) < 1:
            raise _fail(f"--tenant-concurrency: expected TENANT=N (N >= 1), got {item!r}")
        per_tenant[name] = dataclasses.replace(limits, max_concurrent=int(count))
    config = GatewayConfig(engines=engines, scheduler=_scheduler_config(policy, beta, balancer),
                           tokenizer=tokenizer, api_keys_file=api_keys_file, max_body_bytes=max_body_bytes,
                           discovery=source, stream_header_timeout=stream_header_timeout, backend=backend,
                           allow_anonymous=allow_anonymous, admin_port=admin_port, admin_host=admin_host,
                           admin_keys_file=admin_keys_file, tenant_limits=limits, per_tenant_limits=per_tenant,
                           max_n=max_n,
                           max_tokens=max_tokens, connect_timeout=connect_timeout, whole_timeout=whole_timeout,
                           idle_read_timeout=idle_read_timeout, attempt_timeout=attempt_timeout,
                           write_timeout=write_timeout)
    try:
        serve(config, host, port, store_url=store, shutdown_grace=shutdown_grace, replica=replica_name)
    except (ExposedError, KeysError, ValueError) as exc:
        raise _fail(str(exc)) from None


@app.command()
def up(
    port: Annotated[int, typer.Option(help="Gateway port")] = 8000,
    engines: Annotated[int, typer.Option(min=1, help="Local vLLM engines to start")] = 1,
    policy: Annotated[str | None, typer.Option(help=_one_of(POLICIES))] = None,
    scheduler: Annotated[str, typer.Option(help="Engine scheduler: autellix, vllm-priority or fcfs")] = "autellix",
    engine_arg: Annotated[list[str] | None, typer.Option("--engine-arg", help="Extra vLLM argument (repeatable)")] = (
        None
    ),
    engine_port: Annotated[int, typer.Option(help="First engine port")] = 8100,
    gateways: Annotated[int, typer.Option(min=1, help="Gateway replicas; over 1: behind Envoy on --port")] = 1,
    store: Annotated[str | None, typer.Option(
        help="Gateways > 1: Redis URL of the shared program store (default: a local redis-server)")] = None,
) -> None:
    """The embedded default: local vLLM engines (tiny model) plus the gateway."""
    from autellix.engine.launch import SCHEDULERS
    from autellix.launcher import run_local

    if scheduler not in SCHEDULERS:
        raise _fail(f"unknown engine scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
    run_local(port=port, engines=engines, scheduler_config=_scheduler_config(policy, None, None),
              engine_scheduler=scheduler, engine_args=list(engine_arg or []), first_engine_port=engine_port,
              gateways=gateways, store=store)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def engine(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="Model path or name (default: the local tiny model)")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8100,
    scheduler: Annotated[str, typer.Option(help="autellix, vllm-priority or fcfs")] = "autellix",
    policy: Annotated[str | None, typer.Option(help=f"{_one_of(POLICIES)} (default: $AUTELLIX_POLICY)")] = None,
    beta: Annotated[float | None, typer.Option(help="Anti-starvation ratio")] = None,
    quanta: Annotated[str | None, typer.Option(help="Steps per queue, e.g. 64,128,256,512,inf")] = None,
    boundaries: Annotated[str | None, typer.Option(help="Queue boundaries in seconds of service")] = None,
    multi_step: Annotated[int | None, typer.Option(min=1, help="Re-plan the queues every N steps")] = None,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Tiny model: running calls per batch")] = 64,
) -> None:
    """Run one vLLM OpenAI server with Autellix's scheduler. Arguments after the
    options (or after --) go to vLLM unchanged. `autellix engine drain-wait
    [--url URL] [--interval S] [--timeout S]`: wait until the engine holds no
    call (the engine pod's preStop hook, autellix.backends.drain)."""
    if ctx.args[:1] == ["drain-wait"]:
        from autellix.backends.drain import main as drain_wait

        raise typer.Exit(drain_wait(ctx.args[1:], default_url=f"http://{host}:{port}"))
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


@app.command()
def operator(
    gateway_url: Annotated[str, typer.Option(envvar="AUTELLIX_GATEWAY_URL",
                                             help="The gateway's base URL (sessions, engine drain)")] = (
        "http://autellix-gateway"),
    gateway_api_key: Annotated[str | None, typer.Option(envvar="AUTELLIX_GATEWAY_API_KEY",
                                                        help="API key for the gateway, if it needs one")] = None,
    gateway_admin_url: Annotated[str | None, typer.Option(
        envvar="AUTELLIX_GATEWAY_ADMIN_URL",
        help="The gateway's admin listener: drains and AgentProgram sessions on a tenant's behalf")] = None,
    gateway_admin_key: Annotated[str | None, typer.Option(envvar="AUTELLIX_GATEWAY_ADMIN_KEY",
                                                          help="Admin key for the admin listener")] = None,
    engine_token_secret: Annotated[str | None, typer.Option(
        help="Secret (data key 'token') engines take calls with: only the gateway, which shares it")] = None,
    namespace: Annotated[list[str] | None, typer.Option(
        "--namespace", help="Namespace to serve (repeatable; default: the whole cluster)")] = None,
    autoscale_interval: Annotated[float, typer.Option(min=0.1, help="Seconds between autoscaler decisions")] = 15.0,
    program_poll_interval: Annotated[float, typer.Option(min=0.1, help="Seconds between session reads")] = 5.0,
    liveness: Annotated[str | None, typer.Option(
        help="Serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz")] = None,
    leader_lease: Annotated[str | None, typer.Option(
        help="NAMESPACE/NAME of a Lease: reconcile only while holding it (several replicas)")] = None,
    identity: Annotated[str | None, typer.Option(envvar="POD_NAME",
                                                 help="This replica's name in the Lease (default the host)")] = None,
    engine_image: Annotated[str | None, typer.Option(help="Engine image when a spec names none")] = None,
    inference_pool: Annotated[bool, typer.Option(help="Also an InferencePool per AutellixEngine")] = False,
    xds_port: Annotated[int | None, typer.Option(
        min=0, max=65535, help="Serve Envoy's xDS (ADS) on this port, from the gateway Service's EndpointSlices "
                                "(docs/cluster.md); none without")] = None,
    xds_gateway_service: Annotated[str, typer.Option(
        help="xDS: the gateway Service whose ready pods are Envoy's replicas")] = "autellix-gateway",
    xds_namespace: Annotated[str | None, typer.Option(
        envvar="POD_NAMESPACE", help="xDS: the gateway Service's namespace (default: the operator's own)")] = None,
    xds_listen_port: Annotated[int, typer.Option(
        min=1, max=65535, help="xDS: the port Envoy serves the OpenAI API on")] = 8000,
    xds_listen_host: Annotated[str, typer.Option(help="xDS: the address Envoy serves it on")] = "0.0.0.0",
    verbose: Annotated[bool, typer.Option(help="Debug logging")] = False,
) -> None:
    """The Kubernetes operator: AutellixEngine -> engine Deployment + Service (autoscaled),
    AgentProgram -> Job + gateway session (docs/operator.md)."""
    import asyncio

    import kopf

    from autellix.kube.handlers import OperatorConfig
    from autellix.kube.run import run_operator

    if not gateway_url.startswith(("http://", "https://")):
        raise _fail(f"--gateway-url: expected an http(s) URL, got {gateway_url!r}")
    kopf.configure(verbose=verbose)
    if gateway_admin_url is not None and not gateway_admin_url.startswith(("http://", "https://")):
        raise _fail(f"--gateway-admin-url: expected an http(s) URL, got {gateway_admin_url!r}")
    config = OperatorConfig(gateway_url=gateway_url.rstrip("/"), gateway_api_key=gateway_api_key,
                            gateway_admin_url=gateway_admin_url.rstrip("/") if gateway_admin_url else None,
                            gateway_admin_key=gateway_admin_key, engine_token_secret=engine_token_secret,
                            autoscale_interval=autoscale_interval, program_poll_interval=program_poll_interval,
                            inference_pool=inference_pool, **({"engine_image": engine_image} if engine_image else {}))
    import socket

    from kubernetes_asyncio.config import ConfigException

    from autellix.kube.leader import LeaseConfig
    from autellix.kube.run import LeadershipLost

    lease = None
    if leader_lease:
        lease_namespace, _, lease_name = leader_lease.partition("/")
        if not lease_namespace or not lease_name:
            raise _fail(f"--leader-lease: expected NAMESPACE/NAME, got {leader_lease!r}")
        lease = LeaseConfig(lease_namespace, lease_name, identity or socket.gethostname())
    operator_run = run_operator(config, namespaces=list(namespace or []), liveness_endpoint=liveness, leader=lease)
    if xds_port is not None:  # every replica serves xDS, the leader or not (it reads, never writes)
        from autellix.mesh.kube_source import serve_xds_with
        from autellix.mesh.resources import MeshSettings

        if not xds_namespace:
            raise _fail("--xds-port needs --xds-namespace (or $POD_NAMESPACE): where the gateway Service is")
        envoy_listens = MeshSettings(listen_host=xds_listen_host, listen_port=xds_listen_port)
        operator_run = serve_xds_with(operator_run, envoy_listens, xds_gateway_service, xds_namespace, port=xds_port)
    try:
        asyncio.run(operator_run)
    except ConfigException as exc:
        raise _fail(f"no Kubernetes credentials (in-cluster service account or kubeconfig): {exc}") from None
    except LeadershipLost as exc:
        raise _fail(f"{exc}; exiting so the pod restarts as a candidate") from None


@app.command()
def profile(
    target: Annotated[str, typer.Option(help="Base URL of a running vLLM engine (--enable-per-request-metrics)")],
    name: Annotated[str, typer.Option(help="Profile name")] = "cpu-tiny",
    out: Annotated[Path | None, typer.Option(help="Where to write the profile JSON (default: ./<name>.json)")] = None,
    model: Annotated[str, typer.Option(help="Model name to request")] = "tiny-llama",
    max_num_seqs: Annotated[int, typer.Option(min=1, help="The engine's --max-num-seqs")] = 4,
    max_num_batched_tokens: Annotated[int, typer.Option(min=1, help="The engine's --max-num-batched-tokens")] = 1024,
    max_model_len: Annotated[int, typer.Option(min=1, help="The engine's --max-model-len")] = 8192,
    block_size: Annotated[int | None, typer.Option(min=1, help="KV block size (default: read from /metrics)")] = None,
    kv_blocks: Annotated[int | None, typer.Option(min=1, help="KV blocks (default: read from /metrics)")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Runs of each controlled batch")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the random prompts")] = 0,
) -> None:
    """Drive a running engine with controlled batches and fit the simulator's step cost model."""
    import asyncio
    import datetime
    import json

    from autellix.sim.cost_model import StepCost
    from autellix.sim.engine_model import EngineProfile
    from autellix.sim.profiling import DEFAULT_GROUPS, INTERFERENCE, build_profile, engine_cache_config, measure

    try:
        cache = engine_cache_config(target)
    except OSError as exc:
        raise _fail(f"cannot read {target}/metrics: {exc}") from None
    block_size = block_size or cache.get("block_size")
    kv_blocks = kv_blocks or cache.get("num_gpu_blocks")
    if not block_size or not kv_blocks:
        raise _fail("the engine's /metrics has no vllm:cache_config_info: pass --block-size and --kv-blocks")
    try:
        base = EngineProfile(name, block_size, kv_blocks, max_num_seqs, max_num_batched_tokens,
                             StepCost(0.0, 0.0, 0.0, 0.0), max_model_len=max_model_len)
        measured = asyncio.run(measure(target, DEFAULT_GROUPS + INTERFERENCE, model=model, repeats=repeats, seed=seed,
                                       progress=lambda line: typer.echo(line, err=True)))
    except (ValueError, RuntimeError, OSError) as exc:
        raise _fail(str(exc)) from None
    engine_info = {"target": target, "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                   "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    data = build_profile(measured, base, engine=engine_info)
    path = out or Path(f"{name}.json")
    path.write_text(json.dumps(data, indent=2) + "\n")
    fit = data["fit"]
    typer.echo(f"wrote {path}: step = {data['cost']} (R^2 {fit['r2']:.3f}, "
               f"mean |error| {100 * fit['mean_abs_rel_error']:.1f}% over {fit['samples']} timings)")


bench_app = typer.Typer(help="Agent-program benchmarks against any OpenAI endpoint.")
app.add_typer(bench_app, name="bench")


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    target: Annotated[str, typer.Option(help="Gateway or bare vLLM base URL")] = "http://127.0.0.1:8000",
    workload: Annotated[str, typer.Option(help="sharegpt, bfcl, lats, fanout or mixed")] = "bfcl",
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

    from autellix.bench.runner import run_programs
    from autellix.workloads import make_programs
    from autellix.workloads.metrics import summarize

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
    workload: Annotated[str, typer.Option(help="sharegpt, bfcl, lats, fanout or mixed")] = "bfcl",
    rates: Annotated[str | None, typer.Option(
        help="Comma-separated arrival rates (programs/s); default: the workload's (bench/sweep.py)")] = None,
    programs: Annotated[int | None, typer.Option(min=1, help="Programs per rate (default: the workload's)")] = None,
    seed: Annotated[int, typer.Option(help="Seed of programs and arrivals")] = 1,
    systems: Annotated[str, typer.Option(
        help="Comma-separated: vllm, vllm-opt, client-plas, vllm-priority, mlfq, plas, autellix")] = (
        "vllm,vllm-opt,client-plas,plas,autellix"),
    calibration: Annotated[str, typer.Option(help="paper or raw")] = "paper",
    stream: Annotated[bool, typer.Option(help="Stream calls (default: whole calls, so the client and the "
                                              "gateway spend CPU per call, not per token, beside the engine)")] = False,
    out: Annotated[Path, typer.Option(help="Folder for the JSON report and PNG plots")] = Path("bench-results"),
    beta: Annotated[float | None, typer.Option(
        help="Anti-starvation ratio for mlfq and autellix (default: the workload's, bench/sweep.py)")] = None,
    boundaries: Annotated[str | None, typer.Option(
        help="Queue boundaries in seconds of service, e.g. 0.5,2,8,32 (default: the workload's)")] = None,
    isolate_cores: Annotated[bool, typer.Option(
        help="Keep the model worker's cores to it: the engine's servers, the gateway and the client run on the "
             "others (docs/benchmarks.md)")] = False,
) -> None:
    """Every system on a fresh local stack over a range of rates: JSON, plots, throughput ratios."""
    from autellix.bench.sweep import ENGINE_SETTINGS, run_sweep, write_report
    from autellix.core import ConfigError, SchedulerConfig

    try:
        rate_list = [float(r) for r in rates.split(",") if r.strip()] if rates else None
    except ValueError:
        raise _fail(f"--rates: expected comma-separated numbers, got {rates!r}") from None
    scheduler = None
    if beta is not None or boundaries is not None:
        base = ENGINE_SETTINGS[workload].scheduler if workload in ENGINE_SETTINGS else None
        try:
            scheduler = (base or SchedulerConfig()).with_overrides(beta=beta, boundaries=boundaries)
        except ConfigError as exc:
            raise _fail(str(exc)) from None
    try:
        report = run_sweep(workload, rate_list, programs=programs, seed=seed, calibration=calibration, stream=stream,
                           scheduler=scheduler, isolate_cores=isolate_cores,
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
                   f"{row.get('p99_vs_vllm_opt', float('nan')):.2f}x vllm-opt's" + "".join(
                       f"; mean {row[k]:.2f}x {k[8:].replace('_', '-')}'s" for k in row if k.startswith("mean_vs_")))


@app.command()
def emulate(
    port: Annotated[list[int] | None, typer.Option(
        "--port", help="Engine port (repeatable, one engine each); one port and --engines N: N from there")] = None,
    engines: Annotated[int, typer.Option(min=1, max=64, help="Emulated engines, one port each")] = 1,
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    profile: Annotated[str, typer.Option(help="Engine profile: a name in autellix/sim/profiles or a JSON path")] = (
        "cpu-tiny"),
    scheduler: Annotated[str, typer.Option(help="autellix, vllm-priority, fcfs or mlfq")] = "autellix",
    policy: Annotated[str | None, typer.Option(help=f"{_one_of(POLICIES)} (default: $AUTELLIX_POLICY)")] = None,
    time_scale: Annotated[float, typer.Option(min=0.001, help="Wall seconds per model second (0.1: 10x faster)")] = (
        1.0),
    model: Annotated[str, typer.Option(help="Served model name")] = "emulated",
    prefix_caching: Annotated[bool, typer.Option(help="Model prefix caching")] = True,
    max_num_seqs: Annotated[int | None, typer.Option(min=1, help="Override the profile's running-call limit")] = None,
    coalesce_ms: Annotated[float, typer.Option(min=0, help="Run decode-only steps in stretches of this many "
                                                          "modelled ms (0: step by step)")] = 0.0,
) -> None:
    """Emulated vLLM engines: the simulator's engine model behind vLLM's HTTP API, in real time."""
    import asyncio
    import contextlib

    from autellix.core import ConfigError, SchedulerConfig
    from autellix.sim.emulator import SCHEDULERS, EmulatedEngine, serve
    from autellix.sim.engine_model import EngineProfile

    if scheduler not in SCHEDULERS:
        raise _fail(f"unknown scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
    try:
        config = SchedulerConfig.from_env().with_overrides(policy=policy)
        engine_profile = EngineProfile.load(profile)
        if max_num_seqs is not None:
            engine_profile = engine_profile.with_overrides(max_num_seqs=max_num_seqs)
    except (ConfigError, OSError, ValueError) as exc:
        raise _fail(str(exc)) from None

    ports = list(port or [8100])
    if len(ports) == 1:
        ports = list(range(ports[0], ports[0] + engines))
    elif engines not in (1, len(ports)):
        raise _fail(f"--engines {engines} but {len(ports)} ports given")

    async def main() -> None:
        pool = [EmulatedEngine(engine_profile, model_name=model, scheduler=scheduler, config=config,
                               prefix_caching=prefix_caching, time_scale=time_scale, coalesce=coalesce_ms / 1e3)
                for _ in ports]
        typer.echo(f"{len(ports)} emulated engine(s) ({engine_profile.name}, {scheduler}, time x{time_scale}) on "
                   + ", ".join(f"http://{host}:{p}" for p in ports), err=True)
        await serve(pool, host, ports)

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how it stops
        asyncio.run(main())


cluster_app = typer.Typer(help="Many emulated engines behind the real gateway (autellix emulate).")
bench_app.add_typer(cluster_app, name="cluster")


@cluster_app.callback()
def bench_cluster(
    ctx: typer.Context,
    profile: Annotated[str, typer.Option(help="Engine profile of the emulated engines")] = "a100-llama3.1-8b",
    time_scale: Annotated[float, typer.Option(min=0.01, help="Wall seconds per modelled second")] = 0.25,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Running calls per engine")] = 4,
    arrival_seconds: Annotated[float, typer.Option(min=1, help="Seconds of arrivals per rate")] = 20.0,
    out: Annotated[Path, typer.Option(help="Folder for the JSON report")] = Path("bench-results"),
) -> None:
    """Settings shared by the studies (bench/cluster.py, docs/emulator.md)."""
    from autellix.bench.cluster import ClusterSettings

    ctx.obj = (ClusterSettings(profile=profile, time_scale=time_scale, max_num_seqs=max_num_seqs,
                               arrival_seconds=arrival_seconds), out)


def _write_json(report: dict, out: Path, name: str) -> Path:
    import json

    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(report, indent=2, default=str))
    return path


def _numbers(text: str | None, kind: type = float) -> list | None:
    """A comma-separated option as numbers (None when not given)."""
    if not text:
        return None
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise _fail(f"expected comma-separated numbers, got {text!r}") from None


@cluster_app.command("balancers")
def bench_cluster_balancers(
    ctx: typer.Context,
    workload: Annotated[str, typer.Option(help="sharegpt, bfcl, lats or mixed")] = "sharegpt",
    engines: Annotated[int, typer.Option(min=1, max=64, help="Emulated engines")] = 4,
    rates: Annotated[str | None, typer.Option(help="Comma-separated rates (default: engines x per-engine rates)")] = (
        None),
    balancers: Annotated[str, typer.Option(help="Comma-separated: round_robin,least_used,autellix")] = (
        "round_robin,least_used,autellix"),
    seed: Annotated[int, typer.Option(help="Seed of programs and arrivals")] = 1,
) -> None:
    """Figure 14: the gateway's balancers side by side on emulated engines."""
    from autellix.bench.cluster import run_balancers

    settings, out = ctx.obj
    try:
        report = run_balancers(workload, engines=engines, rates=_numbers(rates),
                               balancers=[b.strip() for b in balancers.split(",") if b.strip()],
                               settings=settings, seed=seed, progress=lambda line: typer.echo(line, err=True))
    except (ValueError, KeyError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"wrote {_write_json(report, out, f'cluster-{workload}-{engines}-balancers.json')}")
    for key, ratio in report["sustained"]["ratios"].items():
        typer.echo(f"throughput at equal latency {key}: {ratio:.2f}x")


@cluster_app.command("scaling")
def bench_cluster_scaling(
    ctx: typer.Context,
    workload: Annotated[str, typer.Option(help="sharegpt, bfcl, lats or mixed")] = "sharegpt",
    engines: Annotated[str, typer.Option(help="Comma-separated engine counts")] = "1,2,4,8",
    balancer: Annotated[str, typer.Option(help="round_robin, least_used or autellix")] = "autellix",
    rates_per_engine: Annotated[str | None, typer.Option(
        help="Comma-separated rates per engine (default: the workload's, bench/cluster.py)")] = None,
    seed: Annotated[int, typer.Option(help="Seed of programs and arrivals")] = 1,
) -> None:
    """Figure 15: sustainable rate against the engine count."""
    from autellix.bench.cluster import run_scaling

    settings, out = ctx.obj
    try:
        report = run_scaling(workload, engine_counts=_numbers(engines, int) or [1], balancer=balancer,
                             rates_per_engine=_numbers(rates_per_engine), settings=settings, seed=seed,
                             progress=lambda line: typer.echo(line, err=True))
    except (ValueError, KeyError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"wrote {_write_json(report, out, f'cluster-{workload}-scaling.json')}")
    for n, rate in report["sustained"].items():
        typer.echo(f"{n} engine(s): sustains {rate:.2f} programs/s ({report['speedup'][n]:.2f}x one engine's)")
