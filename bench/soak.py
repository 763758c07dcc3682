"""Soak: the gateway under steady load with session churn and disconnecting clients.

Starts ``autellix emulate`` (one modelled engine, real time) and ``autellix
gateway`` (its own process, so its memory can be read), then runs
``--workers`` closed-loop clients for ``--minutes``: each opens a session
(or uses an implicit one, or none), makes 1 to 4 streamed calls, hangs up on a
fifth of them after the first chunk, and ends the session, or abandons it
(a tenth) for the idle expiry (``AUTELLIX_PROGRAM_IDLE_TTL``, 20 s here) to
collect. Every 10 s it samples the gateway's RSS (``/proc``) and its process
table (``autellix_live_programs``). At the end, after the load stops and the
idle TTL passes: calls still ``running`` in ``/admin/calls`` (stuck) and
engines' in-flight counts.

    .venv/bin/python bench/soak.py [--minutes 10] [--workers 12]

Targets (issue 18): RSS growth under 5% after warm-up (the first 2 minutes),
process table bounded, no stuck calls. Pick ``--workers`` near 80% of the
emulated engine's capacity (with the A100 profile, 12 streaming clients keep
it busy most of the time without a growing queue).
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


async def client(base: str, stop: asyncio.Event, rng: random.Random, counts: dict[str, int]) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        while not stop.is_set():
            kind = rng.random()
            headers: dict[str, str] = {}
            session = None
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
                try:
                    async with http.post(base + "/v1/chat/completions", json=body, headers=headers) as r:
                        async for _ in r.content:
                            if hang_up:
                                break  # leaving the context closes the connection mid-stream
                        counts[f"http_{r.status}"] = counts.get(f"http_{r.status}", 0) + 1
                        counts["hung_up" if hang_up else "read_all"] = counts.get(
                            "hung_up" if hang_up else "read_all", 0) + 1
                except (aiohttp.ClientError, TimeoutError) as exc:
                    counts[type(exc).__name__] = counts.get(type(exc).__name__, 0) + 1
            if session is not None and rng.random() > 0.1:  # a tenth are abandoned: the idle expiry collects them
                async with http.delete(f"{base}/v1/sessions/{session}") as r:
                    await r.read()


async def soak(base: str, admin: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    stop, counts = asyncio.Event(), {}
    rng = random.Random(args.seed)
    workers = [asyncio.ensure_future(client(base, stop, random.Random(rng.random()), counts))
               for _ in range(args.workers)]
    samples = []
    started = time.monotonic()
    while time.monotonic() - started < args.minutes * 60:
        await asyncio.sleep(10)
        samples.append({"t": round(time.monotonic() - started), "rss_kib": rss_kib(pid),
                        "live_programs": live_programs(base)})
    stop.set()
    await asyncio.gather(*workers)
    await asyncio.sleep(IDLE_TTL + 12)  # abandoned sessions expire (the janitor runs every ttl/4)
    async with aiohttp.ClientSession() as http:
        async with http.get(admin + "/admin/calls?limit=1000") as r:
            calls = (await r.json())["data"]
        async with http.get(admin + "/admin/engines") as r:
            engines = (await r.json())["data"]
    warm = [s["rss_kib"] for s in samples if s["t"] >= args.warmup * 60]
    return {"settings": vars(args), "answers": counts, "samples": samples,
            "rss_growth_after_warmup": (warm[-1] - warm[0]) / warm[0] if len(warm) > 1 else None,
            "rss_kib_max": max(s["rss_kib"] for s in samples),
            "live_programs_max": max(s["live_programs"] for s in samples),
            "live_programs_after": live_programs(base),
            "stuck_calls": sum(c["result"] == "running" for c in calls),
            "engine_inflight_after": [e["inflight"] for e in engines]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0, help="minutes before RSS growth is measured")
    parser.add_argument("--workers", type=int, default=12)
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
