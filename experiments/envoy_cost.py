"""What Envoy in front of the gateway costs: direct vs. gateway vs. Envoy + gateway vs. Envoy + N gateways, one run.

Starts an instant upstream (``experiments/instant_engine.py``), N gateway processes
(``autellix gateway``, the defaults), our xDS control plane (a thread of this
process) and two Envoys fed by it: one in front of the first gateway alone, one
in front of all N (a per-node snapshot each). Then, with
``experiments/gateway_overhead.py``'s load loops, interleaved over repetitions:

* latency at a fixed open-loop rate (p50, p99; added = target - direct, paired
  per repetition; Envoy's own share = Envoy + gateway - gateway, paired too), and
* the saturation rate: completed calls per second in closed loops.

Calls carry no session header (one-call programs), so Envoy has no program key
and spreads them over the N replicas: the N-replica rows show what more
replicas buy on this machine, not a program's path. ``--with-store`` adds one
gateway on the shared program store (``autellix gateway --store`` on a
local redis-server): a one-call program is opened and ended in Redis, two round
trips per call, its worst case.

Run: ``.venv/bin/python experiments/envoy_cost.py [--replicas 3] [--format json]``.
A benchmark, not a test: figures depend on the machine; compare them side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gateway_overhead as overhead  # this folder's gateway benchmark: processes, load loops, summary

from autellix.child_processes import free_ports
from autellix.mesh.control_plane import ThreadedControlPlane
from autellix.mesh.envoy import EnvoyProcess, start_envoy, wait_envoy_ready
from autellix.mesh.local import LocalRedis
from autellix.mesh.resources import GatewayEndpoint, MeshSettings

HOST = overhead.HOST


def envoy_shares(summary: dict[str, Any], res: overhead.Results) -> dict[str, float]:
    """Envoy's own addition: Envoy + gateway minus the same gateway alone, paired per repetition."""
    med = statistics.median
    one = "envoy+gateway"
    return {
        "envoy_added_p50_ms": med(a - b for a, b in zip(res.p50[one], res.p50["gateway"], strict=True)),
        "envoy_added_p99_ms": med(a - b for a, b in zip(res.p99[one], res.p99["gateway"], strict=True)),
        "envoy_over_gateway_saturation": (summary["targets"][one]["saturation_rps"]
                                          / summary["targets"]["gateway"]["saturation_rps"]),
    }


def wait_routable(envoy: EnvoyProcess, cluster: str, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(envoy.healthy_gateways(cluster)) < count:
        if not envoy.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"Envoy {envoy.node_id} routes to {envoy.gateway_hosts(cluster)}:\n{envoy.log_tail()}")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=3, help="gateways behind the second Envoy")
    parser.add_argument("--envoy-concurrency", type=int, default=1, help="Envoy worker threads")
    overhead.add_load_options(parser)
    parser.add_argument("--with-store", action="store_true",
                        help="also one gateway on the shared program store (a local redis-server): its cost per call")
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below still runs
    procs = overhead.Processes()
    plane = ThreadedControlPlane(MeshSettings())
    envoys: list[EnvoyProcess] = []
    stack = contextlib.ExitStack()
    try:
        engine_port, one_port, many_port, *gateway_ports = free_ports(3 + args.replicas)
        engine = f"http://{HOST}:{engine_port}"
        procs.start("engine", [sys.executable, str(Path(__file__).with_name("instant_engine.py")),
                               "--port", str(engine_port)])
        for i, port in enumerate(gateway_ports):
            procs.start(f"gateway-{i}", [sys.executable, "-m", "autellix", "gateway", "--port", str(port),
                                         "--engine", engine])
        gateways = [GatewayEndpoint(HOST, port) for port in gateway_ports]
        if args.with_store:
            store = stack.enter_context(LocalRedis(procs.logdir / "redis.log"))
            store_port = free_ports(1)[0]
            procs.start("gateway-store", [sys.executable, "-m", "autellix", "gateway", "--port", str(store_port),
                                          "--engine", engine, "--store", store.url])
        plane.start()
        layouts = {"envoy-one": (one_port, gateways[:1]), "envoy-many": (many_port, gateways)}
        for node_id, (port, members) in layouts.items():
            settings = MeshSettings(listen_port=port)
            plane.set_gateways(members, node_id=node_id, settings=settings)
            envoys.append(start_envoy(HOST, plane.port, listen_port=port, node_id=node_id,
                                      workdir=procs.logdir / node_id, concurrency=args.envoy_concurrency))
        for envoy, (_, members) in zip(envoys, layouts.values(), strict=True):
            wait_envoy_ready(envoy)
            wait_routable(envoy, MeshSettings().cluster_name, len(members))
        targets = [overhead.Target("direct", engine, "/health", procs.pid("engine")),
                   overhead.Target("gateway", f"http://{gateways[0].address}", "/ready", procs.pid("gateway-0")),
                   overhead.Target("envoy+gateway", envoys[0].listen_url, "/ready"),
                   overhead.Target(f"envoy+{args.replicas}gw", envoys[1].listen_url, "/ready")]
        if args.with_store:
            targets.append(overhead.Target("gateway+store", f"http://{HOST}:{store_port}", "/ready"))
        res = asyncio.run(overhead.measure(targets, args, procs))
        summary = overhead.summarize(res, args)
        summary.update(envoy_shares(summary, res), replicas=args.replicas, envoy_concurrency=args.envoy_concurrency)
        many = summary["targets"][f"envoy+{args.replicas}gw"]["saturation_rps"]
        summary["replicas_over_one_gateway_saturation"] = many / summary["targets"]["gateway"]["saturation_rps"]
        if args.with_store:
            med = statistics.median
            summary["store_added_p50_ms"] = med(a - b for a, b in zip(res.p50["gateway+store"], res.p50["gateway"],
                                                                      strict=True))
            summary["store_over_gateway_saturation"] = (summary["targets"]["gateway+store"]["saturation_rps"]
                                                        / summary["targets"]["gateway"]["saturation_rps"])
    finally:
        for envoy in envoys:
            envoy.stop()
        plane.stop()
        procs.stop()
        stack.close()
    if args.format == "json":
        print(json.dumps(summary, indent=2))
    else:
        overhead.print_table(summary)
        print(f"Envoy's own share (Envoy + gateway - gateway, paired): p50 {summary['envoy_added_p50_ms']:+.2f} ms, "
              f"p99 {summary['envoy_added_p99_ms']:+.2f} ms; saturation Envoy + gateway / gateway "
              f"{summary['envoy_over_gateway_saturation']:.2f}; Envoy + {args.replicas} gateways / one gateway "
              f"{summary['replicas_over_one_gateway_saturation']:.2f}")
        if args.with_store:
            print(f"the shared store's cost (gateway+store - gateway, paired): p50 "
                  f"{summary['store_added_p50_ms']:+.2f} ms; saturation {summary['store_over_gateway_saturation']:.2f}")


if __name__ == "__main__":
    main()
