"""Soak: the gateway under steady load with session churn and disconnecting clients.

Starts ``autellix emulate`` (one modelled engine, real time) and ``autellix
gateway`` (its own process, so its memory can be read). Each *program* opens a
session (60%), uses an implicit one (20%) or none (20%), makes 1 to 4 streamed
calls, hangs up on a fifth of them after the first chunk, and ends its
session, or abandons it (a tenth) for the idle expiry
(``AUTELLIX_PROGRAM_IDLE_TTL``, 20 s here) to collect.

Load: ``--load`` (0.8) times the saturation rate of this same setup (gateway,
engine, program mix, machine), measured first. Calibration: closed-loop clients
run programs back to back, ``--calibration-workers`` (32) of them, then twice
as many, and so on, each level for ``--calibrate`` seconds (25; the first 5 are
its ramp), counting the programs completed per second; once a doubling adds
less than 10% (or at ``--calibration-max-workers``, 512) the most any level
completed is the saturation rate (``calibration_saturated`` says whether the
10% rule stopped it; if not, the rate is a lower bound and the load at most
``--load``). Programs then arrive open-loop (Poisson, on an absolute schedule,
so a busy client catches up rather than slowing the rate) at that rate for
``--minutes`` (10); ``--rate`` (programs per second) skips the calibration.

Every 10 s a sampler (its own task: the arrivals never wait on it) reads the
gateway's RSS and CPU time (``/proc``), its process table
(``autellix_live_programs``) and the programs in flight. After
``--warmup`` minutes (3) the RSS growth is reported as a slope (least squares,
MiB per minute, over the whole window and its second half) and in % (the mean
RSS of the last minute against that of the first minute after warm-up: one
sample's noise does not decide it). At the end, after the load stops and the
idle TTL passes: the table's size (a program with a call still active never
expires, so 0 means none is stuck), calls still ``running`` in
``/admin/calls`` (the last 1,000), the engine's in-flight count, and the
programs the clients never saw end. ``--probe-trim`` starts the gateway with a
``SIGUSR2`` handler that calls glibc's ``malloc_trim(0)`` and reports the RSS
after it at the end: what the allocator held free versus what was live.
``--gateway-env NAME=VALUE`` (repeatable) runs the gateway with that
environment (``MALLOC_ARENA_MAX=2``, ``PYTHONMALLOC=malloc``, ...;
``AUTELLIX_HEAP_TRIM_S=0`` turns off the gateway's timed heap trim,
``autellix.gateway.heap``, as before it).

    .venv/bin/python experiments/soak.py [--minutes 10] [--load 0.8] [--rate R] [--probe-trim]

Targets: RSS growth under 5% after warm-up, process table bounded,
no stuck calls. The last runs and their figures: docs/gateway.md ("Soak").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
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
#: Seconds between two samples of the gateway.
SAMPLE_S = 10.0
#: Seconds at the start of each calibration level that are not counted (the engine's batch fills).
RAMP_S = 5.0
#: A doubling of the calibration's clients that adds less than this share of programs per
#: second: the setup is saturated.
SATURATION_GAIN = 0.10
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def gateway_boot(*, probe_trim: bool) -> str:
    """``python -c`` code that runs ``autellix`` (its arguments after it): with a SIGUSR2 handler that
    returns the allocator's free memory (``--probe-trim``)."""
    lines = ["import ctypes, signal, sys"]
    if probe_trim:
        lines += ["libc = ctypes.CDLL('libc.so.6')",
                  "signal.signal(signal.SIGUSR2, lambda *_: libc.malloc_trim(0))"]
    return "\n".join([*lines, "from autellix.cli import app", "app(prog_name='autellix', args=sys.argv[1:])"])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of the process (``/proc/PID/stat``, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def live_programs(http: aiohttp.ClientSession, base: str) -> float:
    """The gateway's ``autellix_live_programs``; -1 when it did not answer in time."""
    try:
        async with http.get(base + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
            for line in (await r.text()).splitlines():
                if line.startswith("autellix_live_programs "):
                    return float(line.split()[1])
    except (aiohttp.ClientError, TimeoutError):
        pass
    return -1.0


def count(counts: dict[str, int], name: str) -> None:
    counts[name] = counts.get(name, 0) + 1


async def program(http: aiohttp.ClientSession, base: str, rng: random.Random, counts: dict[str, int]) -> None:
    """One program: a session (or an implicit one, or none), 1 to 4 streamed calls, then it ends."""
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
                count(counts, f"http_{r.status}")
                count(counts, "hung_up" if hang_up else "read_all")
        if session is not None and rng.random() > 0.1:  # a tenth are abandoned: the idle expiry collects them
            async with http.delete(f"{base}/v1/sessions/{session}") as r:
                await r.read()
        count(counts, "programs_done")
    except (aiohttp.ClientError, TimeoutError) as exc:
        count(counts, type(exc).__name__)


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=300))


