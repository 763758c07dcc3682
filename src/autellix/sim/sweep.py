"""``autellix sim sweep``: the paper's Figure 12 and Figures 14/15 in simulation,
and the check against the baselines.

Figure 12: one engine, five workloads, the systems (``vllm``: FCFS, no prefix
cache, no chunked prefill; ``vllm-opt``: FCFS with both; ``client-plas``;
``llmd-fairness``: llm-d's flow control in front of vllm-opt; ``mlfq``;
``plas``; ``autellix``),
mean program token latency against arrival rate, and each system's sustained
rate under a latency bound (``autellix.workloads.run_metrics.sustained_rates``: the
throughput ratio at equal latency that the paper reports).

Figures 14/15: ``autellix`` on 1, 2, 4 and 8 engines behind each balancer
(round robin, least used, Algorithm 2); rates scale with the engine count, and
the sustained rate per engine count shows how throughput grows.

Check: every workload at 32 and 256 slots, three seeds, the rates of
``CHECK_LOADS``: autellix's mean and its P99 each at most ``CHECK_FACTOR`` x
the best baseline's (vllm-opt, plas, client-plas and the llm-d rule,
``llmd-fairness``; ``check_point``). At each overloaded point (vllm-opt at
``OVERLOAD_FACTOR`` x or more its latency at the lowest rate) the clairvoyant
order runs too (``autellix.sim.clairvoyant``), and autellix's mean over its
mean says how far autellix is from what any order of programs can reach; so
does ``autellix-declared``, autellix with every program declaring its size
(``autellix.control.size_hints``): how far declared sizes take it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autellix.core import SchedulerConfig
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import sim_summary, simulate_programs, speed_stats
from autellix.workloads import make_programs, tool_pause
from autellix.workloads.run_metrics import loaded_comparison, sustained_rates

FIGURE12_SYSTEMS = ("vllm", "vllm-opt", "client-plas", "llmd-fairness", "mlfq", "plas", "autellix")
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
    "fanout": Load((0.25, 0.5, 1.0, 2.0, 3.0, 4.0), 120.0),
}

#: The check (``check``): per slot count, rates from unloaded to past
#: saturation of the best system (tool-pause: its module's check loads).
CHECK_LOADS: dict[int, dict[str, Load]] = {
    32: {"sharegpt": Load((0.5, 1.0, 2.0, 3.0), 60.0),
         "bfcl": Load((1.0, 2.0, 4.0, 6.0), 60.0),
         "lats": Load((0.1, 0.2, 0.4, 0.6), 100.0, min_programs=10),
         "mixed": Load((0.2, 0.4, 0.8, 1.2), 100.0),
         "fanout": Load((0.25, 0.5, 1.0, 2.0), 60.0)},
    256: {"sharegpt": Load((0.5, 1.0, 2.0, 3.0), 60.0),
          "bfcl": Load((1.0, 2.0, 4.0, 8.0), 60.0),
          "lats": Load((0.1, 0.2, 0.4, 0.8), 100.0, min_programs=10),
          "mixed": Load((0.2, 0.4, 0.8, 1.6), 100.0),
          "fanout": Load((0.5, 1.0, 2.0, 4.0), 60.0)},
}
for _slots, _rates in tool_pause.A100_CHECK_LOADS.items():
    CHECK_LOADS[_slots][tool_pause.WORKLOAD] = Load(_rates, tool_pause.A100_CHECK_ARRIVAL_SECONDS,
                                                    tool_pause.A100_CHECK_MIN_PROGRAMS)
#: The check's systems: autellix and the baselines it is held against.
CHECK_SYSTEMS = ("vllm-opt", "client-plas", "plas", "llmd-fairness", "autellix")
#: autellix's mean and its P99 may each be at most this times the best of ...
CHECK_FACTOR = 1.05
#: ... these baselines (each metric's own best).
CHECK_RIVALS = ("vllm-opt", "plas", "client-plas", "llmd-fairness")
#: The ceiling the check holds autellix's mean to at the overloaded points (not a rival: no system can run it).
CEILING = "clairvoyant"
#: The target: autellix's mean at most this times the clairvoyant order's at every overloaded point.
CEILING_FACTOR = 1.1
#: autellix with every program declaring its size, held to the ceiling beside it at the overloaded points.
DECLARED = "autellix-declared"
#: The systems run only at the overloaded points.
OVERLOADED_ONLY = (CEILING, DECLARED)
#: A point is overloaded where vllm-opt's mean is at least this many times its mean at the lowest rate.
OVERLOAD_FACTOR = 3.0

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


def _check_task(task: tuple[str, str, int, float, int, str, int]) -> tuple[tuple[str, int, int, str, str], Any]:
    profile_name, workload, slots, rate, index, system, seed = task
    profile = EngineProfile.load(profile_name).with_overrides(max_num_seqs=slots)
    load = CHECK_LOADS[slots][workload]
    started = time.perf_counter()
    # the defaults, or what AUTELLIX_* set (the systems behind a gateway run with them)
    summary = _run(workload, load, rate, profile=profile, system=system, engines=1, config=SchedulerConfig.from_env(),
                   seed=seed, index=index)
    summary["simulator"]["task_seconds"] = time.perf_counter() - started
    return (workload, slots, seed, str(rate), system), summary


def check_point(by_system: dict[str, dict[str, Any]], ours: str = "autellix") -> dict[str, Any]:
    """The check at one point: ``ours``'s mean at most ``CHECK_FACTOR`` x the best
    mean of the ``CHECK_RIVALS`` that ran, and its P99 at most ``CHECK_FACTOR`` x
    their best P99; and ``ours`` against each rival."""
    mine = by_system[ours]
    rivals = [name for name in CHECK_RIVALS if name in by_system and name != ours]
    out: dict[str, Any] = {}
    for metric, label in (("mean_token_latency", "mean"), ("p99_token_latency", "p99")):
        best = min(rivals, key=lambda name: by_system[name][metric])
        ratio = mine[metric] / by_system[best][metric]
        out |= {f"best_{label}_rival": best, f"{label}_vs_best": ratio, f"{label}_ok": ratio <= CHECK_FACTOR}
        for name in rivals:
            out[f"{label}_vs_{name.replace('-', '_')}"] = mine[metric] / by_system[name][metric]
    out["passed"] = out["mean_ok"] and out["p99_ok"]
    if CEILING in by_system:
        ceiling = by_system[CEILING]["mean_token_latency"]
        out["mean_vs_clairvoyant"] = mine["mean_token_latency"] / ceiling
        if DECLARED in by_system:
            out["declared_vs_clairvoyant"] = by_system[DECLARED]["mean_token_latency"] / ceiling
    return out


def overloaded(results: dict[tuple[str, int, int, str, str], Any], rates: Sequence[float],
               key: tuple[str, int, int, float]) -> bool:
    """Whether vllm-opt's mean at point ``key`` (workload, slots, seed, rate) is ``OVERLOAD_FACTOR`` times
    its mean at the lowest of ``rates`` (the same seed) or more; False where vllm-opt did not run."""
    workload, slots, seed, rate = key
    loaded = results.get((workload, slots, seed, str(rate), "vllm-opt"))
    unloaded = results.get((workload, slots, seed, str(min(rates)), "vllm-opt"))
    if loaded is None or unloaded is None:
        return False
    return loaded["mean_token_latency"] >= OVERLOAD_FACTOR * unloaded["mean_token_latency"]


def check(profile_name: str, *, slots: Sequence[int] = (32, 256), workloads: Sequence[str] | None = None,
          seeds: Sequence[int] = (1, 2, 3), systems: Sequence[str] = CHECK_SYSTEMS, ours: str = "autellix",
          jobs: int = 2, ceiling: bool = True, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Every workload (default: all of ``CHECK_LOADS``), slot count, seed and rate
    of ``CHECK_LOADS``, every system, on ``jobs`` processes; each point checked
    by ``check_point`` with ``ours`` held to the baselines; with ``ceiling``, the
    clairvoyant order and ``DECLARED`` run at each overloaded point (``overloaded``) as well."""
    workloads = list(workloads or CHECK_LOADS[slots[0]])
    tasks = [(profile_name, w, n, rate, i, system, seed) for n in slots for w in workloads for seed in seeds
             for i, rate in enumerate(CHECK_LOADS[n][w].rates) for system in systems]
    results: dict[tuple[str, int, int, str, str], Any] = {}
    started = time.perf_counter()

    def run(batch: list[tuple[str, str, int, float, int, str, int]], total: int) -> None:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for key, summary in pool.map(_check_task, batch):
                results[key] = summary
                progress(f"check {key[0]} {key[1]} slots seed {key[2]} @ {key[3]}/s {key[4]}: mean "
                         f"{1e3 * summary['mean_token_latency']:.1f} ms/token, P99 "
                         f"{1e3 * summary['p99_token_latency']:.1f} ({len(results)}/{total}, "
                         f"{time.perf_counter() - started:.0f} s)")

    run(tasks, len(tasks))
    if ceiling and ours in systems:
        # only where it says something: under light load every order is the same
        ceiling_tasks = [(profile_name, w, n, rate, i, system, seed) for n in slots for w in workloads
                         for seed in seeds for i, rate in enumerate(CHECK_LOADS[n][w].rates)
                         if overloaded(results, CHECK_LOADS[n][w].rates, (w, n, seed, rate))
                         for system in OVERLOADED_ONLY if system not in systems]
        run(ceiling_tasks, len(tasks) + len(ceiling_tasks))
    out: dict[str, Any] = {"profile": profile_name, "systems": list(systems), "seeds": list(seeds), "ours": ours,
                           "scheduler": SchedulerConfig.from_env().to_mapping(),
                           "factor": CHECK_FACTOR, "rivals": list(CHECK_RIVALS), "ceiling": CEILING,
                           "overload_factor": OVERLOAD_FACTOR, "slots": {}}
    for n in slots:
        by_workload: dict[str, Any] = {}
        for w in workloads:
            load = CHECK_LOADS[n][w]
            points = []
            for seed in seeds:
                for rate in load.rates:
                    by_system = {s: results[key] for s in (*systems, *OVERLOADED_ONLY)
                                 if (key := (w, n, seed, str(rate), s)) in results}
                    row = {"seed": seed, "rate": rate, "programs": load.programs_at(rate),
                           "overloaded": overloaded(results, load.rates, (w, n, seed, rate)), "results": by_system}
                    if ours in by_system and (set(CHECK_RIVALS) - {ours}) & set(by_system):
                        row["check"] = check_point(by_system, ours)
                    points.append(row)
            by_workload[w] = {"rates": list(load.rates), "points": points}
        out["slots"][str(n)] = by_workload
    out["wall_seconds"] = time.perf_counter() - started
    return out


