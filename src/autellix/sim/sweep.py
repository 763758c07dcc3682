"""``autellix sim sweep``: the paper's Figure 12 and Figures 14/15 in simulation.

Figure 12: one engine, four workloads, four systems (``vllm``: FCFS, no prefix
cache, no chunked prefill; ``vllm-opt``: FCFS with both; ``mlfq``; ``autellix``),
mean program token latency against arrival rate, and each system's sustained
rate under a latency bound (``autellix.bench.sweep.sustained_rates``: the
throughput ratio at equal latency that the paper reports).

Figures 14/15: ``autellix`` on 1, 2, 4 and 8 engines behind each balancer
(round robin, least used, Algorithm 2); rates scale with the engine count, and
the sustained rate per engine count shows how throughput grows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autellix.bench.programs import make_programs
from autellix.bench.sweep import loaded_comparison, sustained_rates
from autellix.core import SchedulerConfig
from autellix.sim.engine_model import EngineProfile
from autellix.sim.serving import sim_summary, simulate_programs, speed_stats

FIGURE12_SYSTEMS = ("vllm", "vllm-opt", "mlfq", "autellix")
BALANCERS = {"round_robin": "round robin", "least_used": "least used", "autellix": "Algorithm 2"}


@dataclass(frozen=True)
class Load:
    """The arrival rates of one workload on one engine, and how many programs each rate runs."""

    rates: tuple[float, ...]
    #: Seconds of arrivals per rate (programs = rate x this, at least ``min_programs``).
    arrival_seconds: float
    min_programs: int = 20

    def programs_at(self, rate: float) -> int:
        return max(self.min_programs, round(rate * self.arrival_seconds))


#: Rates (programs/s, one A100 with LLaMA-3.1-8B) from unloaded to past
#: saturation of the best system, found by trial runs of the simulator; vLLM
#: without prefix caching saturates several times earlier.
A100_LOADS: dict[str, Load] = {
    "sharegpt": Load((0.25, 0.5, 1.0, 1.5, 2.0, 3.0), 240.0),
    "bfcl": Load((0.5, 1.0, 2.0, 3.0, 4.0, 6.0), 120.0),
    "lats": Load((0.05, 0.1, 0.2, 0.4, 0.6, 0.8), 200.0, min_programs=10),
    "mixed": Load((0.1, 0.2, 0.4, 0.8, 1.2, 1.6), 200.0),
}

#: Per-engine rates of the multi-engine sweep (multiplied by the engine count).
MULTI_LOADS: dict[str, Load] = {
    "sharegpt": Load((0.5, 1.0, 1.5, 2.0, 3.0), 120.0),
    "lats": Load((0.1, 0.2, 0.4, 0.6, 0.8), 150.0, min_programs=10),
}


def _run(workload: str, load: Load, rate: float, *, profile: EngineProfile, system: str, engines: int,
         config: SchedulerConfig, seed: int, index: int) -> dict[str, Any]:
    # the same programs and arrivals for every system at a rate, as the benchmark's sweep does
    programs = make_programs(workload, load.programs_at(rate), seed=seed + index)
    run = simulate_programs(programs, profile=profile, system=system, rate=rate, seed=seed + index,
                            engines=engines, config=config)
    return sim_summary(run) | {"simulator": speed_stats(run)}


def figure12(profile: EngineProfile, *, workloads: Sequence[str] = tuple(A100_LOADS),
             systems: Sequence[str] = FIGURE12_SYSTEMS, loads: dict[str, Load] | None = None, seed: int = 1,
             progress: Callable[[str], None] = print) -> dict[str, Any]:
    loads = loads or A100_LOADS
    out: dict[str, Any] = {}
    for workload in workloads:
        load = loads[workload]
        results: dict[str, dict[str, Any]] = {}
        for system in systems:
            results[system] = {}
            for i, rate in enumerate(load.rates):
                started = time.perf_counter()
                summary = _run(workload, load, rate, profile=profile, system=system, engines=1,
                               config=SchedulerConfig(), seed=seed, index=i)
                results[system][str(rate)] = summary
                progress(f"fig12 {workload} {system} @ {rate}/s: mean {summary['mean_token_latency']:.4f} s/token, "
                         f"{summary['completed']} programs, {time.perf_counter() - started:.1f} s")
        out[workload] = {"rates": list(load.rates), "programs": {str(r): load.programs_at(r) for r in load.rates},
                         "results": results, "sustained": sustained_rates(results, load.rates),
                         "under_load": loaded_comparison(results, load.rates)}
    return out


def figure14(profile: EngineProfile, *, workloads: Sequence[str] = tuple(MULTI_LOADS),
             engine_counts: Sequence[int] = (1, 2, 4, 8), balancers: Sequence[str] = tuple(BALANCERS),
             loads: dict[str, Load] | None = None, seed: int = 1,
             progress: Callable[[str], None] = print) -> dict[str, Any]:
    loads = loads or MULTI_LOADS
    out: dict[str, Any] = {}
    for workload in workloads:
        base = loads[workload]
        by_engines: dict[str, Any] = {}
        for n in engine_counts:
            load = Load(tuple(round(r * n, 4) for r in base.rates), base.arrival_seconds, base.min_programs)
            results: dict[str, dict[str, Any]] = {}
            for balancer in balancers:
                config = SchedulerConfig(balancer=balancer)
                results[balancer] = {}
                for i, rate in enumerate(load.rates):
                    started = time.perf_counter()
                    summary = _run(workload, load, rate, profile=profile, system="autellix", engines=n,
                                   config=config, seed=seed, index=i)
                    results[balancer][str(rate)] = summary
                    progress(f"fig14 {workload} {n} engines {balancer} @ {rate}/s: mean "
                             f"{summary['mean_token_latency']:.4f} s/token, {time.perf_counter() - started:.1f} s")
            sustained = sustained_rates(results, load.rates)
            rates = sustained["rates"]
            ratios = {f"{b}/round_robin": rates[b] / rates["round_robin"]
                      for b in balancers if b != "round_robin" and rates.get("round_robin")}
            by_engines[str(n)] = {"rates": list(load.rates), "results": results, "sustained": sustained,
                                  "ratios": ratios}
        scaling = {b: {n: by_engines[n]["sustained"]["rates"][b] for n in by_engines} for b in balancers}
        out[workload] = {"engines": by_engines, "scaling": scaling}
    return out


def plot(report: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    fig12 = report.get("figure12") or {}
    if fig12:
        fig, axes = plt.subplots(1, len(fig12), figsize=(4.2 * len(fig12), 3.6))
        axes = axes if len(fig12) > 1 else [axes]
        for ax, (workload, data) in zip(axes, fig12.items(), strict=True):
            for name, by_rate in data["results"].items():
                ax.plot(data["rates"], [by_rate[str(r)]["mean_token_latency"] for r in data["rates"]], marker="o",
                        label=name)
            ax.set(xlabel="program arrival rate (programs/s)", ylabel="mean token latency (s/token)",
                   title=workload, yscale="log")
        axes[0].legend()
        fig.suptitle(f"Figure 12 in simulation: {report['profile']}")
        fig.tight_layout()
        paths.append(out_dir / "sim-figure12.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    fig14 = report.get("figure14") or {}
    if fig14:
        fig, axes = plt.subplots(1, len(fig14), figsize=(4.5 * len(fig14), 3.6))
        axes = axes if len(fig14) > 1 else [axes]
        for ax, (workload, data) in zip(axes, fig14.items(), strict=True):
            for balancer, by_n in data["scaling"].items():
                ns = [int(n) for n in by_n]
                ax.plot(ns, list(by_n.values()), marker="o", label=BALANCERS.get(balancer, balancer))
            ns = [int(n) for n in next(iter(data["scaling"].values()))]
            one = data["scaling"].get("autellix", {}).get("1")
            if one:
                ax.plot(ns, [one * n for n in ns], linestyle=":", color="grey", label="linear")
            ax.set(xlabel="engines", ylabel="sustained rate (programs/s)", title=workload, xticks=ns)
        axes[0].legend()
        fig.suptitle(f"Figures 14/15 in simulation: sustained rate vs engines ({report['profile']})")
        fig.tight_layout()
        paths.append(out_dir / "sim-figure14.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def write_report(report: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "sim-sweep.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    return [path, *plot(report, out_dir)]
