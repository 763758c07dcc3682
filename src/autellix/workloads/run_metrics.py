"""A run's records (per program, per call) and the metrics the benchmark and the simulator report.

Metrics (``summarize``):
* program token latency: (finish - arrival) / tokens generated, the paper's
  metric; for parallel programs the response time is the whole program's;
  and the mean program latency itself (finish - arrival, seconds);
* throughput: programs and tokens per second over the run;
* per call: queueing (vLLM's queue time), TTFT (client side);
* waiting share: per call, queue time / call time, averaged over calls;
* Jain's fairness index of program token latencies;
* per program: the most calls it had in flight at once;
* from the engines' counters over the run: the prefix-cache hit rate and the
  preemptions of its calls.

Over a sweep of arrival rates: the highest rate each system sustains under a
latency bound (``sustained_rates``) and the comparison under load
(``loaded_comparison``).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autellix.stats import jain_index, mean, percentile


@dataclass
class CallStat:
    program_id: str
    thread: str | None
    submitted: float
    finished: float = 0.0
    first_token: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    queue_s: float | None = None  # vLLM's queue time, when the engine reports it
    #: vLLM's time from queued to the last token (queue, first token, generation), when
    #: reported: the call's latency less this is transport (client, gateway, API server).
    engine_s: float | None = None
    #: The engine's model time for the call (the simulator's; None where the engine does not say).
    model_time: float | None = None


@dataclass
class ProgramStat:
    program_id: str
    workload: str
    arrival: float
    finish: float = 0.0
    tokens: int = 0
    calls: int = 0
    max_parallel: int = 0
    #: Times its session was refused (429: no room for a new program) before it opened.
    refused: int = 0
    error: str | None = None

    @property
    def token_latency(self) -> float:
        return (self.finish - self.arrival) / max(self.tokens, 1)


@dataclass
class RunResult:
    programs: list[ProgramStat]
    calls: list[CallStat]
    started: float
    ended: float
    prefix_cache_hit_rate: float | None = None
    #: Preemptions of the run's calls on the engines (None: no engine was read).
    preemptions: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def poisson_arrivals(count: int, rate: float, seed: int) -> list[float]:
    """Arrival offsets (seconds) of ``count`` programs at ``rate`` per second."""
    if rate <= 0:
        raise ValueError("rate must be > 0 programs per second")
    rng, t, out = random.Random(f"arrivals:{seed}"), 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out



def per_program(result: RunResult) -> list[dict[str, Any]]:
    """Each program's own figures, in arrival order: which programs make a
    run's mean and its tail (a report's rounds can then be set program by
    program beside each other, or beside the simulator's)."""
    return [{"program": p.program_id, "workload": p.workload, "token_latency": p.token_latency, "tokens": p.tokens,
             "calls": p.calls, "seconds": p.finish - p.arrival, "refused": p.refused, "error": p.error}
            for p in sorted(result.programs, key=lambda p: p.arrival)]


def steady_throughput(run: RunResult, share: float = 0.9) -> float:
    """Generated tokens per second from the run's start until ``share`` of them were generated: the last
    programs' tail, alone on the engines, says nothing of how the engines were shared (0 when none was)."""
    goal, done = share * sum(c.completion_tokens for c in run.calls), 0
    for call in sorted(run.calls, key=lambda c: c.finished):
        done += call.completion_tokens
        if done and done >= goal:
            return done / (call.finished - run.started)
    return 0.0


def summarize(result: RunResult) -> dict[str, Any]:
    done = [p for p in result.programs if p.error is None]
    latencies = [p.token_latency for p in done]
    span = max((p.finish for p in done), default=result.ended) - result.started
    calls = [c for c in result.calls if c.finished]
    ttfts = [c.first_token - c.submitted for c in calls if c.first_token is not None]
    queues = [c.queue_s for c in calls if c.queue_s is not None]
    shares = [c.queue_s / (c.finished - c.submitted) for c in calls
              if c.queue_s is not None and c.finished > c.submitted]
    parallel = [p.max_parallel for p in result.programs]
    return {
        "programs": len(result.programs),
        "completed": len(done),
        "failed": len(result.programs) - len(done),
        "errors": sorted({p.error for p in result.programs if p.error})[:5],
        "refused_opens": sum(p.refused for p in result.programs),
        "calls": len(calls),
        "mean_token_latency": mean(latencies),
        "mean_program_seconds": mean([p.finish - p.arrival for p in done]),
        "p50_token_latency": percentile(latencies, 50),
        "p95_token_latency": percentile(latencies, 95),
        "p99_token_latency": percentile(latencies, 99),
        "programs_per_s": len(done) / span if span > 0 else 0.0,
        "tokens_per_s": sum(p.tokens for p in done) / span if span > 0 else 0.0,
        "mean_call_queue_s": mean(queues),
        "p95_call_queue_s": percentile(queues, 95),
        "mean_ttft_s": mean(ttfts),
        "p95_ttft_s": percentile(ttfts, 95),
        "waiting_share": mean(shares),
        "jain_fairness": jain_index(latencies),
        "max_parallel_calls": max(parallel, default=0),
        "prefix_cache_hit_rate": result.prefix_cache_hit_rate,
        "preemptions": result.preemptions,
    }


