"""``autellix up``: local engines plus the gateway, stopped together on Ctrl-C or SIGTERM."""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path

from rich.console import Console

from autellix.child_processes import exit_on_sigterm
from autellix.core import SchedulerConfig
from autellix.engine.launch import FEEDBACK_MIDDLEWARE, SERVED_MODEL, start_engine, stop_engine, wait_ready
from autellix.engine.tiny_model import build_tiny_model, default_model_dir
from autellix.gateway.app import GatewayConfig
from autellix.gateway.serve import serve
from autellix.protocol import ADMIN_ENGINES_PATH, ENGINE_TOKEN_ENV


def run_local(*, port: int, engines: int, scheduler_config: SchedulerConfig, engine_scheduler: str,
              engine_args: list[str], first_engine_port: int, gateways: int = 1, store: str | None = None) -> None:
    console = Console()
    model_dir = build_tiny_model(default_model_dir())
    log_dir = Path(tempfile.mkdtemp(prefix="autellix-engines-"))
    console.print(f"starting {engines} vLLM engine(s) on the tiny model (logs: {log_dir}) ...")
    started = []
    # engines take calls only with this token, which only the gateway gets: nothing else on this
    # machine can skip the gateway or read the engines' execution-time records
    token = secrets.token_urlsafe(32)
    if engine_scheduler != "autellix" and "--middleware" not in engine_args:
        engine_args = [*engine_args, "--middleware", FEEDBACK_MIDDLEWARE]  # the token check for stock schedulers
    # SIGTERM while the engines start (before the gateway takes it over) still stops them
    with exit_on_sigterm():
        try:
            for i in range(engines):
                started.append(start_engine(first_engine_port + i, log_dir=log_dir, model_dir=model_dir,
                                            scheduler=engine_scheduler, extra_args=engine_args,
                                            config=scheduler_config, token=token))
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
                           gateway_args=["--tokenizer", str(model_dir / "tokenizer.json")], store_url=store,
                           print_fn=console.print)
                return
            config = GatewayConfig(engines=[e.url for e in started], scheduler=scheduler_config,
                                   tokenizer=model_dir / "tokenizer.json", engine_token=token,
                                   admin_port=port + 1)  # the admin listener, on loopback like the rest
            console.print(f"admin (engines, drain, calls): http://127.0.0.1:{port + 1}{ADMIN_ENGINES_PATH}")
            serve(config, "127.0.0.1", port, print_fn=lambda *_: None)
        finally:
            for engine in started:
                stop_engine(engine)
            console.print("stopped")
