"""KV retention on the real CPU engine: prefix tokens recomputed per program and program token latency, per setting.

Each round runs ``autellix_lab.retention_scenario`` once per configuration,
each in a process of its own (vLLM keeps the KV connector in a process-wide
global), the order alternating between rounds:

* ``lru``: retention off (``AUTELLIX_KV_RETENTION=off``): paused prefixes are
  left to vLLM's LRU free list, as stock vLLM leaves them;
* ``keep``: paused prefixes held, dropped under memory pressure;
* ``swap``: held, and offloaded to the swap connector's host pool under
  pressure when that costs less than the recompute.

The counts (prefix tokens recomputed, prefill tokens, cache hits) come from the
engine's own counters. In real time (the default) they depend on how fast the
engine steps against the pauses: a loaded machine recomputes more under LRU and
under retention alike. ``--step-s`` runs in step time (each engine step lasts
that long; pauses and the scheduler's clock follow), where the counts are the
same on any machine; the latencies are then steps x ``step_s``. Real-time
latencies: record them only on a quiet machine. Tool-pause, counts::

    .venv/bin/python experiments/kv_retention_engine.py --rounds 1 --step-s 0.03

What retention costs a workload without tools (latency; quiet machine)::

    .venv/bin/python experiments/kv_retention_engine.py --workload sharegpt --configs lru,keep --rounds 5 \\
        --programs 8 --max-calls 6 --kv-blocks 512 --max-num-seqs 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

CONFIGS = {"lru": ["--no-retention"], "keep": ["--retention", "--no-swap"], "swap": ["--retention", "--swap"]}


def scenario(args: list[str], timeout: float) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "autellix_lab.retention_scenario", *args],
                          capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("AUTELLIX_RESULT "):
            return json.loads(line.removeprefix("AUTELLIX_RESULT "))
    raise RuntimeError(f"scenario {args} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="lru,keep,swap")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workload", default="tool-pause")
    parser.add_argument("--programs", type=int, default=6)
    parser.add_argument("--max-calls", type=int, default=6)
    parser.add_argument("--kv-blocks", type=int, default=160)
    parser.add_argument("--max-num-seqs", type=int, default=2)
    parser.add_argument("--pause-scale", type=float, default=0.3)
    parser.add_argument("--host-pool-blocks", type=int, default=256)
    parser.add_argument("--step-s", type=float, default=0.0, help="step time per engine step; 0: real time")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    shape = ["--workload", args.workload, "--programs", str(args.programs), "--max-calls", str(args.max_calls),
             "--kv-blocks", str(args.kv_blocks), "--max-num-seqs", str(args.max_num_seqs),
             "--pause-scale", str(args.pause_scale), "--host-pool-blocks", str(args.host_pool_blocks),
             "--step-s", str(args.step_s)]
    configs = args.configs.split(",")
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for config in configs if r % 2 == 0 else configs[::-1]:
            result = scenario(shape + CONFIGS[config], args.timeout)
            row = {"round": r + 1, "config": config, **{k: result[k] for k in (
                "recomputed_prefix_tokens_per_program", "recomputed_prefix_tokens", "prefill_tokens",
                "cached_tokens", "calls", "steps", "preemptions", "mean_program_token_latency_ms", "elapsed_s")},
                "retention": result["retention"], "connector": result.get("connector")}
            rows.append(row)
            sys.stdout.write(json.dumps(row) + "\n")
            sys.stdout.flush()
    for config in configs:
        mine = [row for row in rows if row["config"] == config]
        sys.stdout.write(f"{config}: recomputed prefix tokens per program, median "
                         f"{statistics.median(r['recomputed_prefix_tokens_per_program'] for r in mine):.0f}; "
                         f"program token latency, median "
                         f"{statistics.median(r['mean_program_token_latency_ms'] for r in mine):.1f} ms\n")
    if args.out is not None:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
