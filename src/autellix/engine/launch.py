"""Local vLLM engines as child processes: the embedded default's engines.

Each engine is ``python -m vllm.entrypoints.openai.api_server`` on the tiny
random-weight model (``tiny_model.py``), with the CPU settings that work here:
a 1 GiB KV cache, dummy weights, prefix caching on. Used by ``autellix up``,
``autellix engine`` and the tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from autellix.engine.tiny_model import build_tiny_model, default_model_dir

SERVED_MODEL = "tiny-llama"
#: Engine schedulers ``autellix up --scheduler`` offers.
SCHEDULERS = ("vllm-priority", "fcfs")


@dataclass
class EngineProcess:
    port: int
    process: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def engine_command(model_dir: Path, port: int, *, scheduler: str = "vllm-priority", max_num_seqs: int = 64,
                   max_model_len: int = 8192, extra_args: list[str] | None = None,
                   python: str | None = None) -> list[str]:
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown engine scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
    cmd = [
        python or os.environ.get("AUTELLIX_ENGINE_PYTHON") or sys.executable,
        "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", SERVED_MODEL,
        "--load-format", "dummy",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--gpu-memory-utilization", "0.2",
        "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_num_seqs),
        "--enable-prefix-caching",
        # per-request timing in every response: the gateway's model-time source
        "--enable-per-request-metrics",
        "--disable-uvicorn-access-log",
    ]
    if scheduler == "vllm-priority":
        cmd += ["--scheduling-policy", "priority"]
    return cmd + list(extra_args or [])


def engine_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever fetched from a model hub
    return env


def start_engine(port: int, *, log_dir: Path, model_dir: Path | None = None, **options: object) -> EngineProcess:
    model_dir = build_tiny_model(model_dir or default_model_dir())
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"engine-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(engine_command(model_dir, port, **options), stdout=log,  # type: ignore[arg-type]
                                   stderr=subprocess.STDOUT, env=engine_env(), start_new_session=True)
    return EngineProcess(port, process, log_path)


def wait_ready(engines: list[EngineProcess], timeout: float = 300.0) -> None:
    """Block until every engine answers /health; raise with its log if one dies."""
    deadline = time.monotonic() + timeout
    pending = list(engines)
    while pending:
        for engine in list(pending):
            if not engine.alive():
                raise RuntimeError(f"engine on port {engine.port} exited:\n{engine.log_tail()}")
            try:
                with urllib.request.urlopen(engine.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        pending.remove(engine)
            except (urllib.error.URLError, OSError):
                pass
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"engines not ready after {timeout:.0f}s: {[e.port for e in pending]}")
        if pending:
            time.sleep(1.0)


def stop_engine(engine: EngineProcess, grace: float = 15.0) -> None:
    """SIGTERM the engine's process group (vLLM has worker children), then SIGKILL."""
    if not engine.alive():
        return
    try:
        os.killpg(engine.process.pid, signal.SIGTERM)
        engine.process.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(engine.process.pid, signal.SIGKILL)
        engine.process.wait()
    except ProcessLookupError:
        pass


def kill_engine(engine: EngineProcess) -> None:
    """Kill at once, as a crash would (tests of failover)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(engine.process.pid, signal.SIGKILL)
    engine.process.wait()
