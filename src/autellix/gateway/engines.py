"""The engine pool: discovery, health, served models, load and pricing of model time.

Discovery says which engines exist (a static list now, Kubernetes EndpointSlices
with the operator); the pool polls each one's ``/health`` and ``/metrics`` in the
background, and its ``/v1/models`` on join, on recovery and every
``MODELS_EVERY`` polls, and answers, without I/O, which engines are usable for a
model and how loaded they are. Load = running + waiting requests from the
engine's last scrape (the engine backend names the metrics), corrected by the
calls this gateway has sent or finished since that scrape.

A draining engine (``set_draining``) stays in the pool, probed and finishing its calls
in flight, but is no candidate for new calls: ``loads`` leaves it out, so the
core's balancer never picks it and a pin to it lapses (``live_pin``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from autellix.backends import EngineBackend, VllmBackend, parse_metrics
from autellix.control.background import cancel
from autellix.control.breaker import CircuitBreaker, is_failure_status
from autellix.core.engine_load import EngineLoad
from autellix.protocol import FEEDBACK_WAIT_PARAM, INFO_KV_EVENTS, INFO_MAX_NUM_SEQS, MODELS_PATH, CallRecord

log = logging.getLogger("autellix.gateway.engines")

#: Polls between two reads of an engine's served models (also read on join and recovery).
MODELS_EVERY = 5

#: Consecutive timed-out health probes that take a healthy engine out of the pool.
SLOW_PROBES_TO_UNHEALTHY = 3

#: An engine that took a call and hung is kept out of the balancer's candidates
#: for this long, doubling with each hang in a row (up to ``HUNG_BACKOFF_MAX``):
#: its health checks may still pass, and an idle-looking engine would otherwise
#: draw every new call into the same wait.
HUNG_BACKOFF = 10.0
HUNG_BACKOFF_MAX = 300.0

#: Model seconds per generated token before an engine's metrics say otherwise.
DEFAULT_SECONDS_PER_TOKEN = 0.02


class Discovery(Protocol):
    """Where engines come from. ``urls`` is polled; a change joins or drops engines. ``aclose`` lets go of
    what it holds (a watch's connection) when the pool stops."""

    async def urls(self) -> set[str]: ...

    async def aclose(self) -> None: ...


class StaticDiscovery:
    def __init__(self, urls: list[str]) -> None:
        self._urls = {u.rstrip("/") for u in urls}

    async def urls(self) -> set[str]:
        return set(self._urls)

    async def aclose(self) -> None:
        return None


@dataclass
class EngineState:
    url: str
    healthy: bool = False
    running: float = 0.0
    waiting: float = 0.0
    inflight: int = 0
    inflight_at_scrape: int = 0
    models: list[dict] = field(default_factory=list)
    #: The ids of ``models``: what the engine serves (a call goes only to an engine serving its model).
    model_ids: frozenset[str] = frozenset()
    failures: int = 0
    #: Health probes in a row that timed out (``SLOW_PROBES_TO_UNHEALTHY`` of them drop the engine).
    slow_probes: int = 0
    # For pricing model time: the engine's inference-seconds and generated-token
    # counters at the last scrape, and the price they give.
    inference_seconds: float | None = None
    generation_tokens: float | None = None
    seconds_per_token: float = DEFAULT_SECONDS_PER_TOKEN
    #: The engine runs Autellix's scheduler: each call's exact model time can
    #: be read back from it (``autellix.engine.feedback``).
    feedback: bool = False
    #: Being drained (scale-down, maintenance): finishes its calls, takes no new ones.
    draining: bool = False
    #: Hangs in a row (calls taken and not answered in time), and until when
    #: (monotonic seconds) it takes no new call because of them.
    hangs: int = 0
    hung_until: float = 0.0
    #: Real calls' outcomes (failures and 5xx in a window): open, cooldown, one half-open probe.
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    #: The KV cache: blocks in all and tokens per block (from the engine's metrics, once), the share held.
    kv_blocks: tuple[int, int] | None = None
    kv_usage: float = 0.0
    #: The calls it runs at once, as its Autellix scheduler describes it (None: not said).
    slots: int | None = None

    @property
    def load(self) -> float:
        return max(0.0, self.running + self.waiting + self.inflight - self.inflight_at_scrape, float(self.inflight))

    def set_models(self, data: object) -> None:
        """The engine's ``/v1/models`` list (malformed entries dropped)."""
        self.models = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        self.model_ids = frozenset(m["id"] for m in self.models if isinstance(m.get("id"), str))


class EnginePool:
    def __init__(self, discovery: Discovery, http: aiohttp.ClientSession, *, poll_interval: float = 1.0,
                 on_removed: Callable[[str], None] | None = None, backend: EngineBackend | None = None,
                 on_described: Callable[[str, Mapping[str, Any] | None], None] | None = None) -> None:
        self.discovery = discovery
        self.http = http
        self.backend: EngineBackend = backend or VllmBackend()
        self._polls = 0
        self.poll_interval = poll_interval
        self.probe_timeout = max(2.0, poll_interval * 2)
        self.on_removed = on_removed
        #: An engine turned healthy and described its KV cache events (``INFO_KV_EVENTS``; None: none).
        self.on_described = on_described
        self.engines: dict[str, EngineState] = {}
        #: Sessions' ends on their way to the engines (``program_ended``).
        self._notices: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task | None = None
        self.ready = asyncio.Event()

    # ---- what the request path reads (no I/O) --------------------------------
    @staticmethod
    def _takes_calls(engine: EngineState, now: float) -> bool:
        """Healthy, not draining, not backing off a hang, its breaker letting calls through."""
        return engine.healthy and not engine.draining and engine.hung_until <= now and engine.breaker.allows(now)

    def loads(self, exclude: Collection[str] = frozenset()) -> dict[str, float]:
        """Load of every engine that may take a new call."""
        now = time.monotonic()
        return {u: e.load for u, e in self.engines.items() if u not in exclude and self._takes_calls(e, now)}

    def available(self) -> bool:
        """Whether any engine may take a new call: ``bool(loads())``, without building the loads."""
        now = time.monotonic()
        return any(self._takes_calls(e, now) for e in self.engines.values())

    def candidates(self, model: str, exclude: Collection[str] = frozenset()) -> dict[str, float]:
        """``loads`` of the engines that serve ``model``: a call never goes to one that does not."""
        now = time.monotonic()
        return {u: e.load for u, e in self.engines.items()
                if u not in exclude and model in e.model_ids and self._takes_calls(e, now)}

    def models(self) -> list[dict]:
        """Every model a healthy engine serves, each once (the first engine's description)."""
        merged: dict[str, dict] = {}
        for engine in sorted(self.engines.values(), key=lambda e: e.url):
            if engine.healthy:
                for model in engine.models:
                    if isinstance(model.get("id"), str):
                        merged.setdefault(model["id"], model)
        return list(merged.values())

    def engine_loads(self, slots: int) -> list[EngineLoad]:
        """Use and capacity of every healthy engine whose KV cache is known (program admission's view);
        ``slots``: each engine's running slots (vLLM's ``max_num_seqs``, which its metrics do not say)."""
        out = []
        for e in self.engines.values():
            if e.healthy and e.kv_blocks is not None:
                blocks, size = e.kv_blocks
                out.append(EngineLoad(running=round(e.running), waiting=round(e.waiting), slots=slots,
                                      kv_blocks_used=round(e.kv_usage * blocks), kv_blocks_total=blocks,
                                      kv_block_size=size))
        return out

    def serves(self, model: str) -> bool:
        return any(model in e.model_ids for e in self.engines.values() if e.healthy)

    def set_draining(self, url: str, draining: bool) -> EngineState:
        """Drain or undrain an engine of the pool; KeyError if it is not in the pool."""
        engine = self.engines[url.rstrip("/")]
        if engine.draining != draining:
            engine.draining = draining
            log.info("engine %s %s", engine.url, "draining" if draining else "undrained")
        return engine

    def describe(self) -> list[dict[str, object]]:
        """Every engine of the pool, for the admin API (what an autoscaler polls)."""
        now = time.monotonic()
        return [{"url": e.url, "healthy": e.healthy, "draining": e.draining, "load": e.load,
                 "inflight": e.inflight, "running": e.running, "waiting": e.waiting, "slots": e.slots,
                 "models": sorted(e.model_ids), "failures": e.failures,
                 "hung_backoff_s": round(max(0.0, e.hung_until - now), 3), "breaker": e.breaker.describe(now)}
                for e in sorted(self.engines.values(), key=lambda e: e.url)]

    def begin(self, url: str) -> None:
        engine = self.engines[url]
        engine.inflight += 1
        engine.breaker.begin(time.monotonic())  # in half-open: this call is the probe

    def record_answer(self, url: str, status: int) -> bool:
        """An engine's answer, for its breaker: a 5xx counts against it. True when that opened it."""
        engine = self.engines.get(url)
        if engine is None:
            return False
        before = engine.breaker.opened_total
        engine.breaker.record(not is_failure_status(status), time.monotonic())
        return engine.breaker.opened_total > before

    def end(self, url: str) -> None:
        if url in self.engines:
            self.engines[url].inflight -= 1

    def mark_hung(self, url: str) -> None:
        """The engine took a call and never answered: keep it out, longer each time in a row."""
        engine = self.engines.get(url)
        if engine is not None:
            engine.hangs += 1
            backoff = min(HUNG_BACKOFF_MAX, HUNG_BACKOFF * 2 ** (engine.hangs - 1))
            engine.hung_until = time.monotonic() + backoff
            engine.failures += 1
            log.warning("engine %s took a call and sent nothing (%d in a row); no new calls for %.0f s",
                        url, engine.hangs, backoff)

    def failed(self, url: str, *, hung: bool) -> None:
        """An attempt failed there (the request controller's ``EngineDirectory``)."""
        engine = self.engines.get(url)
        if engine is not None:
            engine.breaker.record(False, time.monotonic())
        if hung:
            self.mark_hung(url)
        else:
            self.mark_failed(url)

    def answered(self, url: str) -> None:
        self.mark_answered(url)

    def mark_answered(self, url: str) -> None:
        """The engine answered a call: a run of hangs is over."""
        engine = self.engines.get(url)
        if engine is not None and engine.hangs:
            engine.hangs = 0

    def mark_failed(self, url: str) -> None:
        """A connection failed: stop routing there until a health check passes."""
        engine = self.engines.get(url)
        if engine is not None:
            engine.healthy = False
            engine.failures += 1
            log.warning("engine %s failed; out of the pool until healthy", url)

    async def call_record(self, url: str, call_id: str) -> CallRecord | None:
        """The plugin's record of a finished call (its model time), if the engine
        runs Autellix's scheduler; None otherwise or if it does not come in time."""
        engine = self.engines.get(url)
        path = self.backend.record_path(call_id)
        if engine is None or not engine.feedback or path is None:
            return None
        try:
            async with self.http.get(url + path, params={FEEDBACK_WAIT_PARAM: "1"},
                                     timeout=aiohttp.ClientTimeout(total=3)) as r:
                data = await r.json() if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return CallRecord.from_dict(data) if isinstance(data, dict) else None

    def program_ended(self, program_id: str, engines: Collection[str]) -> None:
        """Tell the engines ``program_id`` ran on (those running Autellix's scheduler) that its session ended,
        so that they drop the prefix they hold for it; in the background, best effort: an engine that does
        not hear it gives the hold up under memory pressure, or once the pause outlasts its idle time."""
        path = self.backend.program_path(program_id)
        urls = [url for url in engines if (engine := self.engines.get(url)) is not None and engine.feedback]
        if path is None or not urls:
            return
        task = asyncio.create_task(self._tell_ended(path, urls), name="program-ended")
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

    async def _tell_ended(self, path: str, urls: list[str]) -> None:
        async def tell(url: str) -> None:
            try:
                async with self.http.delete(url + path, timeout=aiohttp.ClientTimeout(total=2)) as answer:
                    if answer.status >= 400:
                        log.debug("engine %s: a session's end answered %d", url, answer.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.debug("engine %s: a session's end not told (%r)", url, exc)

        await asyncio.gather(*(tell(url) for url in urls))

    def seconds_per_token(self, url: str) -> float:
        engine = self.engines.get(url)
        return engine.seconds_per_token if engine else DEFAULT_SECONDS_PER_TOKEN

    def slots(self, url: str) -> int | None:
        engine = self.engines.get(url)
        return engine.slots if engine else None

    # ---- background polling --------------------------------------------------
    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="engine-pool")

    async def stop(self) -> None:
        await cancel(self._task)
        for notice in list(self._notices):
            await cancel(notice)
        await self.discovery.aclose()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                await self.refresh()
            except Exception:  # keep polling whatever one round did
                log.exception("engine poll failed")

    async def refresh(self) -> None:
        urls = await self.discovery.urls()
        for url in urls - self.engines.keys():
            self.engines[url] = EngineState(url)
            log.info("engine %s joined", url)
        for url in set(self.engines) - urls:
            del self.engines[url]
            log.info("engine %s left", url)
            if self.on_removed:
                self.on_removed(url)
        self._polls += 1
        await asyncio.gather(*(self._probe(e) for e in list(self.engines.values())))
        if any(e.healthy for e in self.engines.values()):
            self.ready.set()
        else:
            self.ready.clear()

    async def _probe(self, engine: EngineState) -> None:
        timeout = aiohttp.ClientTimeout(total=self.probe_timeout)
        try:
            async with self.http.get(engine.url + "/health", timeout=timeout) as r:
                healthy = r.status == 200
            if healthy:
                inflight = engine.inflight
                async with self.http.get(engine.url + "/metrics", timeout=timeout) as r:
                    text = await r.text()
                self._read_metrics(engine, parse_metrics(text, self.backend.pool_metrics), inflight)
                if engine.kv_blocks is None:
                    engine.kv_blocks = self.backend.kv_blocks(text)
                if not engine.models or not engine.healthy or self._polls % MODELS_EVERY == 0:
                    # served models change with a redeploy behind the same address
                    async with self.http.get(engine.url + MODELS_PATH, timeout=timeout) as r:
                        payload = await r.json()
                        engine.set_models(payload.get("data") if isinstance(payload, dict) else None)
                if not engine.healthy and (info := self.backend.info_path()) is not None:
                    async with self.http.get(engine.url + info, timeout=timeout) as r:
                        engine.feedback = r.status == 200
                        described = await r.json() if engine.feedback else None
                    described = described if isinstance(described, dict) else {}
                    slots = described.get(INFO_MAX_NUM_SEQS)
                    engine.slots = slots if isinstance(slots, int) and not isinstance(slots, bool) and slots > 0 \
                        else None
                    if self.on_described is not None:
                        events = described.get(INFO_KV_EVENTS)
                        self.on_described(engine.url, events if isinstance(events, dict) else None)
        except TimeoutError as exc:
            # A slow answer is not a dead engine: under a burst the engine (or
            # this gateway) can take seconds to answer. Only a run of them
            # counts; a refused connection or an error status counts at once.
            engine.slow_probes += 1
            healthy = engine.healthy and engine.slow_probes < SLOW_PROBES_TO_UNHEALTHY
            if engine.healthy and not healthy:
                log.warning("engine %s unhealthy: %d probes in a row timed out (%r)", engine.url,
                            engine.slow_probes, exc)
            engine.healthy = healthy
            return
        except (aiohttp.ClientError, ValueError) as exc:
            if engine.healthy:
                log.warning("engine %s unhealthy: %r", engine.url, exc)
            healthy = False
        engine.slow_probes = 0
        engine.healthy = healthy

    def _read_metrics(self, engine: EngineState, m: dict[str, float], inflight: int) -> None:
        load = self.backend.load(m)
        engine.running, engine.waiting = load.running, load.waiting
        engine.kv_usage = self.backend.kv_usage(m) or 0.0
        engine.inflight_at_scrape = inflight
        counters = self.backend.price_counters(m)
        if counters is None:
            return
        seconds, tokens = counters
        if engine.inference_seconds is not None and engine.generation_tokens is not None:
            d_seconds, d_tokens = seconds - engine.inference_seconds, tokens - engine.generation_tokens
            if d_tokens > 0 and d_seconds > 0:  # smooth over scrapes; a restart resets the counters
                engine.seconds_per_token = 0.7 * engine.seconds_per_token + 0.3 * (d_seconds / d_tokens)
        engine.inference_seconds, engine.generation_tokens = seconds, tokens

