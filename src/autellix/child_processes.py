"""Child processes of Autellix commands: how they start, stop, and die with the process that started them.

Three guarantees for what ``autellix up`` (and the tests and experiments that run
whole stacks) start:

* **A terminal's Ctrl-C reaches only the parent.** ``owned_popen`` puts a child in
  a process group of its own, so the parent stops its children in order (Envoy
  before the replicas, the replicas before the store) instead of each child
  reacting to the same SIGINT on its own (Envoy exiting 0 under a supervisor that
  then took it for a crash).
* **A child dies with its parent**, however the parent dies, SIGKILL included:
  ``owned_popen`` asks Linux for SIGKILL when the parent goes
  (``PR_SET_PDEATHSIG``), from a few lines of Python that then become the command
  (``exec``): no Python code runs between fork and exec, where it could deadlock
  on a lock another thread of the parent held. The kernel sends the signal when
  the *thread* that started the child ends, so start owned children from a thread
  that lives as long as they should (the main thread). A child with children of its own (a vLLM engine and its
  engine-core processes) is watched by a :class:`GroupReaper`: a small process that
  SIGKILLs every process group it was told of once the parent is gone.
* **A stop is graceful once, then at once.** Inside ``graceful_signals()`` the first
  SIGTERM or SIGINT raises in the main thread (``SystemExit(143)``,
  ``KeyboardInterrupt``) so that the ``finally`` blocks that stop children run; a
  second one exits on the spot, and the children die with the parent as above.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
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
from typing import Any

log = logging.getLogger(__name__)

#: What an owned child runs first (standard library only, no site packages): prctl(2)'s
#: PR_SET_PDEATHSIG (1) with SIGKILL (9), a check that the parent did not die before that took
#: effect, then the command itself, in the same process.
_DIE_WITH_PARENT = """
import ctypes, os, sys
try:
    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)
except AttributeError:  # not Linux: the child outlives a SIGKILL of its parent
    pass
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def owned_child() -> dict[str, Any]:
    """``subprocess.Popen`` keyword arguments for the same as :func:`owned_popen` through a ``preexec_fn``:
    Python code between fork and exec, which can deadlock in a parent with threads; prefer ``owned_popen``."""
    parent = os.getpid()

    def die_with_parent() -> None:
        with contextlib.suppress(AttributeError):
            ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(1)

    return {"process_group": 0, "preexec_fn": die_with_parent}


def owned_popen(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **popen_kwargs)`` for a child this process stops itself: a process group of
    its own (a terminal's Ctrl-C reaches only us) and SIGKILL when this process (the calling thread) ends."""
    return subprocess.Popen([sys.executable, "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv],
                            process_group=0, **popen_kwargs)


#: The reaper's whole program (standard library only, so it starts in a few milliseconds): read
#: "+PGID" / "-PGID" lines until the parent's end of the pipe closes, then SIGKILL what is left.
_REAPER = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
groups = set()
for line in sys.stdin:
    (groups.add if line[0] == "+" else groups.discard)(int(line[1:]))
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
"""


class GroupReaper:
    """A process that SIGKILLs the process groups it was told of once this process is gone, however it went.

    For children with children of their own (a vLLM engine: its API server and its engine-core
    processes, one process group per engine): ``PR_SET_PDEATHSIG`` reaches only a direct child.
    The reaper holds the read end of a pipe whose only writer is this process; the kernel closes
    the write end when this process ends (SIGKILL included), and the reaper then kills every group
    still registered. ``forget`` a group once it is stopped (its id may be reused)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", _REAPER], stdin=subprocess.PIPE, text=True,
                                        process_group=0, stdout=subprocess.DEVNULL)

    def _send(self, line: str) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:  # someone killed the reaper: the stop in order still works, the guarantee not
            log.warning("the process-group reaper is gone (exit %s): children may outlive a SIGKILL of this process",
                        self.process.poll())

    def watch(self, group: int) -> None:
        self._send(f"+{group}")

    def forget(self, group: int) -> None:
        self._send(f"-{group}")

    def close(self) -> None:
        """End the reaper; groups still registered are killed (the parent's stop did not finish)."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
        self.process.wait(10)

    def __enter__(self) -> GroupReaper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exit_now(signum: int, _frame: object) -> None:
    os._exit(128 + signum)


def exit_at_once_on_signal() -> None:
    """From now on SIGTERM and SIGINT end this process on the spot (a stop is already under way)."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_now)


@contextlib.contextmanager
def graceful_signals() -> Iterator[None]:
    """While inside, the first SIGTERM raises ``SystemExit(143)`` and the first SIGINT ``KeyboardInterrupt``
    in the main thread (the ``finally`` blocks that stop children then run); any signal after that exits
    at once. The previous handlers come back on leaving."""
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}

    def first(signum: int, _frame: object) -> None:
        exit_at_once_on_signal()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    for signum in previous:
        signal.signal(signum, first)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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
        proc = owned_popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
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
