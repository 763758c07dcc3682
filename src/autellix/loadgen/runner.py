"""Run agent programs against an OpenAI endpoint with Poisson arrivals.

The target is the Autellix gateway (each program opens a session, its calls
carry ``X-Autellix-Session`` and, for parallel programs, ``X-Autellix-Thread``)
or a bare vLLM server (no sessions: the baseline). Every call streams, so the
client sees its first token; ``stream_options.include_usage`` brings the token
counts and, from engines run with ``--enable-per-request-metrics``, vLLM's own
queue time (before the first schedule).

The run's records and metrics (``summarize``) are ``autellix.workloads.run_metrics``,
shared with the simulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import openai

from autellix.client import SESSION_HEADER, THREAD_HEADER
from autellix.loadgen.flow_control_proxy import FAIRNESS_HEADER
from autellix.protocol import EXPECTED_TOKENS_FIELD
from autellix.workloads import AgentProgram, client_priority
from autellix.workloads.run_metrics import CallStat, ProgramStat, RunResult, poisson_arrivals


class HttpLLM:
    """The ``LLM`` one program talks to: streaming chat calls, simulated tools.

    ``client_priority``: send ``client_priority(tokens generated so far)`` as
    each call's vLLM ``priority`` (the ``client-plas`` baseline).
    ``reply_tokens``: the token ids the engine may generate (vLLM's
    ``allowed_token_ids``), so that replies re-tokenize to what was generated
    (``autellix.engine.tiny_model.REPLY_TOKEN_IDS``); None: any.
    ``fairness_id``: sent as llm-d's fairness header on every call (the
    ``llmd-fairness`` system's proxy reads the program from it)."""

    def __init__(self, client: openai.AsyncOpenAI, model: str, stat: ProgramStat, calls: list[CallStat],
                 session: str | None, *, stream: bool = True, client_priority: bool = False,
                 reply_tokens: Sequence[int] | None = None, fairness_id: str | None = None,
                 parent: HttpLLM | None = None) -> None:
        self._client, self._model, self._stat, self._calls = client, model, stat, calls
        self._session = session
        #: A subagent's LLM: the program that spawned it; its session opens with its first call.
        self._parent = parent
        self._opening: asyncio.Lock | None = asyncio.Lock() if parent is not None else None
        #: Subagents' sessions opened under this one (ended with the program).
        self.subagent_sessions: list[str] = []
        self._fairness_id = fairness_id
        self._stream = stream
        self._client_priority = client_priority
        self._reply_tokens = list(reply_tokens) if reply_tokens is not None else None
        self._inflight = 0

    def _extra_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ignore_eos": True}
        if self._reply_tokens is not None:
            body["allowed_token_ids"] = self._reply_tokens
        if self._client_priority:
            body["priority"] = client_priority(self._stat.tokens)
        return body

    def subagent(self, name: str) -> HttpLLM:
        """A subagent's LLM: with sessions, its own session opened as a subagent of this one (``{"parent":
        ...}``) at its first call; without (bare engines, llm-d's flow control), this program's calls."""
        return HttpLLM(self._client, self._model, self._stat, self._calls, None, stream=self._stream,
                       client_priority=self._client_priority, reply_tokens=self._reply_tokens,
                       fairness_id=self._fairness_id, parent=self)

    async def _open_subagent(self) -> None:
        parent = self._parent
        assert parent is not None and self._opening is not None
        async with self._opening:
            if self._session is None and parent._session is not None:
                self._session = await open_session(self._client, self._stat, {"parent": parent._session})
                root = parent
                while root._parent is not None:
                    root = root._parent
                root.subagent_sessions.append(self._session)

    async def chat(self, messages: list[dict[str, str]], *, max_tokens: int, thread: str | None = None) -> str:
        if self._parent is not None and self._session is None and self._parent._session is not None:
            await self._open_subagent()
        headers = {}
        if self._session is not None:
            headers[SESSION_HEADER] = self._session
            if thread is not None:
                headers[THREAD_HEADER] = thread
        if self._fairness_id is not None:
            headers[FAIRNESS_HEADER] = self._fairness_id
        call = CallStat(self._stat.program_id, thread, time.monotonic())
        self._calls.append(call)
        self._stat.calls += 1
        self._inflight += 1
        self._stat.max_parallel = max(self._stat.max_parallel, self._inflight)
        try:
            send = self._streamed if self._stream else self._whole
            text = await send(call, messages, max_tokens, headers)
        finally:
            self._inflight -= 1
            call.finished = time.monotonic()
        self._stat.tokens += call.completion_tokens
        return text

    async def _streamed(self, call: CallStat, messages: list[dict[str, str]], max_tokens: int,
                        headers: dict[str, str]) -> str:
        parts: list[str] = []
        stream = await self._client.chat.completions.create(
            model=self._model, messages=messages, max_tokens=max_tokens, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True}, extra_body=self._extra_body(), extra_headers=headers)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if call.first_token is None:
                    call.first_token = time.monotonic()
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                _read_usage(call, chunk.usage, chunk.model_extra)
        return "".join(parts)

    async def _whole(self, call: CallStat, messages: list[dict[str, str]], max_tokens: int,
                     headers: dict[str, str]) -> str:
        """One non-streamed call: far less work per token for the client and the
        gateway, so many engines can be driven from one machine. Time to first
        token then comes from the engine's per-request metrics."""
        answer = await self._client.chat.completions.create(
            model=self._model, messages=messages, max_tokens=max_tokens,  # type: ignore[arg-type]
            extra_body=self._extra_body(), extra_headers=headers)
        metrics = _read_usage(call, answer.usage, answer.model_extra)
        if isinstance(metrics.get("time_to_first_token_ms"), int | float):
            call.first_token = call.submitted + metrics["time_to_first_token_ms"] / 1e3
        return (answer.choices[0].message.content or "") if answer.choices else ""

    async def tool(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _read_usage(call: CallStat, usage: Any, extra: dict[str, Any] | None) -> dict[str, Any]:
    """Token counts, and vLLM's per-request metrics when the engine sends them."""
    if usage is not None:
        call.prompt_tokens = usage.prompt_tokens
        call.completion_tokens = usage.completion_tokens
    metrics = (extra or {}).get("metrics") or {}
    if isinstance(metrics.get("queue_time_ms"), int | float):
        call.queue_s = metrics["queue_time_ms"] / 1e3
    parts = [metrics.get(k) for k in ("queue_time_ms", "time_to_first_token_ms", "generation_time_ms")]
    if all(isinstance(v, int | float) for v in parts):
        call.engine_s = sum(parts) / 1e3  # type: ignore[arg-type]
    return metrics


async def uses_sessions(target: str) -> bool:
    """The gateway answers ``GET /ready``; a bare vLLM server does not."""
    async with aiohttp.ClientSession() as http:
        try:
            async with http.get(target.rstrip("/") + "/ready", timeout=aiohttp.ClientTimeout(total=5)) as r:
                return r.status in (200, 503) and "ready" in (await r.json(content_type=None))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False


#: Engine counters read before and after a run: the prefix cache's token hits
#: and queries, and preemptions (summed over the finished requests: vLLM's own
#: under KV pressure and the Autellix plugin's by priority alike).
ENGINE_COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
                   "vllm:request_num_preemptions_sum")


