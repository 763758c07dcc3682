"""KV retention across tool pauses in the simulator: prefill recomputed per program, retention off / kept / offloaded.

For each point (workload, slots, rate, seed) the same programs and arrivals run
on the A100 profile three ways under the ``autellix`` system: ``lru`` (the
profile's ``kv_retention`` off: paused prefixes left to the LRU free list, as
stock vLLM), ``keep`` (held, given up by dropping under pressure) and
``offload`` (held, given up by offloading to a host pool of
``--host-gib`` GiB over a link of ``--link-gbps`` GB/s, or dropping when that
is cheaper). Reported per configuration: prefix tokens recomputed per program
(``EngineModel``'s ``recomputed_prefix_tokens``), prefill tokens per program,
mean and P99 program token latency. Deterministic (virtual time)::

    .venv/bin/python experiments/kv_retention_sim.py --workload tool-pause --out docs/results/kv-retention-sim.json

With no ``--rates`` the points are the A100 check's: ``A100_CHECK_LOADS`` of
``autellix.workloads.tool_pause`` for tool-pause, ``autellix.sim.sweep.CHECK_LOADS``
for the others (the workloads without tools, where retention must cost nothing:
``--workload sharegpt,bfcl,lats,mixed,fanout --configs lru,keep``).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import sim_summary, simulate_programs
from autellix.sim.sweep import CHECK_LOADS
from autellix.workloads import make_programs
from autellix.workloads.tool_pause import (
    A100_CHECK_ARRIVAL_SECONDS,
    A100_CHECK_LOADS,
    A100_CHECK_MIN_PROGRAMS,
)

#: Llama-3.1-8B in bf16: 2 x 32 layers x 8 KV heads x 128 x 2 bytes per token.
KV_BYTES_PER_TOKEN = 131072
CONFIGS = ("lru", "keep", "offload")


def profile_for(config: str, slots: int, host_gib: float, link_gbps: float) -> EngineProfile:
    base = EngineProfile.load("a100-llama3.1-8b").with_overrides(max_num_seqs=slots)
    if config == "lru":
        return base.with_overrides(kv_retention=False)
    if config == "keep":
        return base
    block_bytes = KV_BYTES_PER_TOKEN * base.block_size
    return base.with_overrides(host_kv_blocks=int(host_gib * 2**30 // block_bytes),
                               swap_s_per_block=block_bytes / (link_gbps * 1e9))


def check_rates(workload: str, slots: int) -> tuple[float, ...]:
    if workload == "tool-pause":
        return A100_CHECK_LOADS[slots]
    return CHECK_LOADS[slots][workload].rates


def program_count(workload: str, slots: int, rate: float) -> int:
    if workload == "tool-pause":
        return max(A100_CHECK_MIN_PROGRAMS, round(rate * A100_CHECK_ARRIVAL_SECONDS))
    return CHECK_LOADS[slots][workload].programs_at(rate)


def run_point(workload: str, slots: int, rate: float, seed: int, config: str, host_gib: float,
              link_gbps: float) -> dict[str, Any]:
    count = program_count(workload, slots, rate)
    programs = make_programs(workload, count, seed=seed)
    run = simulate_programs(programs, profile=profile_for(config, slots, host_gib, link_gbps), system="autellix",
                            rate=rate, seed=seed)
    summary = sim_summary(run)
    engines = list(run.engines.values())
    total = {key: sum(e[key] for e in engines) for key in (
        "recomputed_prefix_tokens", "reused_prefix_tokens", "prefill_tokens", "kv_kept", "kv_offloaded",
        "kv_dropped", "restored_tokens", "swap_seconds", "preemptions")}
    n = len(programs)
    return {"workload": workload, "slots": slots, "rate": rate, "seed": seed, "config": config, "programs": n,
            "recomputed_prefix_tokens_per_program": total["recomputed_prefix_tokens"] / n,
            "prefill_tokens_per_program": total["prefill_tokens"] / n,
            "mean_token_latency_ms": 1e3 * summary["mean_token_latency"],
            "p99_token_latency_ms": 1e3 * summary["p99_token_latency"],
            "completed": summary["completed"], **total}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="tool-pause", help="comma-separated workloads")
    parser.add_argument("--slots", default="32,256", help="max_num_seqs values")
    parser.add_argument("--rates", default=None, help="comma-separated; default: the workload's A100 check loads")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--host-gib", type=float, default=64.0)
    parser.add_argument("--link-gbps", type=float, default=25.0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    tasks = []
    for workload in args.workload.split(","):
        for slots in (int(s) for s in args.slots.split(",")):
            rates = [float(r) for r in args.rates.split(",")] if args.rates else check_rates(workload, slots)
            for rate in rates:
                for seed in (int(s) for s in args.seeds.split(",")):
                    for config in args.configs.split(","):
                        tasks.append((workload, slots, rate, seed, config, args.host_gib, args.link_gbps))
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_point, *zip(*tasks, strict=True)))
    for row in rows:
        sys.stdout.write(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}) + "\n")
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
