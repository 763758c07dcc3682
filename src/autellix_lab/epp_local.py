"""A GIE gateway on this machine: ``autellix epp`` and Envoy in front of running engines (tests, experiments).

``PickerProcess`` runs ``autellix epp`` as a child process that can be killed and
started again on the same ports (the failure-mode tests do both); ``LocalGie``
adds Envoy, configured by ``autellix_lab.gie_envoy`` with one listener per
``GatewayListener``, and yields the gateway's URLs once Envoy routes and the
picker is ready.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autellix.child_processes import free_ports, owned_child, stop_process
from autellix.epp.contract import endpoint_of
from autellix.mesh.envoy import EnvoyProcess, envoy_binary, wait_envoy_ready
from autellix_lab.gie_envoy import Balancing, GatewayListener, gie_bootstrap


@dataclass
class PickerProcess:
    """``autellix epp`` in front of ``engines``, on fixed ports so that it can come back where it was."""

    engines: Sequence[str]
    args: Sequence[str] = ()
    log_path: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="autellix-epp-")) / "epp.log")
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    metrics_port: int = 0
    admin_port: int = 0

    def __post_init__(self) -> None:
        if not (self.port and self.metrics_port and self.admin_port):
            self.port, self.metrics_port, self.admin_port = free_ports(3)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, timeout: float = 60.0) -> None:
        """Start it (again) and wait until ``/ready``."""
        argv = [sys.executable, "-m", "autellix", "epp", "--port", str(self.port), "--metrics-port",
                str(self.metrics_port), "--admin-port", str(self.admin_port), *self.args]
        for url in self.engines:
            argv += ["--engine", url]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env={**os.environ, **self.env}, **owned_child())
        deadline = time.monotonic() + timeout
        while not self.ready():
            if not self.alive():
                raise RuntimeError(f"autellix epp exited:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"autellix epp not ready:\n{self.log_tail()}")
            time.sleep(0.2)

    def ready(self) -> bool:
        with contextlib.suppress(urllib.error.URLError, OSError), \
                urllib.request.urlopen(self.metrics_url + "/ready", timeout=2) as r:
            return bool(r.status == 200 and json.loads(r.read()).get("ready"))
        return False

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the picker dies on the spot, its streams with it."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


@dataclass
class LocalGie:
    """Envoy as a GIE gateway (``listeners``) with ``picker`` as its endpoint picker, in front of ``engines``."""

    picker: PickerProcess
    listeners: Sequence[GatewayListener]
    balancing: Balancing = "original_dst"
    upstream_header: str | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="autellix-gie-")))
    envoy_concurrency: int = 1

    def urls(self) -> list[str]:
        return [f"http://{listener.host}:{listener.port}" for listener in self.listeners]

    @contextlib.contextmanager
    def running(self) -> Iterator[LocalGie]:
        config = gie_bootstrap(picker=self.picker.address, pool=[endpoint_of(url) for url in self.picker.engines],
                               listeners=self.listeners, balancing=self.balancing, upstream_header=self.upstream_header)
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / "envoy.json"
        path.write_text(json.dumps(config, indent=1))
        argv = [envoy_binary(), "--config-path", str(path), "--admin-address-path", str(self.workdir / "admin-address"),
                "--concurrency", str(self.envoy_concurrency), "--log-level", "warning", "--disable-hot-restart",
                "--drain-time-s", "1"]
        envoy = EnvoyProcess("gie", argv, self.workdir, self.urls()[0])
        self.picker.start()
        try:
            envoy.start()
            try:
                wait_envoy_ready(envoy)
                self.envoy = envoy
                yield self
            finally:
                envoy.stop()
        finally:
            self.picker.stop()


__all__ = ["LocalGie", "PickerProcess"]
