"""Do agent programs run as fast through the endpoint picker as through the aiohttp gateway?

One engine with Autellix's scheduler at the benchmark's settings for the workload
(``autellix bench sweep``'s ``autellix`` system: ``autellix.loadgen.stack_sweep``),
and in front of it both transports at once, with the same policy and parameters:
``autellix gateway``, as the sweep runs it, and Envoy as a GIE gateway
(``autellix_lab.gie_envoy``: ext_proc, full-duplex bodies, ``ORIGINAL_DST``)
with ``autellix epp`` as its endpoint picker. Each round runs the same programs
and arrivals through each transport in turn (the order rotated every round, the
engine's prefix cache emptied before each run) as ``autellix bench`` runs them:
each program opens its session (through Envoy the picker answers the session
routes), its calls carry the session and thread headers, whole calls, replies
of printable ASCII.

Reports each run's mean and P99 program token latency (the benchmark's metric)
and mean program latency (arrival to last answer), and per round the picker's
over the gateway's. The question's bar: the picker's mean within 1.1x.

Run on a quiet machine: ``.venv/bin/python experiments/picker_vs_gateway_programs.py --workload mixed
--rate 0.5 --rounds 5 --out bench-results/picker-vs-gateway.json``; smoke: ``--programs 2 --rounds 1``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from autellix.child_processes import free_ports
from autellix.engine.launch import SERVED_MODEL
from autellix.engine.tiny_model import REPLY_TOKEN_IDS, build_tiny_model, default_model_dir
from autellix.loadgen.runner import run_programs
from autellix.loadgen.stack_sweep import ENGINE_SETTINGS, empty_prefix_cache, local_stack
from autellix.workloads import make_programs
from autellix.workloads.run_metrics import RunResult, summarize
from autellix.workloads.systems import SYSTEMS
from autellix_lab.epp_local import LocalGie, PickerProcess
from autellix_lab.gie_envoy import GatewayListener


def run_summary(run: RunResult) -> dict[str, Any]:
    done = [p for p in run.programs if p.error is None]
    keep = ("programs", "completed", "failed", "errors", "calls", "mean_token_latency", "p99_token_latency",
            "prefix_cache_hit_rate", "preemptions")
    summary = {k: v for k, v in summarize(run).items() if k in keep}
    summary["mean_program_latency"] = statistics.fmean(p.finish - p.arrival for p in done) if done else None
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="mixed", choices=sorted(ENGINE_SETTINGS))
    parser.add_argument("--rate", type=float, default=0.5, help="program arrivals per second (Poisson)")
    parser.add_argument("--programs", type=int, default=None, help="programs per run (default: the sweep's)")
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each transport, interleaved")
    parser.add_argument("--draw-per-round", action="store_true", help="round n runs the programs of seed + n")
    parser.add_argument("--calibration", default="paper")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here too")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the stacks below are stopped

    system, settings = SYSTEMS["autellix"], ENGINE_SETTINGS[args.workload]
    config = settings.config_for(system)
    count = args.programs or settings.programs_at(args.rate)
    tokenizer = build_tiny_model(default_model_dir()) / "tokenizer.json"
    logs = Path(tempfile.mkdtemp(prefix="autellix-picker-vs-gateway-"))
    print(f"logs in {logs}", file=sys.stderr)
    rounds: list[dict[str, Any]] = []
    with local_stack(system, settings, logs, resettable=True) as (gateway_url, engine_url, _):
        picker = PickerProcess([engine_url], ["--policy", str(system.policy), "--tokenizer", str(tokenizer)],
                               env=config.to_env(), log_path=logs / "epp.log")
        (port,) = free_ports(1)
        with LocalGie(picker, [GatewayListener(port)], workdir=logs / "envoy").running() as gie:
            targets = {"gateway": gateway_url, "picker": gie.urls()[0]}
            for number in range(args.rounds):
                seed = args.seed + (number if args.draw_per_round else 0)
                names = list(targets)[number % 2:] + list(targets)[:number % 2]
                results: dict[str, Any] = {}
                for name in names:
                    empty_prefix_cache(engine_url)
                    batch = make_programs(args.workload, count, seed=seed, calibration=args.calibration)
                    run = asyncio.run(run_programs(targets[name], batch, rate=args.rate, seed=seed,
                                                   model=SERVED_MODEL, engines=[engine_url], sessions=True,
                                                   reply_tokens=REPLY_TOKEN_IDS))
                    results[name] = run_summary(run)
                    print(f"round {number + 1} {name}: mean token latency "
                          f"{results[name]['mean_token_latency']:.4f} s, mean program latency "
                          f"{results[name]['mean_program_latency']:.1f} s, {results[name]['completed']}/{count} done",
                          file=sys.stderr, flush=True)
                ratios = {f"{k}_picker_over_gateway": results["picker"][k] / results["gateway"][k]
                          for k in ("mean_token_latency", "p99_token_latency", "mean_program_latency")
                          if results["picker"][k] and results["gateway"][k]}
                rounds.append({"seed": seed, "order": names, "results": results, **ratios})
    geomean = statistics.geometric_mean
    report = {"workload": args.workload, "rate": args.rate, "programs": count, "seed": args.seed,
              "engine": {"max_num_seqs": settings.max_num_seqs, "args": list(settings.args)},
              "scheduler": config.to_mapping(), "rounds": rounds,
              "geomean": {k: geomean(r[k] for r in rounds) for k in rounds[0] if k.endswith("_over_gateway")}}
    text = json.dumps(report, indent=2, default=str)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    print(f"the picker's mean token latency over the gateway's, geometric mean of {len(rounds)} round(s): "
          f"{report['geomean'].get('mean_token_latency_picker_over_gateway', float('nan')):.3f}x", file=sys.stderr)


if __name__ == "__main__":
    main()
