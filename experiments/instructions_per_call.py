"""The gateway's CPU instructions per call, counted by callgrind: a figure this noisy machine repeats.

Starts the instant upstream, then each target in turn under ``valgrind --tool=callgrind`` with its
instrumentation off until the target is warm: the gateway as it ships (``gateway``), with ``--tree DIR`` the
gateway of another source tree beside it (``tree``: ``DIR/src`` first on ``PYTHONPATH``, e.g. a checkout of
another revision or one with compiled modules), and the relay floor (``floor``: ``relay_floor.py``, the
gateway's server and call leg doing nothing else). Each is driven by wrk (4 connections) for ``--warmup``
seconds, then counted over ``--seconds``: instrumentation on, counters zeroed, wrk, instrumentation off, a
dump; instructions per call are the dump's total over the calls wrk completed. Under callgrind a process runs
tens of times slower, so the rates mean nothing; the counts do not depend on what else the machine runs.

Run: ``.venv/bin/python experiments/instructions_per_call.py [--tree DIR] [--format json]`` (needs
``valgrind`` and ``wrk`` from Debian). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gateway_overhead as overhead  # this folder's gateway benchmark: processes, readiness, wrk

HERE = Path(__file__).resolve().parent


def callgrind_totals(path: Path) -> int:
    """The instructions a callgrind dump counted (its ``totals:`` line)."""
    for line in path.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


async def written(folder: Path, pattern: str, timeout: float = 30.0) -> Path:
    """The newest file in ``folder`` matching ``pattern``, once one is there (callgrind dumps on its own time)."""
    deadline = time.monotonic() + timeout
    while not (found := sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {pattern} in {folder} after {timeout:.0f} s")
        await asyncio.sleep(0.5)
    return found[-1]


async def count(name: str, argv: list[str], engine: str, args: argparse.Namespace, env: dict[str, str],
                outdir: Path) -> dict[str, float]:
    port = overhead.free_port()
    out = outdir / f"{name}.callgrind"
    procs = overhead.Processes()
    try:
        procs.start(name, ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                           *argv, "--port", str(port), "--engine", engine], env=env)
        target = overhead.Target(name, f"http://{overhead.HOST}:{port}", "/ready", procs.pid(name))
        async with overhead.aiohttp.ClientSession() as http:
            await overhead.wait_ready(http, procs, target, timeout=300)
        url = target.url + "/v1/chat/completions"
        await overhead.closed_loop_wrk(url, 4, args.warmup)
        pid = str(procs.pid(name))
        for command in (["-i", "on"], ["-z"]):
            subprocess.run(["callgrind_control", *command, pid], check=True, capture_output=True)
        rate = await overhead.closed_loop_wrk(url, 4, args.seconds)
        subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
        dump = await written(outdir, f"{name}.callgrind.*")
        calls = rate * max(1, round(args.seconds))  # wrk runs whole seconds
        instructions = callgrind_totals(dump)
        return {"calls": calls, "instructions": instructions, "per_call": instructions / calls}
    finally:
        procs.stop()


async def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    outdir = Path(tempfile.mkdtemp(prefix="callgrind-"))
    procs = overhead.Processes()
    try:
        engine_port = overhead.free_port()
        procs.start("engine", [sys.executable, str(HERE / "instant_engine.py"), "--port", str(engine_port)])
        engine = f"http://{overhead.HOST}:{engine_port}"
        gateway = [sys.executable, "-m", "autellix", "gateway"]
        targets = [("gateway", gateway, dict(os.environ))]
        if args.tree is not None:
            tree_env = {**os.environ, "PYTHONPATH": str(args.tree.resolve() / "src")}
            targets.append(("tree", gateway, tree_env))
        targets.append(("floor", [sys.executable, str(HERE / "relay_floor.py")], dict(os.environ)))
        results = {}
        for name, argv, env in targets:
            results[name] = await count(name, argv, engine, args, env, outdir)
            print(f"{name}: {results[name]['per_call']:,.0f} instructions a call", file=sys.stderr)
        return results
    finally:
        procs.stop()
        shutil.rmtree(outdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tree", type=Path, default=None, help="another source tree's gateway beside this one")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of calls before counting")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of calls counted")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control", "wrk"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (apt-get install valgrind wrk)")
    results = asyncio.run(run(args))
    if args.format == "json":
        print(json.dumps(results, indent=2))
        return
    floor = results["floor"]["per_call"]
    print("| target | calls counted | instructions a call | over the floor |")
    print("|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['calls']:.0f} | {r['per_call']:,.0f} | {r['per_call'] - floor:,.0f} |")


if __name__ == "__main__":
    main()