def check_table(report: dict[str, Any]) -> list[str]:
    """Markdown rows: per slot count, workload and rate, each system's mean over
    the seeds, autellix's worst ratios to the best baseline and the checks passed."""
    lines = ["| slots | workload | rate | " + " | ".join(f"{s} mean" for s in report["systems"])
             + " | mean / best | P99 / best | mean / llmd-fairness | mean / clairvoyant"
             + " | declared mean / clairvoyant | passed |",
             "|---" * (len(report["systems"]) + 9) + "|"]
    for n, by_workload in report["slots"].items():
        for w, data in by_workload.items():
            for rate in data["rates"]:
                rows = [p for p in data["points"] if p["rate"] == rate]
                means = [sum(p["results"][s]["mean_token_latency"] for p in rows) / len(rows)
                         for s in report["systems"]]
                checks = [p["check"] for p in rows if "check" in p]
                passed = sum(c["passed"] for c in checks)
                lines.append(f"| {n} | {w} | {rate} | " + " | ".join(f"{1e3 * m:.1f}" for m in means)
                             + "".join(f" | {_worst(checks, key)}"
                                       for key in ("mean_vs_best", "p99_vs_best", "mean_vs_llmd_fairness",
                                                   "mean_vs_clairvoyant", "declared_vs_clairvoyant"))
                             + f" | {passed}/{len(checks)} |")
    for key, who in (("mean_vs_clairvoyant", "autellix's"), ("declared_vs_clairvoyant", f"{DECLARED}'s")):
        behind = [p["check"][key] for by_workload in report["slots"].values()
                  for data in by_workload.values() for p in data["points"] if key in p.get("check", {})]
        if behind:
            lines.append(f"\n{who} mean over the clairvoyant order's at {len(behind)} overloaded points: at most "
                         f"{CEILING_FACTOR}x at {sum(r <= CEILING_FACTOR for r in behind)}, worst {max(behind):.3f}x")
    return lines


