"""Autellix commands as OS child processes (the gateway, the engine emulator): for benchmarks and tests
that run whole stacks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """While inside, SIGTERM raises ``SystemExit(143)`` in the main thread, as Ctrl-C
    raises ``KeyboardInterrupt``: the ``finally`` blocks and context managers that
    stop local engines and gateways then run. Python's default for SIGTERM is to
    die on the spot, and an engine started in a process group of its own
    (``start_engine``) would outlive a benchmark or ``autellix up`` stopped that way."""

    def raise_exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_process(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM (a graceful stop: Envoy and the gateway drain), then SIGKILL after ``timeout``."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free now (all held open together while chosen)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


@contextlib.contextmanager
def autellix_process(args: list[str], port: int, *, ready_path: str = "/health", env: dict[str, str] | None = None,
                     log_path: Path | None = None, timeout: float = 60.0) -> Iterator[str]:
    """``autellix <args>`` as a child process listening on ``port``; yields its
    base URL once ``ready_path`` answers 200. Its log goes to a file (a pipe
    nobody reads would fill and freeze it), shown when it fails to start.
    Stopped on exit."""
    cmd = [sys.executable, "-m", "autellix", *args]
    log_path = log_path or Path(tempfile.gettempdir()) / f"autellix-{args[0]}-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"autellix {args[0]} exited:\n{log_path.read_text(errors='replace')}")
            with contextlib.suppress(urllib.error.URLError, OSError), \
                    urllib.request.urlopen(base + ready_path, timeout=2) as r:
                if r.status == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"autellix {args[0]} not ready:\n{log_path.read_text(errors='replace')}")
            time.sleep(0.3)
        yield base
    finally:
        stop_process(proc)


#: Gateway base URL -> its admin listener's, for the gateways ``gateway_process`` started.
ADMIN_URLS: dict[str, str] = {}


def admin_url(base: str) -> str:
    """The admin listener of a gateway ``gateway_process`` started (admin routes are never on ``base``)."""
    return ADMIN_URLS[base]


def gateway_process(engine_urls: list[str], *args: str, env: dict[str, str] | None = None,
                    log_path: Path | None = None, timeout: float = 60.0) -> contextlib.AbstractContextManager[str]:
    """``autellix gateway`` in front of ``engine_urls``; yields its base URL once ``/ready`` answers 200.
    Its admin listener (loopback, no key) is on a free port: ``admin_url(base)``."""
    port, admin_port = free_ports(2)
    cmd = ["gateway", "--port", str(port), *args]
    if "--admin-port" not in args:
        cmd += ["--admin-port", str(admin_port)]
        ADMIN_URLS[f"http://127.0.0.1:{port}"] = f"http://127.0.0.1:{admin_port}"
    for url in engine_urls:
        cmd += ["--engine", url]
    return autellix_process(cmd, port, ready_path="/ready", env=env, log_path=log_path, timeout=timeout)
