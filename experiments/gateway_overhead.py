"""What the gateway itself costs: direct vs. Autellix gateway vs. vllm-router, one run.

Starts an instant upstream (``experiments/instant_engine.py``), the Autellix gateway
(``autellix gateway``) and vllm-router (if installed) as separate processes on
127.0.0.1, then, for each target interleaved over several repetitions, measures

* latency at a fixed open-loop request rate (p50, p99; added = target - direct,
  paired per repetition, median over repetitions), and
* throughput in a closed loop at fixed concurrencies (requests completed per
  second; the saturation rate is the best concurrency's median), driven by wrk
  (Debian's ``wrk``: a C load generator, faster than any target here) when it is
  installed, else by this script's aiohttp client, which on two cores may
  saturate before the target does (the report's ``closed_loop_client`` says which);
* over each closed loop, the serving process's CPU (user + system) per call and the
  cores it used (CPU seconds per second): the target's own process, the instant
  upstream's for ``direct``.

With ``--floor`` it also runs ``experiments/relay_floor.py``, the gateway's server, loop
and call leg relaying calls and doing nothing else: what of the gateway's cost is the
framework's and the sockets', and what is its own work per call.

Run: ``.venv/bin/python experiments/gateway_overhead.py [--format json]``. A
benchmark, not a test: figures depend on the machine; compare them side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil

HOST = "127.0.0.1"
MODEL = "tiny-llama"
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1}).encode()
HEADERS = {"Content-Type": "application/json"}
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Target:
    name: str
    url: str
    ready_path: str
    #: The process whose CPU is the target's (0: not measured).
    pid: int = 0


@dataclass
class Results:
    """Per target: one value per repetition."""

    p50: dict[str, list[float]] = field(default_factory=dict)
    p99: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    rps: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    #: CPU milliseconds per call and cores used, per concurrency, of the target's process.
    cpu_ms: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    cores: dict[str, dict[int, list[float]]] = field(default_factory=dict)


class Processes:
    """Subprocesses in their own sessions, logged to files, killed on exit."""

    def __init__(self) -> None:
        self.logdir = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.logdir / f"{name}.log").open("wb")
        self.procs.append((name, subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                  stdin=subprocess.DEVNULL, start_new_session=True)))

    def pid(self, name: str) -> int:
        return next(proc.pid for started, proc in self.procs if started == name)

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                tail = (self.logdir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for _, proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        shutil.rmtree(self.logdir, ignore_errors=True)


async def wait_ready(http: aiohttp.ClientSession, procs: Processes, target: Target, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.check_alive()
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with http.get(target.url + target.ready_path, timeout=aiohttp.ClientTimeout(total=2)) as r:
                if r.status == 200:
                    async with http.post(target.url + "/v1/chat/completions", data=BODY, headers=HEADERS,
                                         timeout=REQUEST_TIMEOUT) as c:
                        if c.status == 200 and (await c.json()).get("usage"):
                            return
        await asyncio.sleep(0.3)
    raise RuntimeError(f"{target.name} not ready at {target.url} after {timeout:.0f}s")


async def one_call(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.post(url, data=BODY, headers=HEADERS, timeout=REQUEST_TIMEOUT) as r:
            await r.read()
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def open_loop(http: aiohttp.ClientSession, url: str, rate: float, duration: float) -> tuple[list[float], int]:
    """Send at a fixed rate regardless of answers; latency from the actual send, in seconds."""
    latencies: list[float] = []
    errors = 0

    async def timed() -> None:
        nonlocal errors
        t = time.perf_counter()
        if await one_call(http, url):
            latencies.append(time.perf_counter() - t)
        else:
            errors += 1

    tasks: list[asyncio.Task[None]] = []
    start = time.perf_counter()
    for i in range(int(rate * duration)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(timed()))
    _, pending = await asyncio.wait(tasks, timeout=REQUEST_TIMEOUT.total)
    for task in pending:
        task.cancel()
    return latencies, errors + len(pending)


async def closed_loop(http: aiohttp.ClientSession, url: str, concurrency: int, duration: float) -> float:
    """``concurrency`` callers back to back for ``duration``: completed calls per second."""
    done = 0
    end = time.perf_counter() + duration
    cap = int(duration * 100_000)  # a bound on count as well as on time

    async def caller() -> None:
        nonlocal done
        while time.perf_counter() < end and done < cap:
            if await one_call(http, url):
                done += 1

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(caller() for _ in range(concurrency))), duration + 15)
    return done / (time.perf_counter() - start)


WRK_SCRIPT = f"""wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{BODY.decode()}'
"""


async def closed_loop_wrk(url: str, concurrency: int, duration: float) -> float:
    """The same closed loop by wrk (one thread, ``concurrency`` connections): 2xx answers per second."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT)
    try:
        proc = await asyncio.create_subprocess_exec(
            "wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(duration))}s", "--timeout", "10s", "-s", script.name,
            url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), duration + 30)
    finally:
        os.unlink(script.name)
    text = out.decode()
    total = seconds = None
    bad = 0
    for line in text.splitlines():
        words = line.split()
        if "requests in" in line:  # "  12345 requests in 3.00s, 4.56MB read"
            total, seconds = int(words[0]), float(words[3].rstrip(",").removesuffix("s"))
        elif line.strip().startswith("Non-2xx or 3xx responses:"):
            bad += int(words[-1])
        elif line.strip().startswith("Socket errors:"):  # connect N, read N, write N, timeout N
            bad += sum(int(w.rstrip(",")) for w in words[3::2])
    if total is None or not seconds:
        raise RuntimeError(f"wrk printed no count:\n{text}")
    return max(total - bad, 0) / seconds


