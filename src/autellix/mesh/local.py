"""A gateway cluster on this machine: the xDS control plane, Envoy, and N gateway replicas.

What ``autellix up --gateways N`` runs, and what the tests and the Envoy benchmark
start. Replicas are ``autellix gateway`` child processes; the control plane runs
on a thread of this process and publishes the replicas it started; Envoy is a
child process fed by it. A replica that dies is left to Envoy's health checks and
outlier detection (as in a cluster); :meth:`LocalMesh.supervise` restarts it on
its port, as a Deployment would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autellix.child_processes import free_ports, stop_process
from autellix.mesh.control_plane import ThreadedControlPlane
from autellix.mesh.envoy import EnvoyProcess, start_envoy, wait_envoy_ready
from autellix.mesh.resources import GatewayEndpoint, MeshSettings
from autellix.protocol import READY_PATH

HOST = "127.0.0.1"


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

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.env)

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
    """Debian's ``redis-server`` as a child process on a free loopback port, nothing persisted:
    the shared program store of a local cluster (and of the tests)."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.port = free_ports(1)[0]
        self.url = f"redis://{HOST}:{self.port}/0"
        self.log_path = log_path or Path(tempfile.mkdtemp(prefix="autellix-redis-")) / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("redis-server") is not None

    def __enter__(self) -> LocalRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 10.0) -> None:
        import redis

        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", HOST, "--save", "", "--appendonly", "no"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        with redis.Redis(host=HOST, port=self.port) as client:
            while True:
                with contextlib.suppress(redis.ConnectionError):
                    if client.ping():
                        return
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start:\n{self.log_path.read_text(errors='replace')}")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


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
    #: Redis URL of the shared program store; None: each replica keeps its programs in memory.
    store_url: str | None = None

    def __post_init__(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.control_plane = ThreadedControlPlane(self.settings)
        self.gateways: list[GatewayReplica] = []
        self.envoy: EnvoyProcess | None = None

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

    def supervise(self) -> list[GatewayReplica]:
        """Restart replicas that exited, on their own ports (membership does not change); returns them."""
        restarted = []
        for replica in self.gateways:
            if not replica.alive():
                replica.start()
                restarted.append(replica)
        if self.envoy is not None and not self.envoy.alive():
            raise RuntimeError(f"envoy exited with {self.envoy.process.returncode}:\n{self.envoy.log_tail()}")
        return restarted

    def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        for replica in self.gateways:  # all at once: each may hold its unready answer a moment
            replica.terminate()
        for replica in self.gateways:
            replica.stop()
        self.control_plane.stop()



def serve_mesh(engine_urls: list[str], replicas: int, *, port: int, gateway_args: list[str],
               gateway_env: dict[str, str], store_url: str | None = None,
               print_fn: Callable[[str], None] | None = None) -> None:
    """``autellix up --gateways N``: run the cluster until Ctrl-C (or SIGTERM), restarting replicas that
    exit. The replicas share their programs through ``store_url``, else through a local redis-server
    (Debian's), else (none installed) each keeps its own in memory."""
    if print_fn is None:
        def print_fn(line: str) -> None:
            print(line, flush=True)  # at once, also into a file or a pipe
    settings = MeshSettings(listen_port=port)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with contextlib.ExitStack() as stack:
            if store_url is None and LocalRedis.available():
                store_url = stack.enter_context(LocalRedis()).url
            elif store_url is None:
                print_fn("no redis-server (apt-get install redis-server) and no --store: each replica keeps its "
                         "programs in memory, so a program that moves starts over, and sessions opened with "
                         "POST /v1/sessions may not be found on the next call (use an agent session header)")
            mesh = stack.enter_context(LocalMesh(engine_urls, replicas, settings=settings,
                                                 gateway_args=gateway_args, gateway_env=gateway_env,
                                                 store_url=store_url))
            print_fn(f"Envoy on {mesh.url} (the one endpoint) -> {replicas} gateway replicas "
                     f"{', '.join(g.url for g in mesh.gateways)}; xDS control plane on "
                     f"{mesh.control_plane.address}; program store {store_url or 'in memory'} "
                     f"(logs: {mesh.log_dir})")
            while not stop.wait(1.0):
                for replica in mesh.supervise():
                    print_fn(f"gateway {replica.url} exited; restarted (Envoy routes to it once ready)")
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
