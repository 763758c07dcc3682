"""``autellix up``: local engines plus the gateway, stopped together on Ctrl-C."""

from __future__ import annotations

import tempfile
from pathlib import Path

from rich.console import Console

from autellix.core import SchedulerConfig
from autellix.engine.launch import SERVED_MODEL, start_engine, stop_engine, wait_ready
from autellix.engine.tiny_model import build_tiny_model, default_model_dir
from autellix.gateway.app import GatewayConfig
from autellix.gateway.serve import serve


def run_local(*, port: int, engines: int, scheduler_config: SchedulerConfig, engine_scheduler: str,
              engine_args: list[str], first_engine_port: int) -> None:
    console = Console()
    model_dir = build_tiny_model(default_model_dir())
    log_dir = Path(tempfile.mkdtemp(prefix="autellix-engines-"))
    console.print(f"starting {engines} vLLM engine(s) on the tiny model (logs: {log_dir}) ...")
    started = []
    try:
        for i in range(engines):
            started.append(start_engine(first_engine_port + i, log_dir=log_dir, model_dir=model_dir,
                                        scheduler=engine_scheduler, extra_args=engine_args,
                                        config=scheduler_config))
        wait_ready(started)
        url = f"http://127.0.0.1:{port}"
        console.print(f"[green]ready[/]: OpenAI endpoint {url}/v1 (model {SERVED_MODEL!r}), "
                      f"engines {', '.join(e.url for e in started)}")
        console.print(f"try: curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' "
                      f"-H 'x-session-id: demo' -d '{{\"model\": \"{SERVED_MODEL}\", "
                      f"\"messages\": [{{\"role\": \"user\", \"content\": \"hi\"}}], \"max_tokens\": 16}}'")
        config = GatewayConfig(engines=[e.url for e in started], scheduler=scheduler_config,
                               tokenizer=model_dir / "tokenizer.json")
        serve(config, "127.0.0.1", port, print_fn=lambda *_: None)
    finally:
        for engine in started:
            stop_engine(engine)
        console.print("stopped")
