"""``autellix bench cluster``: many engines behind the real gateway, on one machine.

The engines are emulated (``autellix emulate``: the simulator's engine model
behind vLLM's HTTP API, in real time), so 4 or 8 of them fit on a 2-core
machine beside the real gateway and the real agent programs. Two studies, the
paper's Figures 14 and 15:

* balancers: one engine count, the gateway's load balancers side by side
  (``round_robin``, ``least_used``, ``autellix`` = Algorithm 2) over arrival
  rates; the throughput ratio of Algorithm 2 over round robin at equal latency;
* scaling: 1, 2, 4, 8 engines with one balancer, the arrival rates scaled with
  the engine count; the highest rate each count sustains under a latency bound.

Calls are sent whole (not streamed): the client and the gateway then do a
fixed amount of work per call instead of per token, which is what lets one
machine drive many engines. ``time_scale`` slows the emulated hardware down
(2.0: each step takes twice its modelled time) for the same reason; latencies
are reported in wall time, so compare them only within one scale.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autellix.child_processes import gateway_process
from autellix.loadgen.runner import run_programs
from autellix.sim.emulator import emulator_process
from autellix.workloads import make_programs
from autellix.workloads.run_metrics import highest_rate_under, summarize, sustained_rates

BALANCERS = ("round_robin", "least_used", "autellix")
MODEL = "emulated"


@dataclass(frozen=True)
class ClusterSettings:
    profile: str = "a100-llama3.1-8b"
    #: Few running calls per engine, so that a handful of engines saturate at a
    #: call rate one machine's gateway and client can drive (an A100 takes 256).
    max_num_seqs: int = 4
    time_scale: float = 0.25
    #: The emulator's decode stretches (modelled ms): one process keeps up with 8 engines.
    coalesce_ms: float = 40.0
    #: Seconds of arrivals per rate: programs = rate x this, at least ``min_programs``.
    arrival_seconds: float = 20.0
    min_programs: int = 8
    policy: str = "atlas"

    def programs_at(self, rate: float) -> int:
        return max(self.min_programs, round(rate * self.arrival_seconds))


#: Per-engine arrival rates (programs per wall second) that span unloaded to
#: overloaded for one engine of the default settings; a cluster of n engines
#: is swept at n x these.
RATES_PER_ENGINE: dict[str, tuple[float, ...]] = {
    "sharegpt": (0.5, 1.0, 2.0, 3.0),
    "bfcl": (0.5, 1.0, 2.0, 3.0),
    "lats": (0.05, 0.1, 0.2, 0.3),
    "mixed": (0.1, 0.2, 0.4, 0.6),
}


@contextlib.contextmanager
def emulated_cluster(engines: int, balancer: str, settings: ClusterSettings,
                     log_dir: Path) -> Iterator[tuple[str, list[str]]]:
    """``engines`` emulated engines and a gateway with ``balancer``; yields (gateway URL, engine URLs)."""
    if balancer not in BALANCERS:
        raise ValueError(f"unknown balancer {balancer!r}; expected one of {', '.join(BALANCERS)}")
    log_dir.mkdir(parents=True, exist_ok=True)
    with emulator_process(engines, f"--profile={settings.profile}", f"--time-scale={settings.time_scale}",
                          f"--max-num-seqs={settings.max_num_seqs}", f"--coalesce-ms={settings.coalesce_ms}",
                          f"--policy={settings.policy}", f"--model={MODEL}",
                          log_path=log_dir / f"emulator-{engines}-{balancer}.log") as urls, \
            gateway_process(urls, "--policy", settings.policy, "--balancer", balancer,
                            log_path=log_dir / f"gateway-{engines}-{balancer}.log") as gateway:
        yield gateway, urls


def run_point(target: str, engines: Sequence[str], workload: str, rate: float, count: int, *, seed: int,
              calibration: str) -> dict[str, Any]:
    programs = make_programs(workload, count, seed=seed, calibration=calibration)
    run = asyncio.run(run_programs(target, programs, rate=rate, seed=seed, model=MODEL, engines=engines,
                                   stream=False))
    return summarize(run)


def _progress_line(label: str, rate: float, summary: dict[str, Any], count: int, started: float) -> str:
    return (f"{label} @ {rate:g}/s: mean token latency {summary['mean_token_latency']:.4f} s, "
            f"p99 {summary['p99_token_latency']:.4f} s, {summary['completed']}/{count} done "
            f"in {time.monotonic() - started:.0f} s")


def run_balancers(workload: str, *, engines: int = 4, rates: Sequence[float] | None = None,
                  balancers: Sequence[str] = BALANCERS, settings: ClusterSettings = ClusterSettings(),
                  seed: int = 1, calibration: str = "paper", log_dir: Path | None = None,
                  progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Figure 14: the balancers side by side on ``engines`` emulated engines."""
    rates = list(rates or [engines * r for r in RATES_PER_ENGINE[workload]])
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="autellix-cluster-"))
    results: dict[str, dict[str, Any]] = {}
    for balancer in balancers:
        with emulated_cluster(engines, balancer, settings, log_dir) as (gateway, urls):
            results[balancer] = {}
            for i, rate in enumerate(rates):
                count, started = settings.programs_at(rate), time.monotonic()
                summary = run_point(gateway, urls, workload, rate, count, seed=seed + i, calibration=calibration)
                results[balancer][str(rate)] = summary
                progress(_progress_line(f"{engines} engines, {balancer}", rate, summary, count, started))
    sustained = sustained_rates(results, rates)
    ratios = {f"{b}/round_robin": sustained["rates"][b] / sustained["rates"]["round_robin"]
              for b in results if b != "round_robin" and sustained["rates"].get("round_robin")}
    return {"study": "balancers", "workload": workload, "engines": engines, "rates": rates, "seed": seed,
            "calibration": calibration, "settings": settings.__dict__, "results": results,
            "sustained": {**sustained, "ratios": ratios},
            "latency_ratio": latency_ratios(results, rates, baseline="round_robin")}


