"""What the endpoint picker's ext_proc stream costs without its decision: the picker's floor.

Runs ``autellix epp`` behind Envoy (a GIE gateway, ``autellix_lab.gie_envoy``) in front of the
instant upstream twice in turn, over repetitions: as it ships (``full``), and with its decision
cut to the least (``bare``: route to the pool's first engine, pass the answer through unread; a
``sitecustomize`` the picker's process loads replaces ``Picker.decide``). wrk drives each for a
few seconds; the picker's and Envoy's CPU per call are their CPU time over the run divided by the
calls answered. What ``bare`` costs is the stream itself: Envoy's messages read and answered
through grpc.aio. ``--native BINARY...`` adds a mode for each (named by the binary's file
name): a native ext_proc floor (``experiments/native_ext_proc/``, built by its ``build.sh``) in
the picker's place, the same stream in gRPC C++ with no decision. ``gateway``: the aiohttp
gateway in front of the same engine under the same load, for its CPU a call. ``--request-body``
and ``--response-body`` set how Envoy sends bodies (GIE's ``FULL_DUPLEX_STREAMED`` by default).

Run: ``.venv/bin/python experiments/picker_floor.py [--reps 3] [--native BINARY...] [--format json]``.
A benchmark, not a test: figures depend on the machine; compare them side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

import aiohttp
import gateway_overhead as overhead  # this folder's gateway benchmark: processes, wrk, CPU time
from native_ext_proc.floor_process import NativeFloor  # this folder's native ext_proc floor

from autellix.child_processes import free_ports
from autellix_lab.epp_local import LocalGie, PickerProcess
from autellix_lab.gie_envoy import GatewayListener

BARE_DECIDER = '''
import autellix.epp.picker as picker
from autellix.epp.contract import endpoint_of
from autellix.epp.exchange import Routing


async def decide(self, head, body, leg):
    engine = next(iter(self.gateway.pool.engines))
    await leg.route(Routing([endpoint_of(engine)]))
    await leg.response_head()
    async for data, last in leg.response_chunks():
        await leg.forward(data, last)


picker.Picker.decide = decide
'''


def run_one(mode: str, engine: str, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    env = {}
    if mode == "bare":
        patch = workdir / "bare"
        patch.mkdir(exist_ok=True)
        (patch / "sitecustomize.py").write_text(BARE_DECIDER)
        env["PYTHONPATH"] = str(patch)
    natives = {binary.name: binary for binary in args.native}
    picker = (NativeFloor(natives[mode], [engine]) if mode in natives
              else PickerProcess([engine], env=env, log_path=workdir / f"epp-{mode}.log"))
    [port] = free_ports(1)
    listener = GatewayListener(port, request_body=args.request_body, response_body=args.response_body)
    with LocalGie(picker, [listener], workdir=workdir / f"envoy-{mode}").running() as gie:
        assert picker.process is not None
        pids = {"picker": picker.process.pid, "envoy": gie.envoy.process.pid}
        url = gie.urls()[0] + "/v1/chat/completions"
        asyncio.run(overhead.closed_loop_wrk(url, args.connections, args.warmup))
        loaded = asyncio.run(overhead.closed_loop_cpu(
            list(pids.values()), overhead.closed_loop_wrk(url, args.connections, args.duration), args.duration))
        out = {f"{k}_cpu_ms_per_call": loaded.cpu_ms_per_call[pid] for k, pid in pids.items()}
        out["rps"], out["picker_cores"] = loaded.rps, loaded.cores[pids["picker"]]
        return out


async def run_gateway(engine: str, args: argparse.Namespace) -> dict[str, float]:
    """The aiohttp gateway in front of the same engine under the same load: its CPU a call, for comparison."""
    procs = overhead.Processes()
    [port] = free_ports(1)
    try:
        procs.start("gateway", [sys.executable, "-m", "autellix", "gateway", "--port", str(port), "--engine", engine])
        target = overhead.Target("gateway", f"http://{overhead.HOST}:{port}", "/ready", procs.pid("gateway"))
        async with aiohttp.ClientSession() as http:
            await overhead.wait_ready(http, procs, target)
        url = target.url + "/v1/chat/completions"
        await overhead.closed_loop_wrk(url, args.connections, args.warmup)
        loaded = await overhead.closed_loop_cpu(
            [target.pid], overhead.closed_loop_wrk(url, args.connections, args.duration), args.duration)
        return {"gateway_cpu_ms_per_call": loaded.cpu_ms_per_call[target.pid], "rps": loaded.rps}
    finally:
        procs.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="repetitions, the modes in turn")
    parser.add_argument("--connections", type=int, default=8, help="wrk's connections")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of load per measurement")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of load before each measurement")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.add_argument("--native", type=Path, nargs="+", default=[],
                        help="native ext_proc floors' binaries (build.sh)")
    parser.add_argument("--request-body", default="FULL_DUPLEX_STREAMED", help="Envoy's request body mode")
    parser.add_argument("--response-body", default="FULL_DUPLEX_STREAMED", help="Envoy's response body mode")
    args = parser.parse_args()

    procs = overhead.Processes()
    modes = ["full", "bare", *(binary.name for binary in args.native), "gateway"]
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    try:
        [engine_port] = free_ports(1)
        engine = f"http://{overhead.HOST}:{engine_port}"
        procs.start("engine", [sys.executable, str(Path(__file__).with_name("instant_engine.py")),
                               "--port", str(engine_port)])
        workdir = Path(tempfile.mkdtemp(prefix="picker-floor-"))
        for rep in range(args.reps):
            for mode in (modes if rep % 2 == 0 else modes[::-1]):
                procs.check_alive()
                runs[mode].append(asyncio.run(run_gateway(engine, args)) if mode == "gateway"
                                  else run_one(mode, engine, args, workdir))
                print(f"rep {rep + 1}/{args.reps} {mode}: {runs[mode][-1]}", file=sys.stderr, flush=True)
    finally:
        procs.stop()
    med = statistics.median
    summary = {"reps": args.reps, "connections": args.connections, "duration_s": args.duration,
               "request_body": args.request_body, "response_body": args.response_body,
               "modes": {mode: {key: med(r[key] for r in rows) for key in rows[0]} | {"raw": rows}
                         for mode, rows in runs.items()}}
    summary["picker_cpu_over_gateway"] = {
        mode: med(r["picker_cpu_ms_per_call"] / g["gateway_cpu_ms_per_call"]
                  for r, g in zip(runs[mode], runs["gateway"], strict=True)) for mode in modes if mode != "gateway"}
    summary["bare_over_full_picker_cpu"] = med(
        b["picker_cpu_ms_per_call"] / f["picker_cpu_ms_per_call"] for b, f in zip(runs["bare"], runs["full"],
                                                                                  strict=True))
    if args.format == "json":
        print(json.dumps(summary, indent=2))
        return
    for mode, row in summary["modes"].items():
        if mode == "gateway":
            print(f"gateway: {row['rps']:.0f} calls/s, {row['gateway_cpu_ms_per_call']:.2f} ms CPU a call")
            continue
        print(f"{mode:>7}: {row['rps']:.0f} calls/s, picker {row['picker_cpu_ms_per_call']:.2f} ms CPU a call "
              f"({row['picker_cores']:.2f} cores, {summary['picker_cpu_over_gateway'][mode]:.2f}x the gateway's), "
              f"Envoy {row['envoy_cpu_ms_per_call']:.2f} ms")
    print(f"the stream alone (bare) / the picker as it ships (full), CPU a call: "
          f"{summary['bare_over_full_picker_cpu']:.2f}")


if __name__ == "__main__":
    main()
