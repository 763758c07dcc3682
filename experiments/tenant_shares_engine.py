"""A tenant's lone agent beside another tenant's swarm, on the real CPU engine (and the same in the simulator).

One engine with Autellix's scheduler at the benchmark's settings for multi-agent programs
(``autellix bench sweep``'s ``autellix`` system on the ``fanout`` settings: 8 slots), the gateway in
front of it with two tenants' keys (``--api-keys-file``; weights 1). Each round runs, in an order
rotated every round and with the engine's prefix cache emptied before each run:

* ``baseline``: tenant ``lone``'s multi-agent program and tenant ``swarm``'s one program like it;
* ``shares``: the same lone program and tenant ``swarm``'s N fresh ``bfcl`` programs arriving after it;
* ``one-tenant``: the same programs, all calling with ``lone``'s key: no shares between them;
* ``lone-first`` (with ``--bound``): the ``shares`` programs with the lone program calling as tenant
  ``first``, of weight a million: the most any share could do for it, what is left being the batch the
  swarm keeps full;
* ``alone`` and ``alone-half`` (with ``--bound --simulate``): the lone program alone on the engine, and
  alone on half its slots: what its share of the slots costs it without another tenant's full batch.

Reported per run: the lone program's latency (arrival to finish), the swarm's mean program token
latency, the throughput (tokens per second until nine tenths were generated); per round the lone
program's latency over the baseline's. ``--simulate`` runs the same cases in the simulator on this
engine's profile (``EngineSettings.sim_profile``) instead, seeds 1-3.

    .venv/bin/python experiments/tenant_shares_engine.py --rounds 3 --out bench-results/tenant-shares-engine.json
    .venv/bin/python experiments/tenant_shares_engine.py --simulate
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import secrets
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autellix.engine.launch import SERVED_MODEL
from autellix.engine.tiny_model import REPLY_TOKEN_IDS
from autellix.loadgen.runner import run_programs
from autellix.loadgen.stack_sweep import ENGINE_SETTINGS, empty_prefix_cache, local_stack
from autellix.sim.serving import simulate_programs
from autellix.workloads import AgentProgram, make_programs
from autellix.workloads.run_metrics import RunResult, steady_throughput
from autellix.workloads.systems import SYSTEMS

CASES = ("baseline", "shares", "one-tenant")
#: With ``--bound``: the lone program's tenant (``first``) outweighs the swarm's a million to one.
BOUND_CASE = "lone-first"
FIRST_WEIGHT = 1_000_000
#: With ``--bound --simulate``: the lone program alone, on the engine's slots and on half of them.
ALONE_CASES = ("alone", "alone-half")
SETTINGS = ENGINE_SETTINGS["fanout"]


def programs_of(case: str, seed: int, swarm: int) -> tuple[AgentProgram, list[AgentProgram]]:
    """The lone program, and every program of the case with its tenant."""
    lone, peer = make_programs("multiagent", 2, seed=seed)
    if case in ALONE_CASES:
        return lone, [dataclasses.replace(lone, tenant="lone")]
    others = [peer] if case == "baseline" else make_programs("bfcl", swarm, seed=seed)
    theirs = "lone" if case == "one-tenant" else "swarm"
    mine = "first" if case == BOUND_CASE else "lone"
    return lone, [dataclasses.replace(lone, tenant=mine)] + [dataclasses.replace(p, tenant=theirs) for p in others]


def measured(run: RunResult, lone: AgentProgram) -> dict[str, Any]:
    stat = next(p for p in run.programs if p.program_id == lone.program_id)
    swarm = [p.token_latency for p in run.programs if p.program_id != lone.program_id and p.error is None]
    return {"lone_latency": stat.finish - stat.arrival, "lone_error": stat.error,
            "swarm_mean_token_latency": statistics.fmean(swarm) if swarm else None,
            "throughput": steady_throughput(run), "errors": sum(p.error is not None for p in run.programs)}


def rounds_of(count: int, run_case: Callable[[str, int], dict[str, Any]], seed: int,
              draw_per_round: bool, cases: tuple[str, ...] = CASES) -> list[dict[str, Any]]:
    rounds = []
    for number in range(count):
        draw = seed + (number if draw_per_round else 0)
        turn = number % len(cases)
        order = list(cases[turn:] + cases[:turn])
        results = {case: run_case(case, draw) for case in order}
        base = results["baseline"]["lone_latency"]
        rounds.append({"seed": draw, "order": order, "results": results,
                       **{f"lone_{case}_over_baseline": results[case]["lone_latency"] / base
                          for case in cases if case != "baseline"},
                       "throughput_shares_over_one_tenant":
                           results["shares"]["throughput"] / results["one-tenant"]["throughput"]})
        print(json.dumps(rounds[-1], default=str), file=sys.stderr, flush=True)
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--swarm", type=int, default=100, help="the swarm's programs")
    parser.add_argument("--rate", type=float, default=10.0, help="program arrivals per second (Poisson)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--draw-per-round", action="store_true", help="round n runs the programs of seed + n")
    parser.add_argument("--simulate", action="store_true", help="in the simulator, on this engine's profile")
    parser.add_argument("--bound", action="store_true",
                        help=f"also run {BOUND_CASE!r}: the lone program's tenant of weight a million")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here too")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the stack below is stopped
    system = SYSTEMS["autellix"]
    config = SETTINGS.config_for(system)
    cases = (*CASES, BOUND_CASE) if args.bound else CASES
    if args.bound and args.simulate:
        cases = (*cases, *ALONE_CASES)
    weights = {"lone": 1.0, "swarm": 1.0, "first": float(FIRST_WEIGHT)}

    if args.simulate:
        def simulated(case: str, seed: int) -> dict[str, Any]:
            lone, programs = programs_of(case, seed, args.swarm)
            profile = SETTINGS.sim_profile()
            if case == "alone-half":
                profile = profile.with_overrides(max_num_seqs=profile.max_num_seqs // 2)
            run = simulate_programs(programs, profile=profile, system=system, rate=args.rate,
                                    seed=seed, config=config, tenant_weights=weights)
            return measured(run.result, lone)

        rounds = rounds_of(args.rounds, simulated, args.seed, draw_per_round=True, cases=cases)
    else:
        logs = Path(tempfile.mkdtemp(prefix="autellix-tenant-shares-"))
        keys = {tenant: secrets.token_hex(24) for tenant in weights}
        (logs / "keys").write_text("".join(f"{tenant} {key}\n" for tenant, key in keys.items())
                                   + f"first weight={FIRST_WEIGHT}\n")
        print(f"logs in {logs}", file=sys.stderr)
        with local_stack(system, SETTINGS, logs, resettable=True,
                         gateway_args=["--api-keys-file", str(logs / "keys")]) as (target, engine, _):
            def on_engine(case: str, seed: int) -> dict[str, Any]:
                empty_prefix_cache(engine)
                lone, programs = programs_of(case, seed, args.swarm)
                run = asyncio.run(run_programs(target, programs, rate=args.rate, seed=seed, model=SERVED_MODEL,
                                               engines=[engine], sessions=True, reply_tokens=REPLY_TOKEN_IDS,
                                               tenant_keys=keys))
                return measured(run, lone)

            rounds = rounds_of(args.rounds, on_engine, args.seed, args.draw_per_round, cases)
    ratios = [k for k in rounds[0] if "_over_" in k]
    report = {"where": "simulator" if args.simulate else "cpu engine", "swarm": args.swarm, "rate": args.rate,
              "engine": {"max_num_seqs": SETTINGS.max_num_seqs, "args": list(SETTINGS.args)},
              "scheduler": config.to_mapping(), "rounds": rounds,
              "summary": {k: {"geomean": statistics.geometric_mean(r[k] for r in rounds),
                              "min": min(r[k] for r in rounds), "max": max(r[k] for r in rounds)} for k in ratios}}
    text = json.dumps(report, indent=2, default=str)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(json.dumps(report["summary"], indent=2))


if __name__ == "__main__":
    main()
