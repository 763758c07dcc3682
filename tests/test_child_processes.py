"""``exit_on_sigterm``: a command stopped by SIGTERM still stops what it started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap

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


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("mode", ["guarded", "bare"])
def test_sigterm_runs_the_cleanup_only_under_the_guard(mode: str) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=20)
    child = int(done.stdout.split()[0])
    try:
        if mode == "guarded":
            assert done.returncode == 143 and "child stopped" in done.stdout, done.stderr
            assert not alive(child)
        else:  # Python's default: killed on the spot, and the child outlives it
            assert done.returncode == -signal.SIGTERM and "child stopped" not in done.stdout
            assert alive(child)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_the_previous_handler_comes_back() -> None:
    from autellix.child_processes import exit_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    with exit_on_sigterm():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
