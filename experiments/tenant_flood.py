"""One tenant floods at 10x its limit while another runs agent programs: is the other one hurt?

Starts ``autellix emulate`` (modelled engines behind vLLM's HTTP API, real time)
and ``autellix gateway`` with two tenants' keys and per-tenant limits, then:

1. alone: tenant ``bench`` runs ``--programs`` sharegpt programs (Poisson, ``--rate``);
2. flooded: the same programs, while tenant ``flood`` keeps ``10 x --flood-limit``
   calls in flight against a limit of ``--flood-limit`` concurrent calls (no queue),
   retrying at once whatever ``Retry-After`` says.

Reports ``bench``'s mean program token latency in both runs (target: flooded
within 1.2x of alone), and the flooder's answers: how many 429s, and whether
each carried ``Retry-After``.

    .venv/bin/python experiments/tenant_flood.py [--programs 40] [--rate 1.0] [--flood-limit 2]

A benchmark, not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from autellix.child_processes import gateway_process
from autellix.loadgen.runner import run_programs
from autellix.sim.emulator import emulator_process
from autellix.workloads import make_programs

MODEL = "emulated"
BENCH_KEY, FLOOD_KEY = "bench-" + "b" * 26, "flood-" + "f" * 26


async def flood(base: str, workers: int, stop: asyncio.Event, seen: Counter) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "flood"}], "max_tokens": 32}
    headers = {"Authorization": f"Bearer {FLOOD_KEY}"}

    async def worker(http: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            async with http.post(base + "/v1/chat/completions", json=body, headers=headers) as r:
                await r.read()
                seen[r.status] += 1
                if r.status == 429:
                    seen["429_with_retry_after"] += "Retry-After" in r.headers
                    await asyncio.sleep(0.01)  # a flooder ignores Retry-After

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(worker(http) for _ in range(workers)))


async def bench_run(base: str, args: argparse.Namespace, flooding: bool) -> dict[str, Any]:
    programs = make_programs("sharegpt", args.programs, seed=args.seed)
    stop, seen = asyncio.Event(), Counter()
    flooder = asyncio.ensure_future(flood(base, 10 * args.flood_limit, stop, seen)) if flooding else None
    try:
        if flooder is not None:
            await asyncio.sleep(2.0)  # the flood is on before the first program
        result = await run_programs(base, programs, rate=args.rate, seed=args.seed, model=MODEL, api_key=BENCH_KEY)
    finally:
        stop.set()
        if flooder is not None:
            await flooder
    done = [p for p in result.programs if p.error is None]
    return {"mean_token_latency_s": statistics.fmean(p.token_latency for p in done),
            "completed": len(done), "failed": len(result.programs) - len(done),
            "flooder_answers": {str(k): v for k, v in seen.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=40)
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--flood-limit", type=int, default=2, help="the flooder's concurrent-call limit")
    parser.add_argument("--profile", default="a100-llama3.1-8b")
    parser.add_argument("--time-scale", type=float, default=1.0)
    args = parser.parse_args()
    keys = Path(tempfile.mkdtemp(prefix="autellix-flood-")) / "keys"
    keys.write_text(f"bench {BENCH_KEY}\nflood {FLOOD_KEY}\n")
    with emulator_process(1, "--profile", args.profile, "--time-scale", str(args.time_scale),
                          "--model", MODEL) as engines, \
            gateway_process(engines, "--api-keys-file", str(keys),
                            "--tenant-max-concurrent", str(args.flood_limit), "--tenant-max-queued", "0",
                            "--tenant-concurrency", "bench=1000") as base:  # the benchmark's own tenant: no bound
        alone = asyncio.run(bench_run(base, args, flooding=False))
        flooded = asyncio.run(bench_run(base, args, flooding=True))
    answers = flooded["flooder_answers"]
    report = {"settings": vars(args), "alone": alone, "flooded": flooded,
              "latency_ratio": flooded["mean_token_latency_s"] / alone["mean_token_latency_s"],
              "flooder_429s": answers.get("429", 0),
              "every_429_had_retry_after": answers.get("429", 0) == answers.get("429_with_retry_after", 0)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