async def engine_counters(engines: Sequence[str]) -> dict[str, float]:
    """``ENGINE_COUNTERS`` summed over the engines."""
    from autellix.backends.scrape import parse_metrics

    totals = dict.fromkeys(ENGINE_COUNTERS, 0.0)
    async with aiohttp.ClientSession() as http:
        for url in engines:
            async with http.get(url.rstrip("/") + "/metrics") as r:
                for name, value in parse_metrics(await r.text(), ENGINE_COUNTERS).items():
                    totals[name] += value
    return totals


#: A refused session is tried again after its Retry-After, at most this many times (then the program fails).
MAX_REFUSED_OPENS = 60


async def open_session(client: openai.AsyncOpenAI, stat: ProgramStat, body: dict[str, Any] | None = None) -> str:
    """``POST /v1/sessions``. Under overload the gateway refuses new programs past its queue (429 with
    ``Retry-After``): the program waits that long and asks again, as a client SDK retries a 429, and its
    latency counts from its arrival (``stat.refused`` counts the refusals)."""
    while True:
        try:
            return str((await client.post("/sessions", body=body, cast_to=object))["id"])  # type: ignore[index]
        except openai.RateLimitError as exc:
            stat.refused += 1
            if stat.refused > MAX_REFUSED_OPENS:
                raise
            await asyncio.sleep(retry_after_s(exc.response.headers.get("Retry-After")))