def _worst(checks: list[dict[str, Any]], key: str) -> str:
    """The highest of the points' ``key`` ratios, printed ('-' when none has it)."""
    values = [c[key] for c in checks if key in c]
    return f"{max(values):.3f}" if values else "-"


def plot_check(report: dict[str, Any], out_dir: Path) -> Path:
    """Mean and P99 program token latency against rate, per slot count and
    workload, each system's mean over the seeds: ``sim-check.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [(n, w, data) for n, by_workload in report["slots"].items() for w, data in by_workload.items()]
    fig, axes = plt.subplots(2, len(cells), figsize=(2.9 * len(cells), 5.6), squeeze=False)
    for col, (n, w, data) in enumerate(cells):
        for row, key in enumerate(("mean_token_latency", "p99_token_latency")):
            ax = axes[row][col]
            for system in report["systems"]:
                values = []
                for rate in data["rates"]:
                    points = [p for p in data["points"] if p["rate"] == rate]
                    values.append(1e3 * sum(p["results"][system][key] for p in points) / len(points))
                ax.plot(data["rates"], values, marker="o", markersize=3, label=system)
            ax.set(title=f"{w}, {n} slots" if row == 0 else "", yscale="log",
                   xlabel="programs/s" if row == 1 else "",
                   ylabel=("mean" if row == 0 else "P99") + " ms/token" if col == 0 else "")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"check ({report['profile']}): mean over seeds {report['seeds']}")
    fig.tight_layout()
    path = out_dir / "sim-check.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


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

    def per_workload(figure: dict[str, Any], width: float, title: str, name: str,
                     draw: Callable[[Any, str, dict[str, Any]], None]) -> list[Path]:
        """One panel per workload of ``figure``, drawn by ``draw(axes, workload, data)``: ``name``."""
        if not figure:
            return []
        fig, axes = plt.subplots(1, len(figure), figsize=(width * len(figure), 3.6))
        axes = axes if len(figure) > 1 else [axes]
        for ax, (workload, data) in zip(axes, figure.items(), strict=True):
            draw(ax, workload, data)
        axes[0].legend()
        fig.suptitle(title)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return [path]

    def latency(ax: Any, workload: str, data: dict[str, Any]) -> None:
        for name, by_rate in data["results"].items():
            ax.plot(data["rates"], [by_rate[str(r)]["mean_token_latency"] for r in data["rates"]], marker="o",
                    label=name)
        ax.set(xlabel="program arrival rate (programs/s)", ylabel="mean token latency (s/token)",
               title=workload, yscale="log")

    def scaling(ax: Any, workload: str, data: dict[str, Any]) -> None:
        for balancer, by_n in data["scaling"].items():
            ns = [int(n) for n in by_n]
            ax.plot(ns, list(by_n.values()), marker="o", label=BALANCERS.get(balancer, balancer))
        ns = [int(n) for n in next(iter(data["scaling"].values()))]
        one = data["scaling"].get("autellix", {}).get("1")
        if one:
            ax.plot(ns, [one * n for n in ns], linestyle=":", color="grey", label="linear")
        ax.set(xlabel="engines", ylabel="sustained rate (programs/s)", title=workload, xticks=ns)

    return [*per_workload(report.get("figure12") or {}, 4.2, f"Figure 12 in simulation: {report['profile']}",
                          "sim-figure12.png", latency),
            *per_workload(report.get("figure14") or {}, 4.5,
                          f"Figures 14/15 in simulation: sustained rate vs engines ({report['profile']})",
                          "sim-figure14.png", scaling)]


def write_report(report: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "sim-sweep.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    return [path, *plot(report, out_dir)]
