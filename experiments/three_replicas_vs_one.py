"""Program latency through three gateway replicas behind Envoy against one gateway, at the same load.

The question: does program latency with three replicas stay within noise of one
replica at the same load? Both stacks stand in front of the same local vLLM
engines (tiny model, Autellix's scheduler) for the whole run:

* **one**: ``autellix gateway`` alone (the embedded default, programs in memory);
* **three**: Envoy, the xDS control plane and three replicas on a local Redis
  (``autellix.mesh.local``, what ``autellix up --gateways 3`` runs).

Each repetition runs the same programs (``--workload``, ``--programs`` at
``--rate``, Poisson arrivals, fresh sessions) through one stack and then the
other, the order alternating between repetitions, so drift on a shared machine
hits both alike. Reported: mean and P99 program token latency per run, and the
ratio three/one per repetition with its spread. Run:
``.venv/bin/python experiments/three_replicas_vs_one.py [--repetitions 3] [--format json]``.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from autellix.child_processes import free_port, free_ports, gateway_process
from autellix.engine.launch import SERVED_MODEL, start_engine, stop_engine, wait_ready
from autellix.engine.tiny_model import REPLY_TOKEN_IDS, build_tiny_model, default_model_dir
from autellix.loadgen.runner import run_programs
from autellix.loadgen.stack_sweep import ENGINE_SETTINGS
from autellix.mesh.local import LocalMesh, LocalRedis
from autellix.mesh.resources import MeshSettings
from autellix.workloads import make_programs
from autellix.workloads.run_metrics import summarize


def run_once(target: str, engines: list[str], args: argparse.Namespace, seed: int) -> dict[str, Any]:
    programs = make_programs(args.workload, args.programs, seed=seed)
    run = asyncio.run(run_programs(target, programs, rate=args.rate, seed=seed, model=SERVED_MODEL,
                                   engines=engines, stream=False, reply_tokens=REPLY_TOKEN_IDS))
    summary = summarize(run)
    return {k: summary[k] for k in ("completed", "failed", "errors", "calls", "mean_token_latency",
                                    "p99_token_latency", "programs_per_s")}


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", type=int, default=2, help="local vLLM engines (tiny model)")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--workload", default="sharegpt")
    parser.add_argument("--programs", type=int, default=30)
    parser.add_argument("--rate", type=float, default=1.5, help="program arrivals per second")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--format", choices=["table", "json"], default="table")
    args = parser.parse_args()
    settings = ENGINE_SETTINGS[args.workload]
    log_dir = Path(tempfile.mkdtemp(prefix="replica-latency-"))
    tokenizer = build_tiny_model(default_model_dir()) / "tokenizer.json"
    gateway_args = ["--tokenizer", str(tokenizer)]

    with contextlib.ExitStack() as stack:
        engines = [start_engine(port, log_dir=log_dir, max_num_seqs=settings.max_num_seqs,
                                extra_args=list(settings.args)) for port in free_ports(args.engines)]
        for engine in engines:
            stack.callback(stop_engine, engine)
        print(f"starting {args.engines} engine(s) (logs: {log_dir}) ...", file=sys.stderr)
        wait_ready(engines, timeout=600)
        urls = [e.url for e in engines]
        one = stack.enter_context(gateway_process(urls, *gateway_args, log_path=log_dir / "gateway-one.log"))
        store = stack.enter_context(LocalRedis(log_dir / "redis.log"))
        mesh = stack.enter_context(LocalMesh(urls, args.replicas, settings=MeshSettings(listen_port=free_port()),
                                             gateway_args=gateway_args, log_dir=log_dir / "mesh",
                                             store_url=store.url))
        mesh.wait_routable({g.endpoint.address for g in mesh.gateways}, timeout=60)
        targets = {"one": one, "three": mesh.url}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
        for rep in range(args.repetitions):
            order = list(targets) if rep % 2 == 0 else list(reversed(targets))
            for name in order:
                result = run_once(targets[name], urls, args, args.seed + rep)
                runs[name].append(result)
                print(f"rep {rep + 1} {name}: mean {1000 * result['mean_token_latency']:.2f} ms/token, "
                      f"p99 {1000 * result['p99_token_latency']:.2f}, {result['completed']}/{args.programs} done",
                      file=sys.stderr)

    ratios = {metric: [t[metric] / o[metric] for o, t in zip(runs["one"], runs["three"], strict=True)]
              for metric in ("mean_token_latency", "p99_token_latency")}
    report = {"workload": args.workload, "programs": args.programs, "rate": args.rate, "engines": args.engines,
              "replicas": args.replicas, "max_num_seqs": settings.max_num_seqs, "runs": runs,
              "three_over_one": {metric: {"per_repetition": values, **spread(values)}
                                 for metric, values in ratios.items()}}
    if args.format == "json":
        print(json.dumps(report, indent=2))
        return
    for metric, r in report["three_over_one"].items():
        print(f"{metric}: three/one = {r['mean']:.3f} (min {r['min']:.3f}, max {r['max']:.3f}) over "
              f"{args.repetitions} repetitions: {', '.join(f'{v:.3f}' for v in r['per_repetition'])}")


if __name__ == "__main__":
    main()