@dataclass
class LoadedCpu:
    """One closed loop's rate, and per process its CPU milliseconds a call and the cores it used."""

    rps: float
    cpu_ms_per_call: dict[int, float]
    cores: dict[int, float]


async def closed_loop_cpu(pids: list[int], run: Awaitable[float], duration: float) -> LoadedCpu:
    """Run a closed loop of ``duration`` seconds (``run``: its rate) and the CPU ``pids`` spent over it."""
    before, started = {pid: cpu_seconds(pid) for pid in pids}, time.perf_counter()
    rps = await run
    wall = time.perf_counter() - started
    spent = {pid: cpu_seconds(pid) - before[pid] for pid in pids}
    calls = max(1.0, rps * round(duration))
    return LoadedCpu(rps, {pid: cpu * 1e3 / calls for pid, cpu in spent.items()},
                     {pid: cpu / wall for pid, cpu in spent.items()})


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its threads so far (0 for no pid)."""
    if not pid:
        return 0.0
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def percentile(values: list[float], q: float) -> float:
    """Nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def measure(targets: list[Target], args: argparse.Namespace, procs: Processes) -> Results:
    res = Results()
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as http:
        for t in targets:
            await wait_ready(http, procs, t)
            await closed_loop(http, t.url + "/v1/chat/completions", max(args.concurrency), args.warmup)
        for rep in range(args.reps):
            order = targets[rep % len(targets):] + targets[:rep % len(targets)]  # rotate: no fixed position
            for t in order:
                procs.check_alive()
                url = t.url + "/v1/chat/completions"
                lat, errors = await open_loop(http, url, args.rate, args.duration)
                res.p50.setdefault(t.name, []).append(percentile(lat, 0.50) * 1e3)
                res.p99.setdefault(t.name, []).append(percentile(lat, 0.99) * 1e3)
                res.errors[t.name] = res.errors.get(t.name, 0) + errors
                for c in args.concurrency:
                    loop = (closed_loop_wrk(url, c, args.closed_duration) if args.closed_loop_client == "wrk"
                            else closed_loop(http, url, c, args.closed_duration))
                    loaded = await closed_loop_cpu([t.pid] if t.pid else [], loop, args.closed_duration)
                    res.rps.setdefault(t.name, {}).setdefault(c, []).append(loaded.rps)
                    if t.pid:
                        res.cpu_ms.setdefault(t.name, {}).setdefault(c, []).append(loaded.cpu_ms_per_call[t.pid])
                        res.cores.setdefault(t.name, {}).setdefault(c, []).append(loaded.cores[t.pid])
                if not args.quiet:
                    print(f"rep {rep + 1}/{args.reps} {t.name:>8}: p50 {res.p50[t.name][-1]:.2f} ms, "
                          f"p99 {res.p99[t.name][-1]:.2f} ms, "
                          + ", ".join(f"c={c} {res.rps[t.name][c][-1]:.0f}/s" for c in args.concurrency),
                          file=sys.stderr, flush=True)
    return res