async def calibrate(base: str, pid: int, args: argparse.Namespace) -> tuple[list[dict[str, Any]], bool]:
    """Programs per second that closed-loop clients complete, doubling the clients until a doubling
    adds less than ``SATURATION_GAIN``; the levels, and whether that rule (saturation) stopped it."""
    rng = random.Random(args.seed + 1)
    levels: list[dict[str, Any]] = []
    best, workers = 0.0, args.calibration_workers
    async with _session() as http:
        while True:
            stop, counts = asyncio.Event(), {}

            async def worker(seed: float, stop: asyncio.Event = stop, counts: dict[str, int] = counts) -> None:
                worker_rng = random.Random(seed)
                while not stop.is_set():
                    await program(http, base, worker_rng, counts)

            tasks = [asyncio.ensure_future(worker(rng.random())) for _ in range(workers)]
            await asyncio.sleep(RAMP_S)
            done0, calls0, cpu0, began = counts.get("programs_done", 0), counts.get("http_200", 0), \
                cpu_seconds(pid), time.monotonic()
            await asyncio.sleep(args.calibrate - RAMP_S)
            elapsed = time.monotonic() - began
            rate = (counts.get("programs_done", 0) - done0) / elapsed
            levels.append({"workers": workers, "programs_per_s": round(rate, 2),
                           "calls_per_s": round((counts.get("http_200", 0) - calls0) / elapsed, 2),
                           "gateway_cpu": round((cpu_seconds(pid) - cpu0) / elapsed, 3),
                           "errors": sum(v for k, v in counts.items() if not k.startswith(("http_200", "hung_up",
                                                                                           "read_all", "programs")))})
            stop.set()
            await asyncio.gather(*tasks)
            saturated = bool(best) and rate < best * (1 + SATURATION_GAIN)
            best = max(best, rate)
            if saturated or workers * 2 > args.calibration_max_workers:
                return levels, saturated
            workers *= 2


