"""``autellix up``: local engines plus the gateway (or Envoy, N replicas and their store), stopped together.

Ctrl-C or SIGTERM stops everything in order and prints no traceback: the gateway
drains, then the engines stop; with ``gateways > 1``, Envoy, the replicas and the
store stop first (``autellix.mesh.local.serve_mesh``). A second signal exits at once.
However this process ends, SIGKILL included, nothing it started outlives it: the
engines' process groups (each engine's API server and its engine-core processes)
are watched by a :class:`~autellix.child_processes.GroupReaper`, and the mesh's
children die with this process (``autellix.child_processes.owned_popen``).
"""

from __future__ import annotations

import contextlib
import secrets
import tempfile
from pathlib import Path

from rich.console import Console

from autellix.child_processes import GroupReaper, exit_at_once_on_signal, graceful_signals
from autellix.core import SchedulerConfig
from autellix.engine.launch import (
    FEEDBACK_MIDDLEWARE,
    SERVED_MODEL,
    EngineProcess,
    start_engine,
    stop_engine,
    wait_ready,
)
from autellix.engine.tiny_model import build_tiny_model, default_model_dir
from autellix.gateway.config import GatewayConfig
from autellix.gateway.serve import serve
from autellix.protocol import ADMIN_ENGINES_PATH, ENGINE_TOKEN_ENV


def run_local(*, port: int, engines: int, scheduler_config: SchedulerConfig, engine_scheduler: str,
              engine_args: list[str], first_engine_port: int, gateways: int = 1, store: str | None = None) -> None:
    console = Console()
    with GroupReaper() as reaper, contextlib.suppress(KeyboardInterrupt, SystemExit):
        started: list[EngineProcess] = []
        try:
            with graceful_signals():  # a signal while the engines start stops them too
                _start_and_serve(console, reaper, started, port=port, engines=engines,
                                 scheduler_config=scheduler_config, engine_scheduler=engine_scheduler,
                                 engine_args=engine_args, first_engine_port=first_engine_port, gateways=gateways,
                                 store=store)
        finally:
            exit_at_once_on_signal()  # stopping already: another signal leaves the rest to the reaper
            for engine in started:
                stop_engine(engine)
                reaper.forget(engine.process.pid)
            console.print("stopped")


def _start_and_serve(console: Console, reaper: GroupReaper, started: list[EngineProcess], *, port: int, engines: int,
                     scheduler_config: SchedulerConfig, engine_scheduler: str, engine_args: list[str],
                     first_engine_port: int, gateways: int, store: str | None) -> None:
    model_dir = build_tiny_model(default_model_dir())
    log_dir = Path(tempfile.mkdtemp(prefix="autellix-engines-"))
    console.print(f"starting {engines} vLLM engine(s) on the tiny model (logs: {log_dir}) ...")
    # engines take calls only with this token, which only the gateway gets: nothing else on this
    # machine can skip the gateway or read the engines' execution-time records
    token = secrets.token_urlsafe(32)
    if engine_scheduler != "autellix" and "--middleware" not in engine_args:
        engine_args = [*engine_args, "--middleware", FEEDBACK_MIDDLEWARE]  # the token check for stock schedulers
    for i in range(engines):
        engine = start_engine(first_engine_port + i, log_dir=log_dir, model_dir=model_dir, scheduler=engine_scheduler,
                              extra_args=engine_args, config=scheduler_config, token=token)
        started.append(engine)
        reaper.watch(engine.process.pid)  # its own process group (start_engine): the group's id is its pid
    wait_ready(started)
    url = f"http://127.0.0.1:{port}"
    console.print(f"[green]ready[/]: OpenAI endpoint {url}/v1 (model {SERVED_MODEL!r}), "
                  f"engines {', '.join(e.url for e in started)}")
    console.print(f"try: curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' "
                  f"-H 'x-session-id: demo' -d '{{\"model\": \"{SERVED_MODEL}\", "
                  f"\"messages\": [{{\"role\": \"user\", \"content\": \"hi\"}}], \"max_tokens\": 16}}'")
    if gateways > 1:  # Envoy on `port` in front of N replicas, fed by the xDS control plane
        from autellix.mesh.local import serve_mesh

        serve_mesh([e.url for e in started], gateways, port=port,
                   gateway_env={**scheduler_config.to_env(), ENGINE_TOKEN_ENV: token},
                   gateway_args=["--tokenizer", str(model_dir)], store_url=store,
                   print_fn=console.print)
        return
    config = GatewayConfig(engines=[e.url for e in started], scheduler=scheduler_config,
                           tokenizer=model_dir, engine_token=token,
                           admin_port=port + 1)  # the admin listener, on loopback like the rest
    console.print(f"admin (engines, drain, calls): http://127.0.0.1:{port + 1}{ADMIN_ENGINES_PATH}")
    serve(config, "127.0.0.1", port, print_fn=lambda *_: None)  # its own signal handling: a drain, then back here