def retry_after_s(header: str | None) -> float:
    """A ``Retry-After`` in seconds (1 s when absent or not a number of seconds)."""
    try:
        return max(0.0, float(header)) if header is not None else 1.0
    except ValueError:
        return 1.0


async def run_programs(target: str, programs: Sequence[AgentProgram], *, rate: float, seed: int, model: str,
                       engines: Sequence[str] = (), sessions: bool | None = None, stream: bool = True,
                       client_priority: bool = False, reply_tokens: Sequence[int] | None = None,
                       fairness_header: bool = False, declared: Mapping[str, int] | None = None,
                       on_done: Callable[[ProgramStat], None] | None = None, api_key: str = "none",
                       tenant_keys: Mapping[str, str] | None = None) -> RunResult:
    """Start each program at its Poisson arrival time; wait for all to finish.
    ``client_priority``: each program sends its own bucketed token count as the
    calls' vLLM priority (``client-plas``; the engine must schedule by priority).
    ``reply_tokens``: the token ids replies may use (``HttpLLM``).
    ``fairness_header``: each program names itself in llm-d's fairness header
    (``llmd-fairness``: the target is ``flow_control_proxy``).
    ``declared``: the tokens each program (by id) declares when it opens its session
    (``expected_tokens``; ``autellix-declared``).
    ``tenant_keys``: each tenant's API key: a program whose ``tenant`` is named calls with its key, the
    others with ``api_key``."""
    base = target.rstrip("/")
    if sessions is None:
        sessions = await uses_sessions(base)
    arrivals = poisson_arrivals(len(programs), rate, seed)
    calls: list[CallStat] = []
    stats: list[ProgramStat] = []
    before = await engine_counters(engines) if engines else None
    keys = {None: api_key, **(tenant_keys or {})}
    clients = {key: openai.AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=3600)
               for key in set(keys.values())}

    async def one(program: AgentProgram, at: float) -> None:
        client = clients[keys.get(program.tenant, api_key)]
        await asyncio.sleep(max(0.0, at - (time.monotonic() - started)))
        stat = ProgramStat(program.program_id, program.workload, time.monotonic())
        stats.append(stat)
        session = None
        llm: HttpLLM | None = None
        try:
            if sessions:
                tokens = (declared or {}).get(program.program_id)
                session = await open_session(client, stat, {EXPECTED_TOKENS_FIELD: tokens} if tokens else None)
            llm = HttpLLM(client, model, stat, calls, session, stream=stream, client_priority=client_priority,
                          reply_tokens=reply_tokens, fairness_id=program.program_id if fairness_header else None)
            await program.run(llm)
        except Exception as exc:  # recorded, not raised: one failed program must not stop the run
            stat.error = f"{type(exc).__name__}: {exc}"
        finally:
            stat.finish = time.monotonic()
            if session is not None:
                subagents = llm.subagent_sessions if llm is not None else []
                for ended in [*subagents[::-1], session]:  # subagents first, then their root
                    with contextlib.suppress(openai.APIError):
                        await client.delete(f"/sessions/{ended}", cast_to=object)
            if on_done is not None:
                on_done(stat)

    started = time.monotonic()
    try:
        await asyncio.gather(*(one(p, at) for p, at in zip(programs, arrivals, strict=True)))
    finally:
        for client in clients.values():
            await client.close()
    ended = time.monotonic()
    hit_rate = preemptions = None
    if before is not None:
        after = await engine_counters(engines)
        delta = {name: after[name] - before[name] for name in ENGINE_COUNTERS}
        queries = delta["vllm:prefix_cache_queries_total"]
        hit_rate = delta["vllm:prefix_cache_hits_total"] / queries if queries > 0 else None
        preemptions = delta["vllm:request_num_preemptions_sum"]
    return RunResult(stats, calls, started, ended, prefix_cache_hit_rate=hit_rate, preemptions=preemptions)