def sustained_rates(results: dict[str, dict[str, Any]], rates: Sequence[float],
                    bound_factor: float = 3.0) -> dict[str, Any]:
    """The highest rate each system keeps mean token latency under a bound:
    ``bound_factor`` x the best system's latency at the lowest rate (unloaded),
    interpolated between swept rates. Ratios against the vLLM baselines."""
    lowest = str(rates[0])
    base = min((r[lowest]["mean_token_latency"] for r in results.values() if lowest in r), default=math.nan)
    bound = bound_factor * base
    sustained = {name: highest_rate_under(by_rate, rates, bound) for name, by_rate in results.items()}
    ratios = {}
    for other in ("vllm", "vllm-opt", "client-plas", "llmd-fairness", "plas"):
        if "autellix" in sustained and sustained.get(other):
            ratios[f"autellix/{other}"] = sustained["autellix"] / sustained[other]
    return {"latency_bound": bound, "bound_factor": bound_factor, "rates": sustained, "ratios": ratios}


def highest_rate_under(by_rate: dict[str, Any], rates: Sequence[float], bound: float) -> float:
    """The highest rate whose mean token latency stays under ``bound``, interpolated
    linearly between swept rates (0 when even the lowest rate exceeds it)."""
    best, prev = 0.0, None
    for rate in rates:
        lat = by_rate[str(rate)]["mean_token_latency"]
        if lat <= bound:
            best, prev = rate, (rate, lat)
            continue
        if prev is not None:
            best = prev[0] + (rate - prev[0]) * (bound - prev[1]) / (lat - prev[1])
        break
    return best


def loaded_comparison(results: dict[str, dict[str, Any]], rates: Sequence[float],
                      load_factor: float = 3.0) -> list[dict[str, Any]]:
    """At each rate where the ``vllm`` baseline's mean token latency is at least
    ``load_factor`` x its value at the lowest rate: autellix's latency cut against
    vllm, its P99 against vllm-opt's, and its mean over each other baseline's
    that ran (``mean_vs_client_plas`` ...; the issue's checked claims)."""
    if "vllm" not in results or "autellix" not in results:
        return []
    unloaded = results["vllm"][str(rates[0])]["mean_token_latency"]
    rows = []
    for rate in rates:
        key = str(rate)
        base, ours = results["vllm"][key], results["autellix"][key]
        if base["mean_token_latency"] < load_factor * unloaded:
            continue
        row = {"rate": rate, "vllm_load": base["mean_token_latency"] / unloaded,
               "latency_cut_vs_vllm": base["mean_token_latency"] / ours["mean_token_latency"]}
        if "vllm-opt" in results:
            row["p99_vs_vllm_opt"] = ours["p99_token_latency"] / results["vllm-opt"][key]["p99_token_latency"]
        # autellix's mean over each other baseline's (below 1: autellix is faster)
        for other in ("vllm-opt", "client-plas", "llmd-fairness", "plas", "vllm-priority"):
            if other in results and key in results[other]:
                row[f"mean_vs_{other.replace('-', '_')}"] = (ours["mean_token_latency"]
                                                           / results[other][key]["mean_token_latency"])
        rows.append(row)
    return rows


def paired_rounds(rounds: Sequence[dict[str, dict[str, Any]]], rates: Sequence[float],
                  reference: str) -> dict[str, Any]:
    """Systems run in rounds, each once a round in turn (``bench sweep --rounds``):
    runs minutes apart share the machine's hour, so a system's mean and P99
    token latency over ``reference``'s *in the same round* is the comparison a
    shared machine can make. Per rate and system: each round's ratios, their
    geometric mean and range, and the system's own latencies (the spread from
    run to run, which a single pair cannot show)."""
    by_rate: dict[str, Any] = {}
    for rate in rates:
        key = str(rate)
        systems: dict[str, Any] = {}
        for name in rounds[0]:
            entry: dict[str, Any] = {}
            for metric, label in (("mean_token_latency", "mean"), ("p99_token_latency", "p99")):
                own = [r[name][key][metric] for r in rounds]
                entry[label] = _spread(own)
                if name != reference:
                    entry[f"{label}_vs_reference"] = _spread(
                        [r[name][key][metric] / r[reference][key][metric] for r in rounds])
            systems[name] = entry
        by_rate[key] = systems
    return {"reference": reference, "rounds": len(rounds), "by_rate": by_rate}


def _spread(values: list[float]) -> dict[str, Any]:
    positive = all(v > 0 for v in values)
    return {"rounds": values, "geomean": statistics.geometric_mean(values) if positive else math.nan,
            "min": min(values), "max": max(values)}