def latency_ratios(results: dict[str, dict[str, Any]], rates: Sequence[float], *,
                   baseline: str) -> dict[str, dict[str, float]]:
    """Mean token latency of ``baseline`` over each system's, rate by rate (> 1: faster than the baseline)."""
    if baseline not in results:
        return {}
    return {name: {str(r): results[baseline][str(r)]["mean_token_latency"] / by_rate[str(r)]["mean_token_latency"]
                   for r in rates}
            for name, by_rate in results.items() if name != baseline}


def run_scaling(workload: str, *, engine_counts: Sequence[int] = (1, 2, 4, 8), balancer: str = "autellix",
                rates_per_engine: Sequence[float] | None = None,
                settings: ClusterSettings = ClusterSettings(), seed: int = 1, calibration: str = "paper",
                log_dir: Path | None = None, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Figure 15: the sustainable rate against the engine count (rates scale with the count)."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="autellix-cluster-"))
    per_engine = list(rates_per_engine or RATES_PER_ENGINE[workload])
    results: dict[str, dict[str, Any]] = {}
    for n in engine_counts:
        rates = [n * r for r in per_engine]
        with emulated_cluster(n, balancer, settings, log_dir) as (gateway, urls):
            by_rate: dict[str, Any] = {}
            for i, rate in enumerate(rates):
                count, started = settings.programs_at(rate), time.monotonic()
                by_rate[str(rate)] = run_point(gateway, urls, workload, rate, count, seed=seed + i,
                                               calibration=calibration)
                progress(_progress_line(f"{n} engines, {balancer}", rate, by_rate[str(rate)], count, started))
        results[str(n)] = by_rate
    # One latency bound for every count: 3x the smallest cluster's latency at its lowest rate.
    first = str(engine_counts[0])
    bound = 3.0 * results[first][str(engine_counts[0] * per_engine[0])]["mean_token_latency"]
    sustained = {str(n): highest_rate_under(results[str(n)], [n * r for r in per_engine], bound)
                 for n in engine_counts}
    base = sustained[first]
    return {"study": "scaling", "workload": workload, "balancer": balancer, "engine_counts": list(engine_counts),
            "rates_per_engine": list(per_engine), "seed": seed, "calibration": calibration,
            "settings": settings.__dict__, "results": results, "latency_bound": bound, "sustained": sustained,
            "speedup": {k: (v / base if base else None) for k, v in sustained.items()}}