def summarize(res: Results, args: argparse.Namespace) -> dict[str, Any]:
    med = statistics.median
    out: dict[str, Any] = {"rate": args.rate, "duration_s": args.duration, "reps": args.reps,
                           "concurrency": args.concurrency, "closed_loop_client": args.closed_loop_client,
                           "targets": {}}
    for name in res.p50:
        entry: dict[str, Any] = {
            "p50_ms": med(res.p50[name]), "p99_ms": med(res.p99[name]), "errors": res.errors[name],
            "rps": {c: med(v) for c, v in res.rps[name].items()},
            "raw": {"p50_ms": res.p50[name], "p99_ms": res.p99[name], "rps": res.rps[name]},
        }
        entry["saturation_rps"] = max(entry["rps"].values())
        if name in res.cpu_ms:
            entry["cpu_ms_per_call"] = {c: med(v) for c, v in res.cpu_ms[name].items()}
            entry["cores"] = {c: med(v) for c, v in res.cores[name].items()}
            entry["raw"]["cpu_ms_per_call"], entry["raw"]["cores"] = res.cpu_ms[name], res.cores[name]
        if name != "direct":  # paired with direct in the same repetition
            entry["added_p50_ms"] = med(a - b for a, b in zip(res.p50[name], res.p50["direct"], strict=True))
            entry["added_p99_ms"] = med(a - b for a, b in zip(res.p99[name], res.p99["direct"], strict=True))
        out["targets"][name] = entry
    targets = out["targets"]
    for gateway in ("gateway", "gateway-before", "floor"):
        if gateway in targets and "router" in targets:
            out[f"{gateway}_over_router_saturation"] = targets[gateway]["saturation_rps"] / targets["router"][
                "saturation_rps"]
    if "gateway" in targets and "gateway-before" in targets:  # the change, paired per repetition
        out["gateway_over_before_saturation"] = med(
            max(a) / max(b) for a, b in zip(zip(*res.rps["gateway"].values(), strict=True),
                                              zip(*res.rps["gateway-before"].values(), strict=True), strict=True))
        out["gateway_minus_before_p50_ms"] = med(
            a - b for a, b in zip(res.p50["gateway"], res.p50["gateway-before"], strict=True))
    return out


def print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    cs = summary["concurrency"]
    table = Table(title=f"Gateway overhead: {summary['rate']:.0f} req/s open loop for {summary['duration_s']:.0f} s, "
                        f"median of {summary['reps']} interleaved repetitions")
    for col in ["target", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms",
                *(f"req/s c={c}" for c in cs), "saturation req/s", "CPU ms/call", "cores", "errors"]:
        table.add_column(col, justify="left" if col == "target" else "right")
    for name, e in summary["targets"].items():
        added = [f"{e[k]:+.2f}" if k in e else "-" for k in ("added_p50_ms", "added_p99_ms")]
        best = max(cs, key=lambda c: e["rps"][c])  # the CPU at the saturating concurrency
        cpu = f"{e['cpu_ms_per_call'][best]:.3f}" if "cpu_ms_per_call" in e else "-"
        cores = f"{e['cores'][best]:.2f}" if "cores" in e else "-"
        table.add_row(name, f"{e['p50_ms']:.2f}", f"{e['p99_ms']:.2f}", *added,
                      *(f"{e['rps'][c]:.0f}" for c in cs), f"{e['saturation_rps']:.0f}", cpu, cores, str(e["errors"]))
    console = Console(width=None if sys.stdout.isatty() else 150)
    console.print(table)
    for key, label in (("gateway_over_router_saturation", "gateway / router saturation rate"),
                       ("gateway-before_over_router_saturation", "gateway before / router saturation rate"),
                       ("floor_over_router_saturation", "relay floor / router saturation rate"),
                       ("gateway_over_before_saturation", "gateway / gateway before, saturation (per rep)"),
                       ("gateway_minus_before_p50_ms", "gateway - gateway before, p50 ms (per rep)")):
        if key in summary:
            console.print(f"{label}: {summary[key]:.2f}")


