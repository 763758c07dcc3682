"""What the endpoint picker costs per call, against the aiohttp gateway's, in one run.

Starts an instant upstream (``experiments/instant_engine.py``), ``autellix gateway``
in front of it, and Envoy configured as a GIE gateway (``autellix_lab.gie_envoy``)
with two listeners on the same upstream: one that asks ``autellix epp`` (ext_proc,
GIE's full-duplex bodies, the ``ORIGINAL_DST`` cluster) and one that does not
(Envoy's own cost). Then, interleaved over repetitions, with
``experiments/gateway_overhead.py``'s open loop of whole chat calls:

* latency at a fixed open-loop rate: p50 and p99; added = target - direct, paired
  per repetition; the picker's own share = envoy+epp - envoy, paired too;
* CPU per call of each serving process (the gateway; Envoy; the picker): its CPU
  time (user + system) over the measurement, divided by the calls sent.

``--native BINARY...`` adds ``envoy+NAME`` for each (NAME: the binary's file name): an Envoy
of its own whose picker is a native ext_proc floor (``experiments/native_ext_proc/``, built by
its ``build.sh``: ``floor`` on gRPC C++'s callback API, ``floor_cq`` on its completion queue with
one thread): the stream in C++ with no decision, what a native ext_proc front costs a call before
any. ``--request-body`` and ``--response-body`` set how Envoy sends bodies to every picker (GIE's
``FULL_DUPLEX_STREAMED`` by default; ``BUFFERED`` requests with ``NONE`` responses are the fewest
messages the picker works with).

Run on a quiet machine:
``.venv/bin/python experiments/epp_overhead.py --reps 5 [--native BINARY...] [--format json]``;
smoke: ``--rate 20 --duration 1 --reps 1``. A benchmark, not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import sys
from pathlib import Path
from typing import Any

import aiohttp
import gateway_overhead as overhead  # this folder's gateway benchmark: processes, load loop, percentiles
import psutil
from native_ext_proc.floor_process import NativeFloor  # this folder's native ext_proc floor

from autellix.child_processes import free_ports
from autellix_lab.epp_local import LocalGie, PickerProcess
from autellix_lab.gie_envoy import GatewayListener

HOST = overhead.HOST


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


async def measure(targets: list[overhead.Target], pids: dict[str, dict[str, list[int]]], args: argparse.Namespace,
                  procs: overhead.Processes) -> dict[str, Any]:
    """Per target and repetition: p50 and p99 (ms) and, per serving process, CPU milliseconds per call."""
    runs: dict[str, dict[str, list[Any]]] = {t.name: {"p50": [], "p99": [], "errors": [], "cpu": []} for t in targets}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for t in targets:
            await overhead.wait_ready(http, procs, t)
            await overhead.closed_loop(http, t.url + "/v1/chat/completions", 8, args.warmup)
        for rep in range(args.reps):
            order = targets[rep % len(targets):] + targets[:rep % len(targets)]  # rotate: no fixed position
            for t in order:
                procs.check_alive()
                before = {role: cpu_seconds(p) for role, p in pids[t.name].items()}
                latencies, errors = await overhead.open_loop(http, t.url + "/v1/chat/completions", args.rate,
                                                             args.duration)
                sent = len(latencies) + errors
                cpu = {role: (cpu_seconds(p) - before[role]) * 1e3 / max(1, sent) for role, p in pids[t.name].items()}
                entry = runs[t.name]
                entry["p50"].append(overhead.percentile(latencies, 0.50) * 1e3)
                entry["p99"].append(overhead.percentile(latencies, 0.99) * 1e3)
                entry["errors"].append(errors)
                entry["cpu"].append(cpu)
                if not args.quiet:
                    used = ", ".join(f"{k} {v:.2f} ms" for k, v in cpu.items())
                    print(f"rep {rep + 1}/{args.reps} {t.name:>10}: p50 {entry['p50'][-1]:.2f} ms, p99 "
                          f"{entry['p99'][-1]:.2f} ms, CPU/call {used}", file=sys.stderr, flush=True)
    return runs


def summarize(runs: dict[str, dict[str, list[Any]]], args: argparse.Namespace) -> dict[str, Any]:
    med = statistics.median

    def paired(a: str, b: str, key: str) -> float:
        return med(x - y for x, y in zip(runs[a][key], runs[b][key], strict=True))

    out: dict[str, Any] = {"rate": args.rate, "duration_s": args.duration, "reps": args.reps, "targets": {}}
    for name, entry in runs.items():
        roles = entry["cpu"][0].keys() if entry["cpu"] else []
        row: dict[str, Any] = {"p50_ms": med(entry["p50"]), "p99_ms": med(entry["p99"]), "errors": sum(entry["errors"]),
                               "cpu_ms_per_call": {role: med(c[role] for c in entry["cpu"]) for role in roles},
                               "raw": entry}
        if name != "direct":
            row["added_p50_ms"], row["added_p99_ms"] = paired(name, "direct", "p50"), paired(name, "direct", "p99")
        out["targets"][name] = row
    gateway_cpu = out["targets"]["gateway"]["cpu_ms_per_call"]["gateway"]
    out["pickers"] = {target: {"added_p50_ms": paired(target, "envoy", "p50"),
                               "added_p99_ms": paired(target, "envoy", "p99"),
                               "cpu_over_gateway": out["targets"][target]["cpu_ms_per_call"]["picker"] / gateway_cpu}
                      for target in runs if target.startswith("envoy+")}
    return out


def print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Picker overhead: {summary['rate']:.0f} req/s open loop for {summary['duration_s']:.0f} s, "
                        f"median of {summary['reps']} interleaved repetitions")
    for col in ("target", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "CPU ms/call", "errors"):
        table.add_column(col, justify="left" if col == "target" else "right")
    for name, e in summary["targets"].items():
        added = [f"{e[k]:+.2f}" if k in e else "-" for k in ("added_p50_ms", "added_p99_ms")]
        cpu = ", ".join(f"{role} {ms:.2f}" for role, ms in e["cpu_ms_per_call"].items()) or "-"
        table.add_row(name, f"{e['p50_ms']:.2f}", f"{e['p99_ms']:.2f}", *added, cpu, str(e["errors"]))
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    for target, row in summary["pickers"].items():
        console.print(f"{target} - envoy, paired: p50 {row['added_p50_ms']:+.2f} ms, "
                      f"p99 {row['added_p99_ms']:+.2f} ms; its picker's CPU per call "
                      f"{row['cpu_over_gateway']:.2f}x the gateway's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100.0, help="open-loop request rate (req/s)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of open-loop load per measurement")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (at least 3 advised)")
    parser.add_argument("--warmup", type=float, default=1.0, help="closed-loop warm-up seconds per target")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.add_argument("--quiet", action="store_true", help="no per-repetition progress on stderr")
    parser.add_argument("--native", type=Path, nargs="+", default=[],
                        help="native ext_proc floors' binaries (build.sh)")
    parser.add_argument("--request-body", default="FULL_DUPLEX_STREAMED", help="Envoy's request body mode")
    parser.add_argument("--response-body", default="FULL_DUPLEX_STREAMED", help="Envoy's response body mode")
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below still runs
    procs = overhead.Processes()
    stack = contextlib.ExitStack()
    try:
        engine_port, gateway_port, epp_port, envoy_port = free_ports(4)
        modes = {"request_body": args.request_body, "response_body": args.response_body}
        engine = f"http://{HOST}:{engine_port}"
        procs.start("engine", [sys.executable, str(Path(__file__).with_name("instant_engine.py")),
                               "--port", str(engine_port)])
        procs.start("gateway", [sys.executable, "-m", "autellix", "gateway", "--port", str(gateway_port),
                                "--engine", engine])
        picker = PickerProcess([engine], log_path=procs.logdir / "epp.log")
        listeners = [GatewayListener(epp_port, **modes), GatewayListener(envoy_port, picker=False)]
        gie = stack.enter_context(LocalGie(picker, listeners, workdir=procs.logdir / "envoy").running())
        assert picker.process is not None
        gateway_pid = next(p.pid for name, p in procs.procs if name == "gateway")
        envoy_pid, picker_pid = gie.envoy.process.pid, picker.process.pid
        targets = [overhead.Target("direct", engine, "/health"),
                   overhead.Target("gateway", f"http://{HOST}:{gateway_port}", "/ready"),
                   overhead.Target("envoy", f"http://{HOST}:{envoy_port}", "/v1/models"),
                   overhead.Target("envoy+epp", f"http://{HOST}:{epp_port}", "/v1/models")]
        pids = {"direct": {}, "gateway": {"gateway": [gateway_pid]}, "envoy": {"envoy": [envoy_pid]},
                "envoy+epp": {"envoy": [envoy_pid], "picker": [picker_pid]}}
        for binary in args.native:
            native, [native_port] = NativeFloor(binary, [engine]), free_ports(1)
            native_gie = stack.enter_context(LocalGie(native, [GatewayListener(native_port, **modes)],
                                                      workdir=procs.logdir / f"envoy-{binary.name}").running())
            assert native.process is not None
            targets.append(overhead.Target(f"envoy+{binary.name}", f"http://{HOST}:{native_port}", "/v1/models"))
            pids[f"envoy+{binary.name}"] = {"envoy": [native_gie.envoy.process.pid], "picker": [native.process.pid]}
        summary = summarize(asyncio.run(measure(targets, pids, args, procs)), args) | modes
    finally:
        stack.close()
        procs.stop()
    if args.format == "json":
        print(json.dumps(summary, indent=2))
    else:
        print_table(summary)


if __name__ == "__main__":
    main()
