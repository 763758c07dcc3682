"""The engine's preStop drain (``autellix engine drain-wait``) against an emulated
engine (``autellix emulate``, vLLM's HTTP API and metrics) as a real process."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from autellix.backends import VllmBackend
from autellix.backends.drain import read_metrics
from autellix.child_processes import free_port
from autellix.sim.emulator import emulator_process
from tests.live import http


def drain_wait(*args: str) -> tuple[int, float, str]:
    done = subprocess.run([sys.executable, "-m", "autellix", "engine", "drain-wait", *args], capture_output=True,
                          text=True, timeout=60)
    return done.returncode, time.monotonic(), done.stderr


def test_it_returns_once_the_engines_calls_have_finished(tmp_path) -> None:
    with emulator_process(1, "--time-scale=3", log_path=tmp_path / "emulator.log") as (engine,):
        finished: list[float] = []

        def long_call() -> None:
            status, _ = http("POST", engine + "/v1/completions",
                             {"model": "emulated", "prompt": "x" * 100, "max_tokens": 800})
            assert status == 200
            finished.append(time.monotonic())

        caller = threading.Thread(target=long_call)
        caller.start()
        deadline = time.monotonic() + 10
        while VllmBackend().drain_ready(read_metrics(engine, VllmBackend.pool_metrics)):
            assert time.monotonic() < deadline, "the call never showed up in the engine's metrics"
            time.sleep(0.02)
        rc, _, log = drain_wait("--url", engine, "--interval", "0.1", "--timeout", "0.3")
        assert rc == 1 and "gave up" in log and not finished  # bounded: the hook fails, visibly
        rc, returned, log = drain_wait("--url", engine, "--interval", "0.1")
        caller.join()
        assert rc == 0, log
        assert finished and returned >= finished[0], "drain-wait returned while the call was running"
        assert "still has 1 running" in log and "holds no call" in log


def test_an_engine_that_does_not_answer_has_nothing_to_drain() -> None:
    rc, _, log = drain_wait("--url", f"http://127.0.0.1:{free_port()}")
    assert rc == 0 and "nothing left to drain" in log
