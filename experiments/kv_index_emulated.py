"""The KV event index over emulated engines: the gateway following their events, against the same without them.

Per round and mode, in an order that rotates between rounds, starts ``autellix emulate`` (``--engines``
modelled engines behind vLLM's HTTP API in real time, each publishing its KV cache events as vLLM does) and
``autellix gateway`` in front of them: with the KV event index (the default; given no tokenizer, it fetches
the emulator's), with ``--no-kv-index`` (Algorithm 2 as the paper has it) and with llm-d's prefix rule
(``--balancer prefix_score``, over the same index). Each run sends the same
``shared-context`` programs (many programs over a few long team prompts) at ``--rate`` programs a second, and
reports the mean and P99 program token latency and the engines' prefix-cache hit rate. The emulator is
restarted for every run, so each starts with empty caches.

    .venv/bin/python experiments/kv_index_emulated.py [--engines 4] [--programs 80] [--rate 2] [--rounds 3]

A benchmark, not a test: the emulator and the gateway share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from typing import Any

from autellix.child_processes import gateway_process
from autellix.loadgen.runner import run_programs
from autellix.sim.emulator import emulator_process
from autellix.workloads import make_programs

MODEL = "emulated"
MODES = {"index": (), "no-index": ("--no-kv-index",), "llm-d": ("--balancer", "prefix_score")}


def run_once(args: argparse.Namespace, mode: str, seed: int) -> dict[str, Any]:
    programs = make_programs("shared-context", args.programs, seed=seed)
    with emulator_process(args.engines, "--profile", args.profile, "--time-scale", str(args.time_scale),
                          "--model", MODEL, "--coalesce-ms", str(args.coalesce_ms)) as engines, \
            gateway_process(engines, "--no-program-admission", *MODES[mode]) as base:
        result = asyncio.run(run_programs(base, programs, rate=args.rate, seed=seed, model=MODEL,
                                          engines=engines))
    done = [p for p in result.programs if p.error is None]
    latencies = sorted(p.token_latency for p in done)
    return {"mode": mode, "seed": seed, "completed": len(done), "failed": len(result.programs) - len(done),
            "mean_ms_per_token": 1e3 * statistics.fmean(latencies),
            "p99_ms_per_token": 1e3 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "prefix_cache_hit_rate": result.prefix_cache_hit_rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--programs", type=int, default=80)
    parser.add_argument("--rate", type=float, default=2.0, help="programs a second, over all engines")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", default="a100-llama3.1-8b")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--coalesce-ms", type=float, default=20.0)
    args = parser.parse_args()
    runs = []
    for round_ in range(args.rounds):
        order = list(MODES)[round_ % len(MODES):] + list(MODES)[:round_ % len(MODES)]
        for mode in order:
            runs.append(run_once(args, mode, seed=round_ + 1))
            print(json.dumps(runs[-1]), flush=True)
    by_seed = {(r["mode"], r["seed"]): r for r in runs}
    seeds = range(1, args.rounds + 1)
    summary: dict[str, Any] = {"settings": vars(args)}
    for mode in MODES:
        summary[mode] = {key: statistics.fmean(by_seed[mode, s][key] for s in seeds)
                         for key in ("mean_ms_per_token", "p99_ms_per_token", "prefix_cache_hit_rate")}
        summary[mode]["mean_over_no_index"] = [
            by_seed[mode, s]["mean_ms_per_token"] / by_seed["no-index", s]["mean_ms_per_token"] for s in seeds]
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
