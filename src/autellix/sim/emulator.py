"""An emulated vLLM server: the simulator's engine model behind vLLM's HTTP API, in real time.

``autellix emulate`` serves the subset of vLLM's OpenAI server that the gateway
and the benchmark use: ``/v1/completions`` and ``/v1/chat/completions`` (whole
or streamed, ``priority``, ``vllm_xargs``, ``ignore_eos``, usage and
per-request ``metrics``), ``/v1/models``, ``/health``, ``/metrics`` with vLLM's
metric names, and, when it runs Autellix's scheduler, the plugin's feedback
endpoints (``autellix.engine.feedback``), its KV cache events included
(``autellix.sim.kv_events``: vLLM's wire, vLLM's block hashes) with the
tokenizer they are hashed from. Each request becomes a
:class:`~autellix.sim.engine_request.SimRequest`; one task per engine steps the
:class:`~autellix.sim.engine_model.EngineModel` and sleeps each step's modelled
duration, so many engines (8, 16) run in one process on a 2-core machine.
``time_scale`` stretches or shrinks model time (0.1: ten times faster than the
profiled hardware); every time the server reports is wall time. ``coalesce``
runs stretches of decode-only steps as one (the simulator's ``step_until``),
so one process keeps up with many fast engines; calls that arrive during a
stretch wait for its end.

Text is bytes, as with the tiny model: one token is one UTF-8 byte of the
prompt rendered by the tiny model's chat template (``tiny_model.render_chat``:
prefix-stable, so a conversation's history shares cached blocks, and the
template the gateway fetches to hash prompts), and every generated token is
one letter, whose blocks the next turn that repeats the reply finds cached.
There is no end-of-sequence token: a call generates ``max_tokens`` (default:
what is left of the context), as an ``ignore_eos`` call does.

Faults, for testing the gateway (``POST /emulator/faults``, ``DELETE`` clears):
``refuse_for`` seconds (as if the engine restarted: open connections drop,
calls in flight included, and new ones are refused),
``hang`` (new calls are accepted and never answered), ``drop_after_tokens``
(streams are cut after that many tokens), ``slowdown`` (steps take that many
times longer).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from autellix.child_processes import autellix_process, free_ports
from autellix.core import SchedulerConfig, VllmBlockHasher
from autellix.engine.kv_events import read_tokenizer, tokenizer_files
from autellix.engine.tiny_model import build_tiny_model, default_model_dir, render_chat
from autellix.gateway.errors import error_response
from autellix.protocol import (
    CALL_HEADER,
    FEEDBACK_CALL_ROUTE,
    FEEDBACK_INFO_PATH,
    FEEDBACK_TOKENIZER_PATH,
    INFO_KV_EVENTS,
    INFO_MAX_NUM_SEQS,
    RECORD_HEADER,
    XARG_CALL,
    XARG_DECLARED,
    XARG_PROGRAM,
    XARG_SERVICE,
    XARG_THREAD,
    XARG_TREE,
    XARG_WAIT,
    APIError,
    record_header_value,
)
from autellix.sim.engine_model import SCHEDULERS, EngineModel
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.engine_request import SimRequest, StepResult
from autellix.sim.kv_cache import block_hashes, vllm_block_hashes
from autellix.sim.kv_events import KvEventPublisher

log = logging.getLogger("autellix.sim.emulator")

#: A metric kind of ``EngineMetrics``.
M = TypeVar("M", Counter, Gauge, Histogram)

#: The letter every generated token decodes to, and its token id (a byte).
TOKEN_TEXT = "a"
TOKEN_ID = ord(TOKEN_TEXT)
FAULTS_PATH = "/emulator/faults"


def render_messages(messages: Sequence[dict[str, Any]]) -> str:
    """The tiny model's chat template over messages as the emulator takes them (a missing role is the user's)."""
    return render_chat([{"role": str(m.get("role") or "user"), "content": _content(m.get("content"))}
                        for m in messages])


def _content(content: Any) -> str:
    """A message's text: a string, or its text parts joined as vLLM joins them."""
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content
                         if isinstance(part, dict) and isinstance(part.get("text"), str))
    return "" if content is None else str(content)