def add_load_options(parser: argparse.ArgumentParser) -> None:
    """The options ``measure`` and ``summarize`` read, for every script that measures with them."""
    parser.add_argument("--rate", type=float, default=200.0, help="open-loop request rate (req/s)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of open-loop load per measurement")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 128], help="closed-loop callers")
    parser.add_argument("--closed-duration", type=float, default=3.0, help="seconds per closed-loop measurement")
    parser.add_argument("--closed-loop-client", choices=["wrk", "aiohttp"],
                        default="wrk" if shutil.which("wrk") else "aiohttp",
                        help="what drives the closed loop (default: wrk when installed)")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (at least 3 advised)")
    parser.add_argument("--warmup", type=float, default=1.0, help="closed-loop warm-up seconds per target")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.add_argument("--quiet", action="store_true", help="no per-repetition progress on stderr")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_options(parser)
    parser.add_argument("--no-router", action="store_true", help="skip vllm-router")
    parser.add_argument("--floor", action="store_true",
                        help="also run the relay floor (experiments/relay_floor.py): the gateway's server and call "
                             "leg doing nothing else")
    parser.add_argument("--before", type=Path, default=None,
                        help="a checkout of another revision (e.g. `git worktree add /tmp/before REV`): its gateway "
                             "runs beside this one as `gateway-before`, so a change is measured in one run")
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below still runs
    procs = Processes()
    try:
        engine_port, gateway_port, router_port = free_port(), free_port(), free_port()
        engine = f"http://{HOST}:{engine_port}"
        procs.start("engine", [sys.executable, str(Path(__file__).with_name("instant_engine.py")),
                               "--port", str(engine_port)])
        # The gateway as it ships: `autellix gateway`, the defaults.
        procs.start("gateway", [sys.executable, "-m", "autellix", "gateway", "--port", str(gateway_port),
                                "--engine", engine])
        targets = [Target("direct", engine, "/health", procs.pid("engine")),
                   Target("gateway", f"http://{HOST}:{gateway_port}", "/ready", procs.pid("gateway"))]
        if args.before is not None:
            before_port = free_port()
            procs.start("gateway-before", [sys.executable, "-m", "autellix", "gateway", "--port", str(before_port),
                                           "--engine", engine],
                        env={**os.environ, "PYTHONPATH": str(args.before.resolve() / "src")})
            targets.append(Target("gateway-before", f"http://{HOST}:{before_port}", "/ready",
                                  procs.pid("gateway-before")))
        if args.floor:
            floor_port = free_port()
            procs.start("floor", [sys.executable, str(Path(__file__).with_name("relay_floor.py")),
                                  "--port", str(floor_port), "--engine", engine])
            targets.append(Target("floor", f"http://{HOST}:{floor_port}", "/ready", procs.pid("floor")))
        router = shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or shutil.which("vllm-router")
        if router and not args.no_router:
            procs.start("router", [router, "--worker-urls", engine, "--port", str(router_port),
                                   "--policy", "round_robin", "--prometheus-port", str(free_port()),
                                   "--log-level", "warning"])
            targets.append(Target("router", f"http://{HOST}:{router_port}", "/health", procs.pid("router")))
        elif not args.no_router:
            print("vllm-router not found (pip install vllm-router==0.1.17); skipping it", file=sys.stderr)
        summary = summarize(asyncio.run(measure(targets, args, procs)), args)
    finally:
        procs.stop()
    if args.format == "json":
        print(json.dumps(summary, indent=2))
    else:
        print_table(summary)


if __name__ == "__main__":
    main()
