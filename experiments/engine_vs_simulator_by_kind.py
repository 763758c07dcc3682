"""The real CPU engine against the simulator, by kind of program and call.

    .venv/bin/python experiments/engine_vs_simulator_by_kind.py --workload mixed --rate 1.8 --seed 3 \
        --systems client-plas,autellix [--programs N] [--out DIR]

Runs each system on a fresh local stack (the workload's engine settings,
``autellix.loadgen.stack_sweep.ENGINE_SETTINGS``, cores isolated), then the same
programs and arrivals in the simulator on the settings' profile
(``EngineSettings.sim_profile``) with the same slots, token budget and
scheduler settings, and prints, per kind of program (``mixed`` holds
sharegpt, bfcl, lats and multi-agent programs): program token latency, and
per call the latency, vLLM's queue time, the time from first scheduled to
done, and the prompt and output tokens, real against simulated.
``autellix sim fidelity`` compares whole runs; this says which programs and
which part of a call the simulator gets wrong. Results in docs/simulation.md
("Fidelity"); about four minutes a system.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import autellix.loadgen.stack_sweep as sweep
from autellix.core import SchedulerConfig
from autellix.engine.launch import SERVED_MODEL
from autellix.engine.tiny_model import REPLY_TOKEN_IDS
from autellix.loadgen.runner import run_programs
from autellix.sim.serving import simulate_programs
from autellix.workloads import make_programs
from autellix.workloads.run_metrics import RunResult
from autellix.workloads.systems import SYSTEMS


def by_kind(result: RunResult) -> dict[str, dict[str, float]]:
    """Means per kind of program: token latency, and per call latency, queue, in-engine time and tokens."""
    kind = {p.program_id: p.workload for p in result.programs}
    out: dict[str, dict[str, float]] = {}
    for name in sorted(set(kind.values())):
        programs = [p for p in result.programs if p.workload == name]
        calls = [c for c in result.calls if kind[c.program_id] == name]
        latency = [c.finished - c.submitted for c in calls]
        queue = [c.queue_s or 0.0 for c in calls]
        out[name] = {
            "programs": len(programs), "calls": len(calls),
            "token_latency_ms": 1e3 * statistics.mean(p.token_latency for p in programs),
            "call_latency_s": statistics.mean(latency), "queue_s": statistics.mean(queue),
            "in_engine_s": statistics.mean(latency) - statistics.mean(queue),
            # latency outside vLLM's engine core: client, gateway, API server (0 when simulated)
            "transport_s": statistics.mean(c.finished - c.submitted - (c.engine_s or 0.0) for c in calls)
            if all(c.engine_s is not None for c in calls) else 0.0,
            "prompt_tokens": statistics.mean(c.prompt_tokens for c in calls),
            "output_tokens": statistics.mean(c.completion_tokens for c in calls),
        }
    return out


def real_run(workload: str, rate: float, seed: int, system: str, count: int) -> RunResult:
    settings = sweep.ENGINE_SETTINGS[workload]
    with sweep.local_stack(SYSTEMS[system], settings, Path(tempfile.mkdtemp(prefix="autellix-fidelity-")),
                           isolate_cores=True) as (target, engine, _split):
        programs = make_programs(workload, count, seed=seed)
        return asyncio.run(run_programs(target, programs, rate=rate, seed=seed, model=SERVED_MODEL, engines=[engine],
                                        stream=False, client_priority=SYSTEMS[system].client_priority,
                                        reply_tokens=REPLY_TOKEN_IDS))


def simulated_run(workload: str, rate: float, seed: int, system: str, count: int) -> RunResult:
    settings = sweep.ENGINE_SETTINGS[workload]
    profile = settings.sim_profile()
    programs = make_programs(workload, count, seed=seed)
    return simulate_programs(programs, profile=profile, system=system, rate=rate, seed=seed,
                             config=settings.scheduler or SchedulerConfig()).result


def compare(workload: str, rate: float, seed: int, systems: Sequence[str],
            programs: int | None = None) -> dict[str, Any]:
    """``programs``: how many (default: the workload's at this rate, as the sweep runs)."""
    count = programs or sweep.ENGINE_SETTINGS[workload].programs_at(rate)
    report: dict[str, Any] = {"workload": workload, "rate": rate, "seed": seed, "programs": count, "systems": {}}
    for system in systems:
        report["systems"][system] = {"real": by_kind(real_run(workload, rate, seed, system, count)),
                                     "simulated": by_kind(simulated_run(workload, rate, seed, system, count))}
    return report


def print_report(report: dict[str, Any]) -> None:
    fields = (("token_latency_ms", "program ms/token", 1), ("call_latency_s", "call s", 2), ("queue_s", "queue s", 2),
              ("in_engine_s", "in engine s", 3), ("transport_s", "transport s", 3), ("prompt_tokens", "prompt", 0),
              ("output_tokens", "output", 0))
    for system, runs in report["systems"].items():
        print(f"{system} (real / simulated)")
        for kind, real in runs["real"].items():
            sim = runs["simulated"][kind]
            cells = [f"{label} {real[key]:.{digits}f} / {sim[key]:.{digits}f}" for key, label, digits in fields]
            print(f"  {kind:10} {real['calls']:5} calls  " + "  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="mixed", choices=sorted(sweep.ENGINE_SETTINGS))
    parser.add_argument("--rate", type=float, default=1.8)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--systems", default="client-plas,autellix")
    parser.add_argument("--programs", type=int, default=None, help="programs in the run (default: the sweep's)")
    parser.add_argument("--out", type=Path, default=None, help="write the report as DIR/fidelity-<workload>.json")
    args = parser.parse_args()
    report = compare(args.workload, args.rate, args.seed, args.systems.split(","), args.programs)
    print_report(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"fidelity-{args.workload}.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
