"""Child processes stop with their parent: ``exit_on_sigterm``, ``graceful_signals``, ``owned_popen``, ``GroupReaper``.

Each test runs a small parent script as a real process, stops or kills it the way
a user or the kernel would, and looks at what is left in ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import contextlib, os, signal, subprocess, sys, time
    from autellix.child_processes import exit_on_sigterm

    # a child in a process group of its own, as start_engine makes an engine
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], process_group=0,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(child.pid, flush=True)
    guard = exit_on_sigterm() if sys.argv[1] == "guarded" else contextlib.nullcontext()
    with guard:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        finally:
            child.kill()
            child.wait()
            print("child stopped", flush=True)
    """)


def running(pid: int) -> bool:
    """The process exists and is not a zombie (a killed orphan waits for whoever reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (its children, theirs, ...), from ``/proc``."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, frontier = [], [pid]
    while frontier:
        below = parents.get(frontier.pop(), [])
        found += below
        frontier += below
    return found


def gone_soon(pids: list[int], timeout: float = 10.0) -> list[int]:
    """The pids still running after ``timeout`` (the kernel's and the reaper's work takes a moment)."""
    deadline = time.monotonic() + timeout
    while (left := [pid for pid in pids if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("mode", ["guarded", "bare"])
def test_sigterm_runs_the_cleanup_only_under_the_guard(mode: str) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=20)
    child = int(done.stdout.split()[0])
    try:
        if mode == "guarded":
            assert done.returncode == 143 and "child stopped" in done.stdout, done.stderr
            assert not running(child)
        else:  # Python's default: killed on the spot, and the child outlives it
            assert done.returncode == -signal.SIGTERM and "child stopped" not in done.stdout
            assert running(child)
    finally:
        kill_all([child])


def test_the_previous_handler_comes_back() -> None:
    from autellix.child_processes import exit_on_sigterm, graceful_signals

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with exit_on_sigterm():
        assert signal.getsignal(signal.SIGTERM) is not before[0]
    with graceful_signals():
        assert signal.getsignal(signal.SIGINT) is not before[1]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_stop_is_graceful_once_then_at_once() -> None:
    script = textwrap.dedent("""
        import os, signal, time
        from autellix.child_processes import graceful_signals
        with graceful_signals():
            try:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the cleanup below runs
                time.sleep(10)
            except KeyboardInterrupt:
                print("stopping", flush=True)
                os.kill(os.getpid(), signal.SIGTERM)  # a second signal while stopping: out at once
                time.sleep(10)
                print("not reached", flush=True)
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    assert (done.returncode, done.stdout, done.stderr) == (128 + signal.SIGTERM, "stopping\n", "")


PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from autellix.child_processes import GroupReaper, owned_popen

    # an owned child (a replica, Envoy, the store) and a process group with a grandchild in it (an
    # engine: its API server and its engine-core process), watched by the reaper
    owned = owned_popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.DEVNULL)
    engine = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time; "
                               "core = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                               "print(core.pid, flush=True); time.sleep(60)"],
                              process_group=0, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    core = int(engine.stdout.readline())
    reaper = GroupReaper()
    reaper.watch(engine.pid)
    if sys.argv[1] == "forget":
        reaper.forget(engine.pid)  # stopped by us (here: said so), so the reaper leaves it alone
    print(owned.pid, engine.pid, core, reaper.process.pid, flush=True)
    if sys.argv[1] == "forget":
        reaper.close()
    else:
        time.sleep(60)
    """)


def test_everything_a_sigkilled_parent_started_dies_with_it(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, "kill"], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pids = [int(pid) for pid in parent.stdout.readline().split()]
    try:
        assert len(pids) == 4 and all(running(pid) for pid in pids)
        parent.kill()  # no cleanup of its own at all
        parent.wait(10)
        assert gone_soon(pids) == []  # the owned child, the engine, its core, and the reaper
    finally:
        kill_all(pids)


def test_a_group_the_parent_stopped_itself_is_left_alone() -> None:
    done = subprocess.run([sys.executable, "-c", PARENT, "forget"], capture_output=True, text=True, timeout=30)
    owned, engine, core, reaper = (int(pid) for pid in done.stdout.split())
    try:
        assert not running(reaper) and running(engine) and running(core)  # its id might belong to another now
    finally:
        kill_all([owned, engine, core])