def prompt_tokens(text: str) -> list[int]:
    return list(text.encode("utf-8"))


class BadRequest(APIError):
    """A request the emulated engine refuses, as vLLM would (400 unless told)."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(status, message, param=param, code=code or "invalid_request")


@dataclass
class Faults:
    hang: bool = False
    drop_after_tokens: int | None = None
    slowdown: float = 1.0
    refuse_until: float = 0.0

    @classmethod
    def parse(cls, body: Any) -> tuple[Faults, float]:
        """(faults, refuse_for seconds); raises BadRequest on anything malformed."""
        if not isinstance(body, dict):
            raise BadRequest("The body must be a JSON object.")
        unknown = set(body) - {"hang", "drop_after_tokens", "slowdown", "refuse_for"}
        if unknown:
            raise BadRequest(f"Unknown fault(s): {', '.join(sorted(unknown))}.", param=sorted(unknown)[0])
        faults = cls()
        if "hang" in body:
            if not isinstance(body["hang"], bool):
                raise BadRequest("'hang' must be a boolean.", param="hang")
            faults.hang = body["hang"]
        drop = body.get("drop_after_tokens")
        if drop is not None:
            if not isinstance(drop, int) or isinstance(drop, bool) or drop < 0:
                raise BadRequest("'drop_after_tokens' must be an integer >= 0.", param="drop_after_tokens")
            faults.drop_after_tokens = drop
        slowdown = body.get("slowdown", 1.0)
        if not isinstance(slowdown, int | float) or isinstance(slowdown, bool) or not 0 < slowdown <= 1000:
            raise BadRequest("'slowdown' must be a number in (0, 1000].", param="slowdown")
        faults.slowdown = float(slowdown)
        refuse = body.get("refuse_for", 0.0)
        if not isinstance(refuse, int | float) or isinstance(refuse, bool) or not 0 <= refuse <= 3600:
            raise BadRequest("'refuse_for' must be seconds in [0, 3600].", param="refuse_for")
        return faults, float(refuse)

    def to_dict(self) -> dict[str, Any]:
        return {"hang": self.hang, "drop_after_tokens": self.drop_after_tokens, "slowdown": self.slowdown,
                "refusing": self.refuse_until > time.monotonic()}


@dataclass
class Call:
    """One request inside the emulator: its tokens arrive on ``events`` as steps finish."""

    request: SimRequest
    arrived: float
    gateway_call: str | None
    events: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    generated: int = 0
    #: Wall time of the call's first step, first token and end.
    scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    service: float = 0.0
    preemptions: int = 0


class EngineMetrics:
    """vLLM's metric names, the ones the gateway and the benchmark read."""

    def __init__(self, model: str) -> None:
        self.registry = r = CollectorRegistry()

        def of_model(kind: type[M], name: str, doc: str) -> M:
            return kind(name, doc, ["model_name"], registry=r).labels(model)

        self.running = of_model(Gauge, "vllm:num_requests_running", "Requests in the batch.")
        self.waiting = of_model(Gauge, "vllm:num_requests_waiting", "Requests waiting.")
        self.kv_usage = of_model(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage (0-1).")
        self.prompt_tokens = of_model(Counter, "vllm:prompt_tokens", "Prefill tokens.")
        self.generation_tokens = of_model(Counter, "vllm:generation_tokens", "Generated tokens.")
        self.preemptions = of_model(Counter, "vllm:num_preemptions", "Preemptions.")
        self.cache_queries = of_model(Counter, "vllm:prefix_cache_queries", "Prefix-cache queried tokens.")
        self.cache_hits = of_model(Counter, "vllm:prefix_cache_hits", "Prefix-cache hit tokens.")
        self.inference_time = of_model(Histogram, "vllm:request_inference_time_seconds", "Time running.")
        self.queue_time = of_model(Histogram, "vllm:request_queue_time_seconds", "Time waiting.")
        self.ttft = of_model(Histogram, "vllm:time_to_first_token_seconds", "Time to first token.")
        self.e2e = of_model(Histogram, "vllm:e2e_request_latency_seconds", "End-to-end latency.")
        #: Not vLLM's: how often a call's record was asked for by a request of its own
        #: (one that came with its answer is not), so tests see which way records go.
        self.record_requests = Counter("autellix_emulator_record_requests", "GETs of call records.",
                                       registry=r)


class EmulatedEngine:
    """One engine: the engine model, stepped in (scaled) real time."""

    def __init__(self, profile: EngineProfile, *, model_name: str = "emulated", scheduler: str = "autellix",
                 config: SchedulerConfig | None = None, prefix_caching: bool = True, time_scale: float = 1.0,
                 max_model_len: int | None = None, coalesce: float = 0.0,
                 kv_events: tuple[str, str] | None = None) -> None:
        if scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {scheduler!r}; choose from {', '.join(SCHEDULERS)}")
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.profile, self.model_name, self.scheduler = profile, model_name, scheduler
        #: Publishes the prefix cache's blocks as vLLM does (``kv_events``: the publisher's and the replay's
        #: endpoints); blocks are then named by vLLM's hashes.
        self.kv_events = KvEventPublisher(*kv_events, block_size=profile.block_size) \
            if kv_events is not None and prefix_caching else None
        hashes = vllm_block_hashes(VllmBlockHasher(profile.block_size)) if self.kv_events else block_hashes
        self.model = EngineModel(profile, scheduler=scheduler, config=config, prefix_caching=prefix_caching,
                                 block_hashes=hashes)
        self.model.pool.events = self.kv_events
        #: The info's ``kv_events`` (None: it publishes none).
        self.description = self._describe_kv_events()
        self.time_scale = time_scale
        #: Model seconds of decode-only steps run as one (0: every step on its own).
        #: Fewer wake-ups let one process emulate many engines; a call that
        #: arrives meanwhile waits for the end of the stretch.
        self.coalesce = coalesce
        self.max_model_len = max_model_len or profile.max_model_len
        self.faults = Faults()
        self.metrics = EngineMetrics(model_name)
        self.calls: dict[str, Call] = {}
        self.records: dict[str, dict[str, Any]] = {}
        #: Numbers the ids of this engine's answers.
        self.answer_ids = itertools.count()
        self._record_ready = asyncio.Condition()
        self._work = asyncio.Event()
        self._t0 = time.monotonic()
        self._task: asyncio.Task | None = None
        self.steps = 0
        self._totals: dict[str, float] = {}
        #: Closes the listening socket for some seconds; set by ``serve``, which owns it.
        self.refuse: Callable[[float], None] = lambda seconds: None

    # ---- clock: model seconds since start, from wall time -------------------
    def now(self) -> float:
        return (time.monotonic() - self._t0) / self.time_scale

    # ---- the step loop ---------------------------------------------------------
    def start(self) -> None:
        if self.kv_events is not None:
            self.kv_events.start()
        self._task = asyncio.create_task(self._run(), name=f"emulated-engine-{self.model_name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.kv_events is not None:
            await self.kv_events.stop()

    def _describe_kv_events(self) -> dict[str, Any] | None:
        """The info's ``kv_events``: where this engine publishes and how it names blocks, with the tiny
        model's tokenizer files (the emulator's tokens are its bytes)."""
        if self.kv_events is None:
            return None
        try:
            files = tokenizer_files(str(build_tiny_model(default_model_dir())))
        except (OSError, ImportError) as exc:  # no cache to write it to, or no tokenizers library
            log.warning("no tokenizer files to describe: %r", exc)
            files = {}
        return {**self.kv_events.description(), "tokenizer_files": files}

    async def _run(self) -> None:
        deadline = time.monotonic()
        while True:
            if self.model.idle:
                self._work.clear()
                await self._work.wait()
                deadline = time.monotonic()
                continue
            now = self.now()
            result = self.model.step_until(now, now + self.coalesce) if self.coalesce > 0 else self.model.step(now)
            self.steps += 1
            # An absolute schedule: a late wake-up shortens the next sleep, so
            # model time does not drift behind wall time over many steps.
            deadline = max(deadline, time.monotonic() - 0.05) + result.seconds * self.faults.slowdown * self.time_scale
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            self._apply(result, result.seconds * self.faults.slowdown * self.time_scale)
            if self.kv_events is not None:
                self.kv_events.flush()

    def _apply(self, result: StepResult, wall_seconds: float) -> None:
        wall = time.monotonic()
        m = self.metrics
        m.prompt_tokens.inc(result.prefill_tokens)
        for rid, produced in result.tokens.items():
            call = self.calls.get(rid)
            if call is None:
                continue
            if call.scheduled is None:
                call.scheduled = wall - wall_seconds
            call.generated += produced
            for _ in range(produced):
                call.events.put_nowait(1)
        for rid in result.first_token:
            if (call := self.calls.get(rid)) is not None and call.first_token is None:
                call.first_token = wall
                m.ttft.observe(wall - call.arrived)
        for rid in result.preempted:
            if (call := self.calls.get(rid)) is not None:
                call.preemptions += 1
        for rid in result.finished:
            outcome = result.outcomes.get(rid)
            if (call := self.calls.get(rid)) is not None and outcome is not None:
                call.service = outcome.model_time * self.time_scale * self.faults.slowdown
            self._finish(rid, wall, finished=True)
        self._sync_counters()

    def _sync_counters(self) -> None:
        """vLLM's counters from the engine model's own totals (they only grow)."""
        stats, m = self.model.stats(), self.metrics
        for counter, key in ((m.generation_tokens, "generated_tokens"), (m.preemptions, "preemptions"),
                             (m.cache_queries, "prefix_queries_tokens"), (m.cache_hits, "prefix_hits_tokens")):
            delta = stats.get(key, 0.0) - self._totals.get(key, 0.0)
            if delta > 0:
                counter.inc(delta)
            self._totals[key] = stats.get(key, 0.0)
        m.running.set(stats.get("running", 0.0))
        m.waiting.set(stats.get("waiting", 0.0))
        m.kv_usage.set(stats.get("kv_usage", 0.0))

    def _finish(self, rid: str, wall: float, *, finished: bool) -> None:
        call = self.calls.pop(rid, None)
        if call is None:
            return
        call.finished = wall
        call.events.put_nowait(None)
        if finished:
            m = self.metrics
            m.inference_time.observe(call.service)
            m.queue_time.observe((call.scheduled or wall) - call.arrived)
            m.e2e.observe(wall - call.arrived)
        if call.gateway_call is not None and self.scheduler == "autellix":
            self.records[call.gateway_call] = {
                "call": call.gateway_call, "program": call.request.program_id or rid, "finished": finished,
                "service_s": call.service, "wait_s": max(0.0, wall - call.arrived - call.service),
                "steps": 0, "promotions": 0, "demotions": 0, "preemptions": call.preemptions,
            }
            while len(self.records) > 100_000:
                self.records.pop(next(iter(self.records)))

    # ---- requests ----------------------------------------------------------------
    def submit(self, prompt: list[int], max_tokens: int | None, priority: int, xargs: dict[str, Any]) -> Call:
        room = self.max_model_len - len(prompt)
        if room < 1:
            raise BadRequest(f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                             f"requested {len(prompt)} tokens in the messages.", param="messages")
        if max_tokens is None:
            max_tokens = room
        elif max_tokens > room:
            raise BadRequest(f"'max_tokens' is too large: {max_tokens}. This model's maximum context length is "
                             f"{self.max_model_len} tokens and your request has {len(prompt)} input tokens.",
                             param="max_tokens")
        scale = self.time_scale
        service, wait = xargs.get(XARG_SERVICE), xargs.get(XARG_WAIT)
        request = SimRequest(
            request_id=f"emu-{uuid.uuid4().hex}", prompt=prompt, max_tokens=max_tokens,
            output=[TOKEN_ID] * max_tokens,
            program_id=_text(xargs.get(XARG_PROGRAM)), thread_id=_text(xargs.get(XARG_THREAD)), priority=priority,
            service=service / scale if isinstance(service, int | float) else None,
            wait=wait / scale if isinstance(wait, int | float) else None, tree=_text(xargs.get(XARG_TREE)),
            declared=declared / scale if isinstance(declared := xargs.get(XARG_DECLARED), int | float) else None)
        call = Call(request, time.monotonic(), _text(xargs.get(XARG_CALL)))
        self.calls[request.request_id] = call
        self.model.add(request, self.now())
        self._work.set()
        return call

    def abort(self, call: Call) -> None:
        rid = call.request.request_id
        if rid in self.calls:
            self.model.abort(rid, self.now())
            self._finish(rid, time.monotonic(), finished=False)
            self._sync_counters()

    async def record(self, call_id: str, wait: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + wait
        while (record := self.records.pop(call_id, None)) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        return record


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(body: dict[str, Any], name: str, *, minimum: int, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise BadRequest(f"'{name}' must be an integer >= {minimum}.", param=name)
    return value


def parse_request(body: Any, *, chat: bool, model_name: str) -> tuple[list[int], dict[str, Any]]:
    """(prompt tokens, options) of an OpenAI request; raises BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    if body.get("model") != model_name:
        raise BadRequest(f"The model `{body.get('model')}` does not exist.", status=404, param="model",
                         code="model_not_found")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("'messages' must be a non-empty list of objects.", param="messages")
        text = render_messages(messages)
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequest("'prompt' must be a string.", param="prompt")
        text = prompt
    xargs = body.get("vllm_xargs") or {}
    if not isinstance(xargs, dict):
        raise BadRequest("'vllm_xargs' must be an object.", param="vllm_xargs")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise BadRequest("'stream_options' must be an object.", param="stream_options")
    options = {
        "max_tokens": _int(body, "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens",
                           minimum=1, default=None),
        "priority": _int(body, "priority", minimum=-(2**62), default=0),
        "stream": bool(body.get("stream", False)),
        "usage": bool(stream_options.get("include_usage")),
        "xargs": xargs,
    }
    return prompt_tokens(text), options


#: Where an emulator app keeps its engine.
ENGINE_KEY: web.AppKey[EmulatedEngine] = web.AppKey("engine", EmulatedEngine)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Refusals in OpenAI's shape, as the gateway answers them (``autellix.gateway.errors``)."""
    try:
        return await handler(request)
    except APIError as exc:
        return error_response(exc)


async def _generate(request: web.Request, *, chat: bool) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    if engine.faults.hang:
        await asyncio.Event().wait()  # accepted, never answered (until the client gives up)
    prompt, options = parse_request(await _json_body(request), chat=chat, model_name=engine.model_name)
    call = engine.submit(prompt, options["max_tokens"], options["priority"], options["xargs"])
    kind = "chat.completion" if chat else "text_completion"
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(engine.answer_ids)}"
    created = int(time.time())
    try:
        if options["stream"]:
            return await _stream(request, engine, call, rid, kind, created, chat, options["usage"])
        while await call.events.get() is not None:
            pass
        return _whole(request, engine, call, rid, kind, created, chat)
    finally:
        engine.abort(call)  # no-op once finished; frees the engine when the client went away


def _whole(request: web.Request, engine: EmulatedEngine, call: Call, rid: str, kind: str, created: int,
           chat: bool) -> web.Response:
    text = TOKEN_TEXT * call.generated
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
    choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    out = {"id": rid, "object": kind, "created": created, "model": engine.model_name, "choices": [choice],
           "usage": _usage(call), "metrics": _call_metrics(call)}
    # as the plugin's middleware does: the record in the answer, for a call that names itself
    gateway_call = request.headers.get(CALL_HEADER)
    record = engine.records.pop(gateway_call, None) if gateway_call else None
    headers = {RECORD_HEADER: record_header_value(record)} if record is not None else None
    return web.Response(body=orjson.dumps(out), content_type="application/json", headers=headers)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response({"object": "list", "data": [{
        "id": engine.model_name, "object": "model", "created": 0, "owned_by": "autellix-emulator",
        "max_model_len": engine.max_model_len}]})


async def health(_: web.Request) -> web.Response:
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[ENGINE_KEY].metrics.registry), content_type="text/plain")


async def info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    if engine.scheduler != "autellix":
        raise APIError(404, "No Autellix scheduler runs behind this server.", code="not_found")
    return web.json_response({"scheduler": "autellix", "emulated": True, "profile": engine.profile.name,
                              "time_scale": engine.time_scale, INFO_MAX_NUM_SEQS: engine.profile.max_num_seqs,
                              INFO_KV_EVENTS: engine.description})


async def tokenizer(request: web.Request) -> web.Response:
    files = await asyncio.to_thread(read_tokenizer, request.app[ENGINE_KEY].description)
    if files is None:
        raise APIError(404, "This engine does not describe its tokenizer.", code="not_found")
    return web.json_response(files)


async def call_record(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    try:
        wait = min(max(float(request.query.get("wait", "0")), 0.0), 5.0)
    except ValueError:
        wait = 0.0
    engine.metrics.record_requests.inc()
    record = await engine.record(request.match_info["call_id"], wait)
    if record is None:
        raise APIError(404, "No record for this call.", code="not_found")
    return web.json_response(record)


async def get_faults(request: web.Request) -> web.Response:
    return web.json_response(request.app[ENGINE_KEY].faults.to_dict())


async def set_faults(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    faults, refuse_for = Faults.parse(await _json_body(request))
    if refuse_for > 0:
        faults.refuse_until = time.monotonic() + refuse_for
    engine.faults = faults
    if refuse_for > 0:
        engine.refuse(refuse_for)
    return web.json_response(faults.to_dict())


async def clear_faults(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    engine.faults = Faults()
    return web.json_response(engine.faults.to_dict())


def build_app(engine: EmulatedEngine) -> web.Application:
    """vLLM's HTTP API (the parts a gateway uses) and the fault controls, over ``engine``."""
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[_errors])
    app[ENGINE_KEY] = engine
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get(FEEDBACK_INFO_PATH, info)
    app.router.add_get(FEEDBACK_CALL_ROUTE, call_record)
    app.router.add_get(FEEDBACK_TOKENIZER_PATH, tokenizer)
    app.router.add_get(FAULTS_PATH, get_faults)
    app.router.add_post(FAULTS_PATH, set_faults)
    app.router.add_delete(FAULTS_PATH, clear_faults)
    return app


async def _json_body(request: web.Request) -> Any:
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"The body is not valid JSON: {exc}.") from exc


def _usage(call: Call) -> dict[str, int]:
    prompt = len(call.request.prompt)
    return {"prompt_tokens": prompt, "completion_tokens": call.generated, "total_tokens": prompt + call.generated}


def _call_metrics(call: Call) -> dict[str, float]:
    """vLLM's per-request metrics (``--enable-per-request-metrics``), in milliseconds."""
    end = call.finished or time.monotonic()
    scheduled = call.scheduled if call.scheduled is not None else end
    first = call.first_token if call.first_token is not None else end
    return {"queue_time_ms": (scheduled - call.arrived) * 1e3, "time_to_first_token_ms": (first - call.arrived) * 1e3,
            "generation_time_ms": (end - first) * 1e3}


async def _stream(request: web.Request, engine: EmulatedEngine, call: Call, rid: str, kind: str, created: int,
                  chat: bool, usage: bool) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    chunk_kind = kind + ".chunk" if chat else kind
    drop_after = engine.faults.drop_after_tokens

    def event(choice_body: dict[str, Any], finish: str | None) -> bytes:
        choice = {"index": 0, "finish_reason": finish, "logprobs": None, **choice_body}
        body = {"id": rid, "object": chunk_kind, "created": created, "model": engine.model_name, "choices": [choice]}
        return b"data: " + orjson.dumps(body) + b"\n\n"

    sent = 0
    if chat:
        await response.write(event({"delta": {"role": "assistant", "content": ""}}, None))
    while await call.events.get() is not None:
        if drop_after is not None and sent >= drop_after:
            # Cut the connection the way a crashing engine does: no closing event.
            if request.transport is not None:
                request.transport.abort()
            return response
        sent += 1
        await response.write(event({"delta": {"content": TOKEN_TEXT}} if chat else {"text": TOKEN_TEXT}, None))
    await response.write(event({"delta": {}} if chat else {"text": ""}, "length"))
    if usage:
        body = {"id": rid, "object": chunk_kind, "created": created, "model": engine.model_name, "choices": [],
                "usage": _usage(call), "metrics": _call_metrics(call)}
        await response.write(b"data: " + orjson.dumps(body) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def serve(engines: Sequence[EmulatedEngine], host: str, ports: Sequence[int]) -> None:
    """Serve each engine on its port until cancelled."""
    runners: list[web.AppRunner] = []
    try:
        for engine, port in zip(engines, ports, strict=True):
            app = build_app(engine)
            runner = web.AppRunner(app, handler_cancellation=True)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, host, port)
            await site.start()
            engine.start()
            engine.refuse = _refuser(runner, host, port)
            log.info("emulated engine %s (%s, %s) on http://%s:%d", engine.model_name, engine.profile.name,
                     engine.scheduler, host, port)
        await asyncio.Event().wait()
    finally:
        for engine in engines:
            await engine.stop()
        for runner in runners:
            await runner.cleanup()


def _refuser(runner: web.AppRunner, host: str, port: int) -> Callable[[float], None]:
    """Close the engine's listening socket for a while: new connections are refused."""
    tasks: set[asyncio.Future[None]] = set()  # held until done: the loop keeps only weak references

    def refuse(seconds: float) -> None:
        async def cycle() -> None:
            await asyncio.sleep(0.05)  # let the answer to the fault request go out first
            for site in list(runner.sites):
                await site.stop()
            # Kept-alive connections would still reach it: drop them all, calls
            # in flight included, as an engine that restarts does.
            for connection in runner.server.connections if runner.server else ():
                connection.force_close()
            await asyncio.sleep(seconds)
            await web.TCPSite(runner, host, port).start()

        tasks.add(task := asyncio.ensure_future(cycle()))
        task.add_done_callback(tasks.discard)

    return refuse


@contextlib.contextmanager
def emulator_process(count: int, *args: str, log_path: Path | None = None,
                     timeout: float = 60.0) -> Iterator[list[str]]:
    """``autellix emulate`` serving ``count`` engines in one child process; yields their URLs."""
    ports = free_ports(count)
    cmd = ["emulate", *(f"--port={p}" for p in ports), *args]
    with autellix_process(cmd, ports[0], log_path=log_path, timeout=timeout) as first:
        yield [first, *(f"http://127.0.0.1:{p}" for p in ports[1:])]
