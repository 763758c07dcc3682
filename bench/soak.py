"""Soak: the gateway under steady load with session churn and disconnecting clients.

Starts ``autellix emulate`` (one modelled engine, real time) and ``autellix
gateway`` (its own process, so its memory can be read). Each *program* opens a
session (60%), uses an implicit one (20%) or none (20%), makes 1 to 4 streamed
calls, hangs up on a fifth of them after the first chunk, and ends its
session, or abandons it (a tenth) for the idle expiry
(``AUTELLIX_PROGRAM_IDLE_TTL``, 20 s here) to collect.

Load: about 80% of what the gateway and engine sustain. First a calibration:
for each level of ``--calibration-workers`` (24, then 48), that many
closed-loop clients run programs back to back for ``--calibrate`` seconds (25;
the first 5 are a ramp) and the calls completed per second are counted; the
most any level completed (two levels: whether doubling the clients still added
throughput shows) is the sustainable rate, divided by the 2.5 calls of a mean
program. Then programs arrive open-loop (Poisson) at ``--load`` (0.8) times
that rate for ``--minutes`` (10); ``--rate`` (programs per second) skips the
calibration.
Every 10 s the script samples the gateway's RSS (``/proc``), its process table
(``autellix_live_programs``) and the programs in flight. At the end, after the
load stops and the idle TTL passes: calls still ``running`` in
``/admin/calls`` (stuck), engines' in-flight counts and the table's size.

    .venv/bin/python bench/soak.py [--minutes 10] [--load 0.8] [--rate R]

Targets (issue 18): RSS growth under 5% after warm-up (the first 2 minutes),
process table bounded, no stuck calls. The gateway keeps ended session ids and
counted program keys for the idle TTL (``autellix.control.recent``), so with
20 s here those reach their steady size well within the warm-up. The last run
and its figures: docs/gateway.md ("Soak").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from autellix.child_processes import free_ports
from autellix.sim.emulator import emulator_process

MODEL = "emulated"
IDLE_TTL = 20
#: Programs in flight beyond which an arrival is dropped (counted): a load the system cannot
#: sustain shows as a growing in-flight count up to here, not as a client process without bound.
MAX_PROGRAMS_IN_FLIGHT = 2000
#: Calls a program makes on average (1 to 4, uniform).
CALLS_PER_PROGRAM = 2.5


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def live_programs(base: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("autellix_live_programs "):
                return float(line.split()[1])
    return -1.0


async def program(http: aiohttp.ClientSession, base: str, rng: random.Random, counts: dict[str, int]) -> None:
    """One program: a session (or an implicit one, or none), 1 to 4 streamed calls, then it ends."""

    def count(name: str) -> None:
        counts[name] = counts.get(name, 0) + 1

    kind = rng.random()
    headers: dict[str, str] = {}
    session = None
    try:
        if kind < 0.6:
            async with http.post(base + "/v1/sessions") as r:
                session = (await r.json())["id"]
            headers["X-Autellix-Session"] = session
        elif kind < 0.8:
            headers["x-session-id"] = f"implicit-{rng.getrandbits(48):x}"
        for _ in range(rng.randint(1, 4)):
            body = {"model": MODEL, "stream": True, "max_tokens": rng.randint(16, 128),
                    "messages": [{"role": "user", "content": "soak " * rng.randint(5, 200)}]}
            hang_up = rng.random() < 0.2
            async with http.post(base + "/v1/chat/completions", json=body, headers=headers) as r:
                async for _ in r.content:
                    if hang_up:
                        break  # leaving the context closes the connection mid-stream
                count(f"http_{r.status}")
                count("hung_up" if hang_up else "read_all")
        if session is not None and rng.random() > 0.1:  # a tenth are abandoned: the idle expiry collects them
            async with http.delete(f"{base}/v1/sessions/{session}") as r:
                await r.read()
        count("programs_done")
    except (aiohttp.ClientError, TimeoutError) as exc:
        count(type(exc).__name__)


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=300))


async def calibrate(base: str, args: argparse.Namespace) -> dict[int, float]:
    """Calls per second that closed-loop clients complete, for each of ``--calibration-workers``
    (clients running programs back to back; the first 5 s of each level are its ramp)."""
    rng = random.Random(args.seed + 1)
    throughput = {}
    async with _session() as http:
        for level in args.calibration_workers:
            stop, counts = asyncio.Event(), {}

            async def worker(seed: float, stop: asyncio.Event = stop, counts: dict[str, int] = counts) -> None:
                worker_rng = random.Random(seed)
                while not stop.is_set():
                    await program(http, base, worker_rng, counts)

            workers = [asyncio.ensure_future(worker(rng.random())) for _ in range(level)]
            await asyncio.sleep(5)  # ramp: the engine's batch fills
            calls_before, began = counts.get("http_200", 0), time.monotonic()
            await asyncio.sleep(args.calibrate - 5)
            throughput[level] = (counts.get("http_200", 0) - calls_before) / (time.monotonic() - began)
            stop.set()
            await asyncio.gather(*workers)
    return throughput


async def soak(base: str, admin: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    calibration = await calibrate(base, args) if args.rate is None else {}
    # the sustainable rate: the most calls per second any level completed, in programs (2.5 calls each)
    sustainable = max(calibration.values()) / CALLS_PER_PROGRAM if calibration else None
    rate = args.rate if sustainable is None else args.load * sustainable
    await asyncio.sleep(IDLE_TTL + 12)  # the calibration's abandoned sessions expire before the soak starts
    counts: dict[str, int] = {}
    rng = random.Random(args.seed)
    running: set[asyncio.Future[None]] = set()
    samples = []
    started = time.monotonic()
    next_sample = started + 10
    async with _session() as http:
        while (now := time.monotonic()) - started < args.minutes * 60:
            if len(running) < MAX_PROGRAMS_IN_FLIGHT:
                task = asyncio.ensure_future(program(http, base, random.Random(rng.random()), counts))
                running.add(task)
                task.add_done_callback(running.discard)
            else:
                counts["arrivals_dropped"] = counts.get("arrivals_dropped", 0) + 1
            if now >= next_sample:
                next_sample += 10
                samples.append({"t": round(now - started), "rss_kib": rss_kib(pid),
                                "live_programs": live_programs(base), "programs_in_flight": len(running)})
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*running)
    await asyncio.sleep(IDLE_TTL + 12)  # abandoned sessions expire (the janitor runs every ttl/4)
    async with aiohttp.ClientSession() as http:
        async with http.get(admin + "/admin/calls?limit=1000") as r:
            calls = (await r.json())["data"]
        async with http.get(admin + "/admin/engines") as r:
            engines = (await r.json())["data"]
    warm = [s for s in samples if s["t"] >= args.warmup * 60]
    return {"settings": vars(args), "calibration_calls_per_s": calibration,
            "sustainable_programs_per_s": sustainable, "programs_per_s": rate,
            "answers": counts, "samples": samples,
            "rss_kib_at_warmup": warm[0]["rss_kib"] if warm else None,
            "rss_kib_at_end": warm[-1]["rss_kib"] if warm else None,
            "rss_growth_after_warmup": ((warm[-1]["rss_kib"] - warm[0]["rss_kib"]) / warm[0]["rss_kib"]
                                        if len(warm) > 1 else None),
            "rss_kib_max": max(s["rss_kib"] for s in samples),
            "live_programs_max": max(s["live_programs"] for s in samples),
            "programs_in_flight_max": max(s["programs_in_flight"] for s in samples),
            "live_programs_after": live_programs(base),
            "stuck_calls": sum(c["result"] == "running" for c in calls),
            "engine_inflight_after": [e["inflight"] for e in engines]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0, help="minutes before RSS growth is measured")
    parser.add_argument("--load", type=float, default=0.8, help="fraction of the calibrated sustainable rate")
    parser.add_argument("--rate", type=float, default=None, help="programs per second (skips the calibration)")
    parser.add_argument("--calibrate", type=float, default=25.0, help="seconds of each calibration level")
    parser.add_argument("--calibration-workers", type=lambda v: [int(x) for x in v.split(",")], default=[24, 48],
                        help="closed-loop clients of each calibration level, comma-separated")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", default="a100-llama3.1-8b")
    args = parser.parse_args()
    with emulator_process(1, "--profile", args.profile, "--model", MODEL) as engines:
        port, admin_port = free_ports(2)
        log = Path(tempfile.mkdtemp(prefix="autellix-soak-")) / "gateway.log"
        with log.open("wb") as out:
            gateway = subprocess.Popen([sys.executable, "-m", "autellix", "gateway", "--port", str(port),
                                        "--admin-port", str(admin_port), "--engine", engines[0]], stdout=out,
                                       stderr=subprocess.STDOUT,
                                       env={**os.environ, "AUTELLIX_PROGRAM_IDLE_TTL": str(IDLE_TTL)})
        base, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
        try:
            for _ in range(100):
                with contextlib.suppress(OSError), urllib.request.urlopen(base + "/ready", timeout=2) as r:
                    if r.status == 200:
                        break
                time.sleep(0.3)
            report = asyncio.run(soak(base, admin, gateway.pid, args))
        finally:
            gateway.terminate()
            gateway.wait(10)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