def _fit(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (x, y) points; None under two points."""
    if len(points) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else None


def rss_growth(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    """The RSS after warm-up: slopes (MiB per minute) and growth in % (last minute's mean RSS
    against the first minute's after warm-up)."""
    after = [s for s in samples if s["t"] >= warmup_s]
    if len(after) < 2:
        return {"rss_growth_after_warmup_pct": None}
    points = [(s["t"] / 60, s["rss_kib"] / 1024) for s in after]
    end = after[-1]["t"]
    first = [s["rss_kib"] for s in after if s["t"] < after[0]["t"] + 60]
    last = [s["rss_kib"] for s in after if s["t"] > end - 60]
    half = [p for p in points if p[0] >= (after[0]["t"] + end) / 120]
    first_mean, last_mean = sum(first) / len(first), sum(last) / len(last)
    slope, slope_half = _fit(points), _fit(half)
    return {"rss_kib_first_minute_after_warmup": round(first_mean), "rss_kib_last_minute": round(last_mean),
            "rss_growth_after_warmup_pct": round(100 * (last_mean - first_mean) / first_mean, 2),
            "rss_growth_endpoints_pct": round(100 * (after[-1]["rss_kib"] - after[0]["rss_kib"])
                                              / after[0]["rss_kib"], 2),
            "rss_slope_mib_per_min": None if slope is None else round(slope, 3),
            "rss_slope_second_half_mib_per_min": None if slope_half is None else round(slope_half, 3)}


async def sampler(http: aiohttp.ClientSession, base: str, pid: int, running: set[asyncio.Future[None]],
                  started: float, samples: list[dict[str, Any]], stop: asyncio.Event) -> None:
    cpu, at = cpu_seconds(pid), time.monotonic()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_S)
            return
        now, cpu_now = time.monotonic(), cpu_seconds(pid)
        samples.append({"t": round(now - started), "rss_kib": rss_kib(pid),
                        "gateway_cpu": round((cpu_now - cpu) / (now - at), 3),
                        "live_programs": await live_programs(http, base), "programs_in_flight": len(running)})
        cpu, at = cpu_now, now


async def soak(base: str, admin: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    levels, saturated = await calibrate(base, pid, args) if args.rate is None else ([], False)
    saturation = max(level["programs_per_s"] for level in levels) if levels else None
    rate = args.rate if saturation is None else args.load * saturation
    await asyncio.sleep(IDLE_TTL + 12)  # the calibration's abandoned sessions expire before the soak starts
    counts: dict[str, int] = {}
    rng = random.Random(args.seed)
    running: set[asyncio.Future[None]] = set()
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    cpu0, arrivals = cpu_seconds(pid), 0
    async with _session() as http:
        stop = asyncio.Event()
        sampling = asyncio.ensure_future(sampler(http, base, pid, running, started, samples, stop))
        next_arrival = started
        while (now := time.monotonic()) - started < args.minutes * 60:
            if now < next_arrival:
                await asyncio.sleep(next_arrival - now)
                continue
            next_arrival += rng.expovariate(rate)
            arrivals += 1
            if len(running) < MAX_PROGRAMS_IN_FLIGHT:
                task = asyncio.ensure_future(program(http, base, random.Random(rng.random()), counts))
                running.add(task)
                task.add_done_callback(running.discard)
            else:
                count(counts, "arrivals_dropped")
        load_s = time.monotonic() - started
        gateway_cpu = (cpu_seconds(pid) - cpu0) / load_s
        stop.set()
        await sampling
        # every client request has a 300 s bound: a program still running after that is stuck
        _, never_ended = await asyncio.wait(running, timeout=330) if running else (set(), set())
        for task in never_ended:
            task.cancel()
        await asyncio.sleep(IDLE_TTL + 12)  # abandoned sessions expire (the janitor runs every ttl/4)
        async with http.get(admin + "/admin/calls?limit=1000") as r:
            calls = (await r.json())["data"]
        async with http.get(admin + "/admin/engines") as r:
            engines = (await r.json())["data"]
        live_after = await live_programs(http, base)
    rss_end = rss_kib(pid)
    trimmed = None
    if args.probe_trim:
        os.kill(pid, signal.SIGUSR2)
        await asyncio.sleep(1)
        trimmed = rss_kib(pid)
    return {"settings": vars(args), "calibration": levels, "calibration_saturated": saturated,
            "saturation_programs_per_s": saturation, "programs_per_s": round(rate, 3),
            "arrivals_per_s": round(arrivals / load_s, 3), "gateway_cpu_mean": round(gateway_cpu, 3),
            "answers": counts, "samples": samples, **rss_growth(samples, args.warmup * 60),
            "rss_kib_max": max(s["rss_kib"] for s in samples),
            "live_programs_max": max(s["live_programs"] for s in samples),
            "programs_in_flight_max": max(s["programs_in_flight"] for s in samples),
            "live_programs_after": live_after, "programs_never_ended": len(never_ended),
            "stuck_calls": sum(c["result"] == "running" for c in calls),
            "engine_inflight_after": [e["inflight"] for e in engines],
            "rss_kib_end": rss_end, "rss_kib_end_after_malloc_trim": trimmed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0, help="minutes before RSS growth is measured")
    parser.add_argument("--load", type=float, default=0.8, help="fraction of the calibrated saturation rate")
    parser.add_argument("--rate", type=float, default=None, help="programs per second (skips the calibration)")
    parser.add_argument("--calibrate", type=float, default=25.0, help="seconds of each calibration level")
    parser.add_argument("--calibration-workers", type=int, default=32, help="closed-loop clients of the first level")
    parser.add_argument("--calibration-max-workers", type=int, default=512)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", default="a100-llama3.1-8b")
    parser.add_argument("--probe-trim", action="store_true",
                        help="report the gateway's RSS after malloc_trim(0) at the end")
    parser.add_argument("--gateway-env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment of the gateway (repeatable)")
    args = parser.parse_args()
    extra_env = dict(item.split("=", 1) for item in args.gateway_env)
    with emulator_process(1, "--profile", args.profile, "--model", MODEL) as engines:
        port, admin_port = free_ports(2)
        log = Path(tempfile.mkdtemp(prefix="autellix-soak-")) / "gateway.log"
        launcher = ["-c", gateway_boot(probe_trim=args.probe_trim)]
        with log.open("wb") as out:
            gateway = subprocess.Popen([sys.executable, *launcher, "gateway", "--port", str(port),
                                        "--admin-port", str(admin_port), "--engine", engines[0]], stdout=out,
                                       stderr=subprocess.STDOUT,
                                       env={**os.environ, "AUTELLIX_PROGRAM_IDLE_TTL": str(IDLE_TTL), **extra_env})
        base, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
        try:
            for _ in range(100):
                with contextlib.suppress(OSError), urllib.request.urlopen(base + "/ready", timeout=2) as r:
                    if r.status == 200:
                        break
                time.sleep(0.3)
            report = asyncio.run(soak(base, admin, gateway.pid, args))
            report["gateway_log"] = str(log)
            print(json.dumps(report, indent=1), flush=True)
        finally:
            stopping = time.monotonic()
            gateway.terminate()  # SIGTERM: the gateway drains (nothing is in flight by now) and exits
            try:
                gateway.wait(60)
            except subprocess.TimeoutExpired:
                gateway.kill()
                gateway.wait()
            print(f"gateway exited with {gateway.returncode} {time.monotonic() - stopping:.1f} s after SIGTERM",
                  file=sys.stderr)


if __name__ == "__main__":
    main()
