"""Programs through Envoy while gateway replicas die: a SIGKILL mid-run, then a rolling restart.

Issue 17's two failure checks, on this machine: engines (local vLLM on the tiny
model, or ``--engine URL``), a local Redis, the xDS control plane, Envoy and
``--gateways`` replicas (``autellix.mesh.local``, what ``autellix up --gateways N``
runs). Each phase runs ``--programs`` agent programs of ``--calls`` whole calls,
each in its own session (``autellix.client``: ``POST /v1/sessions``,
``X-Autellix-Session``, ``DELETE`` at the end), ``--concurrency`` at a time:

* **kill**: ``--kill-after`` seconds in, one replica gets SIGKILL (the control
  plane is not told); ``autellix up``'s supervisor restarts it a second later.
* **rolling**: each replica in turn gets SIGTERM, is started again on its port
  and waits until Envoy routes to it again, under the same load.

Reported per phase: programs completed, calls that failed once and succeeded on
the client's one retry (and their share), calls that failed twice, 404s
(sessions lost), and for the kill, the programs whose attained service at the
end is below its value one second before the kill (each program reads its
session after every call). Run: ``.venv/bin/python bench/cluster_failover.py
[--engines 2 | --engine URL ...] [--format json]``. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from autellix.child_processes import free_port, free_ports
from autellix.client import session
from autellix.mesh.local import LocalMesh, LocalRedis, wait_until_ready
from autellix.mesh.resources import MeshSettings


@dataclass
class Phase:
    name: str
    programs_done: int = 0
    calls_ok: int = 0
    retried_ok: int = 0
    failed_twice: int = 0
    not_found: int = 0
    errors: list[str] = field(default_factory=list)
    #: per program: (time, service) after each call
    service: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    final_service: dict[int, float] = field(default_factory=dict)
    event_at: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def summary(self) -> dict[str, Any]:
        calls = self.calls_ok + self.failed_twice
        out: dict[str, Any] = {
            "programs_done": self.programs_done, "calls": calls, "retried_once_ok": self.retried_ok,
            "retried_share": self.retried_ok / calls if calls else 0.0, "failed_twice": self.failed_twice,
            "not_found_404": self.not_found, "first_errors": self.errors[:5]}
        if self.event_at is not None and self.name == "kill":
            below = []
            for program, samples in self.service.items():
                before = [s for t, s in samples if t <= self.event_at - 1.0]
                if before and self.final_service.get(program, 0.0) < before[-1]:
                    below.append(program)
            out["service_below_value_1s_before_kill"] = len(below)
            out["programs_with_a_value_1s_before_kill"] = sum(
                1 for samples in self.service.values() if any(t <= self.event_at - 1.0 for t, _ in samples))
        return out


def run_program(endpoint: str, index: int, calls: int, max_tokens: int, phase: Phase) -> None:
    with session(endpoint, max_retries=0, timeout=120) as s:
        for k in range(calls):
            for attempt in range(2):  # the client's one retry
                try:
                    s.openai.chat.completions.create(
                        model="tiny-llama", max_tokens=max_tokens, extra_body={"ignore_eos": True},
                        messages=[{"role": "user", "content": f"program {index} call {k}"}])
                    with phase.lock:
                        phase.calls_ok += 1
                        phase.retried_ok += attempt
                    break
                except openai.APIStatusError as exc:
                    with phase.lock:
                        phase.not_found += exc.status_code == 404
                        phase.errors.append(f"{exc.status_code}: {str(exc)[:120]}")
                        if attempt:
                            phase.failed_twice += 1
                except openai.APIConnectionError as exc:
                    with phase.lock:
                        phase.errors.append(f"connection: {exc}")
                        if attempt:
                            phase.failed_twice += 1
            entry = s.openai.get(f"/sessions/{s.id}", cast_to=object)
            with phase.lock:
                phase.service.setdefault(index, []).append((time.monotonic(), float(entry["service"])))
        with phase.lock:
            phase.final_service[index] = phase.service[index][-1][1]
            phase.programs_done += 1


def envoy_retries(mesh: LocalMesh) -> int:
    """Calls Envoy sent again to another replica (a replica refused them or died under them)."""
    assert mesh.envoy is not None
    stats = dict(line.split(": ", 1) for line in mesh.envoy.admin("/stats").splitlines() if ": " in line)
    return int(stats[f"cluster.{mesh.settings.cluster_name}.upstream_rq_retry"])


def run_phase(mesh: LocalMesh, phase: Phase, args: argparse.Namespace, disrupt: Any) -> dict[str, Any]:
    retries, started = envoy_retries(mesh), time.monotonic()
    with ThreadPoolExecutor(args.concurrency) as pool:
        futures = [pool.submit(run_program, mesh.url, i, args.calls, args.max_tokens, phase)
                   for i in range(args.programs)]
        disrupt(phase)
        for future in futures:
            with contextlib.suppress(Exception):
                future.result(600)
    return {**phase.summary(), "envoy_retries": envoy_retries(mesh) - retries,
            "seconds": round(time.monotonic() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", action="append", help="existing engine URL (repeatable); else --engines local")
    parser.add_argument("--engines", type=int, default=2, help="local vLLM engines (tiny model) to start")
    parser.add_argument("--gateways", type=int, default=3)
    parser.add_argument("--programs", type=int, default=100)
    parser.add_argument("--calls", type=int, default=4, help="calls per program")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16, help="programs running at once")
    parser.add_argument("--kill-after", type=float, default=4.0, help="seconds into the kill phase")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    with contextlib.ExitStack() as stack:
        engine_urls = list(args.engine or [])
        if not engine_urls:
            from autellix.engine.launch import start_engine, stop_engine, wait_ready
            from autellix.engine.tiny_model import build_tiny_model, default_model_dir

            model_dir = build_tiny_model(default_model_dir())
            log_dir = Path(tempfile.mkdtemp(prefix="failover-engines-"))
            engines = [start_engine(port, log_dir=log_dir, model_dir=model_dir) for port in free_ports(args.engines)]
            for engine in engines:
                stack.callback(stop_engine, engine)
            print(f"starting {args.engines} engine(s) (logs: {log_dir}) ...", file=sys.stderr)
            wait_ready(engines)
            engine_urls = [e.url for e in engines]
        store = stack.enter_context(LocalRedis())
        mesh = stack.enter_context(LocalMesh(engine_urls, args.gateways, settings=MeshSettings(
            listen_port=free_port()), store_url=store.url))
        print(f"Envoy {mesh.url} -> {args.gateways} replicas; store {store.url}; engines {engine_urls}",
              file=sys.stderr)

        def kill_one(phase: Phase) -> None:
            time.sleep(args.kill_after)
            phase.event_at = time.monotonic()
            mesh.gateways[0].kill()
            print(f"kill: SIGKILL {mesh.gateways[0].url}", file=sys.stderr)
            time.sleep(1.0)
            mesh.supervise()  # as `autellix up` does within a second

        def rolling(phase: Phase) -> None:
            time.sleep(1.0)
            phase.event_at = time.monotonic()
            for replica in mesh.gateways:
                replica.stop()
                replica.start()
                wait_until_ready([replica])
                mesh.wait_routable({g.endpoint.address for g in mesh.gateways}, timeout=30)
                print(f"rolling: {replica.url} restarted and routed to", file=sys.stderr)

        mesh.wait_routable({g.endpoint.address for g in mesh.gateways}, timeout=30)
        results = {"kill": run_phase(mesh, Phase("kill"), args, kill_one)}
        mesh.wait_routable({g.endpoint.address for g in mesh.gateways}, timeout=30)
        results["rolling"] = run_phase(mesh, Phase("rolling"), args, rolling)
    report = {"gateways": args.gateways, "engines": len(engine_urls), "programs": args.programs,
              "calls_per_program": args.calls, "concurrency": args.concurrency, **results}
    if args.format == "json":
        print(json.dumps(report, indent=2))
        return
    for name, r in results.items():
        line = (f"{name:>8}: {r['programs_done']}/{args.programs} programs done, {r['calls']} calls, "
                f"{r['retried_once_ok']} retried once by the client ({100 * r['retried_share']:.1f} %), "
                f"{r['failed_twice']} failed twice, {r['not_found_404']} x 404, "
                f"{r['envoy_retries']} calls moved by Envoy, {r['seconds']} s")
        if "service_below_value_1s_before_kill" in r:
            line += (f"; service below its value 1 s before the kill: {r['service_below_value_1s_before_kill']}"
                     f" of {r['programs_with_a_value_1s_before_kill']} programs")
        print(line)


if __name__ == "__main__":
    main()
