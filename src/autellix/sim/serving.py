"""The program-level simulator: the benchmark's agent programs on modelled engines.

The same programs as ``autellix bench`` (``make_programs``, same seeds) run as
coroutines on a virtual-clock loop (``virtual_loop``); their ``LLM`` is
:class:`SimLLM`, which turns every chat call into a :class:`SimRequest` for
one of the engine models, so a run is the benchmark's run with the engines,
network and client replaced by the cost model. The gateway's part is the
gateway's own request controller (``autellix.control``) on the virtual clock:
the program store (program service and waiting time, sent to the engine as its
``vllm_xargs`` by the vLLM backend; the queue level as vLLM's ``priority``),
and the balancer (round robin, least used or Algorithm 2) over the engines'
in-flight calls. Arrivals are Poisson as in
``autellix.loadgen.runner`` and the metrics are its (``autellix.workloads.run_metrics``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from autellix.backends import CallOutcome, VllmBackend
from autellix.control import Attempt, CallOwner, CallSpec, MemoryProgramStore, RequestController
from autellix.core import PrefixIndex, SchedulerConfig, balancer_from_config, policy_by_name, reads_cache
from autellix.core.engine_load import EngineLoad
from autellix.engine.tiny_model import render_chat
from autellix.protocol import (
    CHAT_COMPLETIONS_PATH,
    PRIORITY_FIELD,
    XARG_DECLARED,
    XARG_SERVICE,
    XARG_TENANT,
    XARG_TENANT_WEIGHT,
    XARG_TREE,
    XARG_WAIT,
    XARGS_FIELD,
)
from autellix.sim.clairvoyant import CLAIRVOYANT_LEVELS, LEARNING_SYSTEM, Clairvoyance
from autellix.sim.engine_model import EngineModel
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.engine_request import RequestOutcome, SimRequest
from autellix.sim.gateway_queues import AdmissionGate, RequestFlowControl
from autellix.sim.kv_cache import block_hashes
from autellix.sim.virtual_loop import run_virtual
from autellix.workloads import AgentProgram, client_priority
from autellix.workloads.base import declarations
from autellix.workloads.run_metrics import CallStat, ProgramStat, RunResult, poisson_arrivals, summarize
from autellix.workloads.systems import SYSTEMS, System

#: Balancer names the CLI accepts, to the core's names.
BALANCER_ALIASES = {"algorithm2": "autellix", "autellix": "autellix", "least_used": "least_used",
                    "least-used": "least_used", "round_robin": "round_robin", "round-robin": "round_robin",
                    "prefix_score": "prefix_score", "prefix-score": "prefix_score"}


def balancer_name(name: str | None) -> str | None:
    """The core's balancer name for ``name`` (None stays None)."""
    if name is None:
        return None
    try:
        return BALANCER_ALIASES[name]
    except KeyError:
        raise ValueError(f"unknown balancer {name!r}; expected algorithm2, least_used, round_robin or "
                         "prefix_score") from None


def render(messages: Sequence[dict[str, str]]) -> bytes:
    """A chat prompt as the byte-level engine sees it: the tiny model's chat
    template (``autellix.engine.tiny_model.render_chat``), one token per byte.
    Equal histories give equal prefixes, and a reply re-sent in the next turn
    follows the prompt it was generated for, so the prefix cache shares both
    as it does on the real engine (the benchmark's replies re-tokenize to what
    was generated: ``REPLY_TOKEN_IDS``)."""
    return render_chat(messages).encode("utf-8")


class _Engine:
    """One engine model stepped on the virtual loop.

    While the batch only decodes, steps run as one timer (a decode run): the
    engine's state is the same after ``k`` single steps or one run of ``k``
    (``EngineModel.coalescible``). An arrival during a run cuts it after the
    step in progress, where the new call joins the next step as it would have."""

    def __init__(self, name: str, model: EngineModel, loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.model = model
        self.loop = loop
        self.inflight = 0
        self.busy = False
        self.plans = 0
        #: A pending decode run: (start, steps, KV tokens read by its first step, decoding sequences, its timer).
        self._run: tuple[float, int, int, int, asyncio.TimerHandle] | None = None
        self._waiters: dict[str, tuple[asyncio.Future[RequestOutcome], CallStat]] = {}
        #: Called after every step (the gateway's waiting rooms look again for room).
        self.on_step: list[Callable[[], None]] = []

    def submit(self, request: SimRequest, stat: CallStat) -> asyncio.Future[RequestOutcome]:
        future: asyncio.Future[RequestOutcome] = self.loop.create_future()
        now = self.loop.time()
        self.model.add(request, now)
        self._waiters[request.request_id] = (future, stat)
        if self._run is not None:
            self._cut(now)
        elif not self.busy:
            self.busy = True
            self.loop.call_soon(self._step)  # calls arriving at this instant join the same step
        return future

    def _cut(self, now: float) -> None:
        assert self._run is not None
        start, steps, kv0, d, timer = self._run
        cost = self.model.profile.cost
        lo, hi = 0, steps  # steps of the run that have ended by now
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if start + cost.decode_run_seconds(mid, d, kv0) <= now:
                lo = mid
            else:
                hi = mid - 1
        keep = min(steps, lo + 1)  # the step in progress completes
        if keep < steps:
            timer.cancel()
            end = start + cost.decode_run_seconds(keep, d, kv0)
            self._run = (start, keep, kv0, d, self.loop.call_at(end, self._run_done))

    def _step(self) -> None:
        if self.model.idle:
            self.busy = False
            return
        now = self.loop.time()
        self.plans += 1
        steps = self.model.coalescible(now)
        if steps >= 2:
            running, kv0 = self.model.decode_batch()
            end = now + self.model.profile.cost.decode_run_seconds(steps, running, kv0)
            self._run = (now, steps, kv0, running, self.loop.call_at(end, self._run_done))
            return
        result = self.model.step(now)
        if result.seconds <= 0 and not result.preempted:
            raise RuntimeError(f"engine {self.name} has requests but scheduled nothing")
        self.loop.call_at(now + result.seconds, self._done, result)

    def _run_done(self) -> None:
        assert self._run is not None
        start, steps = self._run[0], self._run[1]
        self._run = None
        self._done(self.model.decode_steps(start, steps))

    def _done(self, result: Any) -> None:
        now = self.loop.time()
        for rid in result.first_token:
            self._waiters[rid][1].first_token = now
        for rid, outcome in result.outcomes.items():
            future, _ = self._waiters.pop(rid)
            self.inflight -= 1
            future.set_result(outcome)
        for hook in self.on_step:
            hook()
        # after the programs woken here have run: calls they make at this instant join the next step
        self.loop.call_soon(self._step)


@dataclass
class SimRun:
    result: RunResult
    engines: dict[str, dict[str, float]]
    events: int
    wall_seconds: float
    simulated_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


class _SimEngines:
    """The engine models as the request controller's ``EngineDirectory``.

    Load is the engine's calls in flight, counted from the routing decision
    (``begin``) until the engine model hands back the outcome (``_Engine._done``
    takes it off), so calls routed at the same instant see each other's load.
    The models never fail or hang, and the outcome carries the model time, so
    the health and feedback hooks have nothing to do."""

    def __init__(self, engines: dict[str, _Engine]) -> None:
        self.engines = engines

    def candidates(self, model: str, exclude: Collection[str] = ()) -> dict[str, float]:
        return {name: float(e.inflight) for name, e in self.engines.items() if name not in exclude}

    def begin(self, url: str) -> None:
        self.engines[url].inflight += 1

    def end(self, url: str) -> None:
        pass

    def answered(self, url: str) -> None:
        pass

    def failed(self, url: str, *, hung: bool) -> None:
        pass

    async def call_record(self, url: str, call_id: str) -> None:
        return None

    def seconds_per_token(self, url: str) -> float:
        return 0.0

    def slots(self, url: str) -> int | None:
        return self.engines[url].model.profile.max_num_seqs


class ProgramRanks(Protocol):
    """An order of programs set from outside the policy: each call carries its program's rank in place of
    its service (lower runs first), with no tree. The clairvoyant order (``autellix.sim.clairvoyant``)
    is one; an experiment's estimate is another."""

    #: While True the ranks are only told outcomes; calls carry their programs' service.
    learning: bool
    #: True: a program's place is its latest call's rank, which may fall; False: the engine keeps the
    #: largest rank its calls carried, as it keeps the largest service.
    latest: bool

    def finished(self, program_id: str, model_time: float, output_tokens: int) -> None:
        """A call of ``program_id`` finished."""
        ...

    def ended(self, program_id: str) -> None:
        """``program_id`` (a root program, its subagents ended before it) ended."""
        ...

    def rank(self, program_id: str) -> float:
        """The rank a call of ``program_id`` carries now."""
        ...


#: The one model every simulated engine serves.
SIM_MODEL = "sim"


class SimGateway:
    """The gateway's request controller (``autellix.control``) on the virtual clock, against the engine models."""

    def __init__(self, system: System, config: SchedulerConfig, engines: dict[str, _Engine], *,
                 link_subagents: bool = True, ranks: ProgramRanks | None = None) -> None:
        self.system = system
        #: An order of programs set from outside the policy (``ProgramRanks``): the clairvoyant's, an experiment's.
        self.ranks = ranks
        #: Open a program's subagents as its subagents (the gateway ranks the tree as one); off: as programs
        #: of their own, as a gateway that does not know them would.
        self.link_subagents = link_subagents
        self.policy = policy_by_name(system.policy or "fcfs")
        self.store = MemoryProgramStore(self.policy)
        #: The process table behind the store (``experiments/session_cycling.py`` wraps its start and end).
        self.table = self.store.table
        self.engines = engines
        #: The KV event index, fed by the engine models' prefix caches, where the balancer reads it.
        self.kv_index = _kv_index(engines) if len(engines) > 1 and reads_cache(config) else None
        ids = itertools.count()
        self.controller = RequestController(
            store=self.store, engines=_SimEngines(engines), backend=VllmBackend(),
            balancer=balancer_from_config(config), queues=self.policy.queues(config), policy=self.policy,
            # bare engines (no gateway) get no priority from it
            send_priority=system.policy is not None and self.policy.places_by_priority,
            clock=asyncio.get_running_loop().time, call_ids=lambda: f"c{next(ids)}", kv_index=self.kv_index)
        loop = asyncio.get_running_loop()

        def loads() -> list[EngineLoad]:
            return [e.model.load() for e in engines.values()]

        #: llm-d's per-program request queues in front of the engines (``System.flow_control``).
        self.flow = RequestFlowControl(loads, loop) if system.flow_control else None
        #: Program admission (``System.admission``): room appears only as programs leave.
        self.admission = AdmissionGate(loads, loop) if system.admission else None
        for engine in engines.values():
            if self.flow is not None:
                engine.on_step.append(self.flow.pump)

    async def call(self, program_id: str, thread: str | None, prompt: bytes, max_tokens: int,
                   stat: CallStat, output: bytes | None = None, generated: int = 0) -> RequestOutcome:
        """One call; ``generated``: the tokens its program has generated so far
        (what a ``client-plas`` program sends, bucketed, as its priority)."""
        gateway = self.system.policy is not None

        async def send(attempt: Attempt[RequestOutcome]) -> RequestOutcome:
            # the engine model reads what the backend put in the body, as the plugin does
            xargs = attempt.body[XARGS_FIELD]
            priority = attempt.body.get(PRIORITY_FIELD, 0)
            if not gateway and self.system.client_priority:
                priority = client_priority(generated)
            service, tree = (xargs[XARG_SERVICE], xargs.get(XARG_TREE)) if gateway else (None, None)
            rank = None
            if self.ranks is not None and not self.ranks.learning:
                service, tree = self.ranks.rank(program_id), None
                if self.ranks.latest:
                    rank = service
            request = SimRequest(attempt.call_id, prompt, max_tokens, program_id=program_id if gateway else None,
                                 thread_id=thread, priority=priority, service=service,
                                 wait=xargs[XARG_WAIT] if gateway else None, tree=tree, rank=rank,
                                 declared=xargs.get(XARG_DECLARED) if gateway else None, output=output,
                                 tenant=xargs.get(XARG_TENANT) if gateway else None,
                                 tenant_weight=xargs.get(XARG_TENANT_WEIGHT) if gateway else None)
            engine = self.engines[attempt.engine]
            if engine.model.profile.call_overhead:  # the way in through HTTP and the API server
                await asyncio.sleep(engine.model.profile.call_overhead)
            try:
                pending = engine.submit(request, stat)
            except ValueError:  # refused (as a 400 would be): the model never counted it in flight
                engine.inflight -= 1
                raise
            finally:
                if self.flow is not None:
                    self.flow.arrived()
            outcome = await pending
            if self.ranks is not None:
                self.ranks.finished(program_id, outcome.model_time, outcome.output_tokens)
            if self.admission is not None:
                self.admission.call_finished(program_id, outcome.prompt_tokens + outcome.output_tokens)
            await attempt.settle(CallOutcome(200, completion_tokens=outcome.output_tokens,
                                             prompt_tokens=outcome.prompt_tokens, model_time=outcome.model_time))
            return outcome

        block_size = next(iter(self.engines.values())).model.profile.block_size
        spec = CallSpec(path=CHAT_COMPLETIONS_PATH, body={}, model=SIM_MODEL,
                        owner=CallOwner(program_id, thread, ephemeral=False), prompt_tokens=len(prompt),
                        prompt_blocks=lambda: block_hashes(prompt, block_size))
        if self.flow is None:
            return await self.controller.call(spec, send)
        await self.flow.wait_turn(program_id)
        outcome = await self.controller.call(spec, send)
        self.flow.completed(program_id, prompt_tokens=outcome.prompt_tokens, completion_tokens=outcome.output_tokens)
        return outcome


class _IndexedPool:
    """One engine model's prefix cache as KV events into the gateway's index."""

    def __init__(self, index: PrefixIndex, engine: str, block_size: int) -> None:
        self.index, self.engine, self.block_size = index, engine, block_size

    def stored(self, block_hash: int) -> None:
        self.index.stored(self.engine, (block_hash,), self.block_size)

    def removed(self, block_hash: int) -> None:
        self.index.removed(self.engine, (block_hash,))


def _kv_index(engines: Mapping[str, _Engine]) -> PrefixIndex:
    index = PrefixIndex()
    for name, engine in engines.items():
        engine.model.pool.events = _IndexedPool(index, name, engine.model.profile.block_size)
    return index


class SimLLM:
    """The ``LLM`` one program talks to, in simulated time; a subagent's (``subagent``) calls belong to a
    program of its own, opened at its first call, a subagent of its spawner's when the gateway links them
    (``SimGateway.link_subagents``), counted in the program's results."""

    def __init__(self, gateway: SimGateway, stat: ProgramStat, calls: list[CallStat], *,
                 program_id: str | None = None, parent: SimLLM | None = None) -> None:
        self._gateway, self._stat, self._calls = gateway, stat, calls
        self.program_id = program_id or stat.program_id
        self._parent = parent
        self._opened = parent is None  # the program itself is opened by the run
        #: Subagents' programs opened under this program, for its end.
        self.subagents: list[str] = []
        self._inflight = 0
        self._replies = itertools.count()

    def subagent(self, name: str) -> SimLLM:
        return SimLLM(self._gateway, self._stat, self._calls, program_id=f"{self.program_id}/{name}", parent=self)

    async def _open(self) -> None:
        parent = self._parent
        assert parent is not None
        self._opened = True
        now = asyncio.get_running_loop().time()
        store = self._gateway.store
        await store.open(self.program_id, now, owner=store.entry(parent.program_id).owner,
                         parent=parent.program_id if self._gateway.link_subagents else None)
        root = parent
        while root._parent is not None:
            root = root._parent
        root.subagents.append(self.program_id)

    async def chat(self, messages: list[dict[str, str]], *, max_tokens: int, thread: str | None = None) -> str:
        if not self._opened:
            await self._open()
        loop = asyncio.get_running_loop()
        call = CallStat(self._stat.program_id, thread, loop.time())
        self._calls.append(call)
        self._stat.calls += 1
        self._inflight += 1
        self._stat.max_parallel = max(self._stat.max_parallel, self._inflight)
        # One ASCII byte per token, unique to the call (replies never share blocks by accident).
        # The engine is told these tokens, as vLLM knows the tokens it generated: full
        # blocks of them stay in the prefix cache, so a preempted call recomputes only
        # what the cache lost, as in vLLM V1.
        tag = f"[{self.program_id}:{next(self._replies)}]"
        reply = (tag * (max_tokens // len(tag) + 1))[:max_tokens]
        try:
            outcome = await self._gateway.call(self.program_id, thread, render(messages), max_tokens, call,
                                               output=reply.encode(), generated=self._stat.tokens)
        finally:
            self._inflight -= 1
            call.finished = loop.time()
        call.prompt_tokens, call.completion_tokens = outcome.prompt_tokens, outcome.output_tokens
        call.queue_s, call.model_time = outcome.queue_time, outcome.model_time
        self._stat.tokens += outcome.output_tokens
        return reply

    async def tool(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def simulate_programs(programs: Sequence[AgentProgram], *, profile: EngineProfile, system: System | str,
                      rate: float, seed: int, engines: int = 1, config: SchedulerConfig | None = None,
                      link_subagents: bool = True, ranks: ProgramRanks | None = None,
                      declared: Mapping[str, int] | None = None,
                      tenant_weights: Mapping[str, float] | None = None) -> SimRun:
    """Run ``programs`` with Poisson arrivals at ``rate`` against ``engines``
    modelled engines of ``profile`` serving ``system``; deterministic in ``seed``. ``link_subagents``: the
    programs' subagents are opened as such (off: as unrelated programs). The ``clairvoyant`` system runs the
    programs twice (``autellix.sim.clairvoyant``): the second run is its result; so does a system whose
    programs declare their sizes (``System.declared_error``: the first run says what they generate).
    ``ranks``: an order of programs set from outside the policy (``ProgramRanks``), for experiments;
    ``declared``: the tokens each program (by id) says at its opening it will generate in all
    (``POST /v1/sessions``' ``expected_tokens``), for experiments; ``tenant_weights``: the weights of the
    programs' tenants (``AgentProgram.tenant``; 1 where not named), as the gateway's keys set them."""
    if isinstance(system, str):
        if system not in SYSTEMS:
            raise ValueError(f"unknown system {system!r}; expected one of {', '.join(SYSTEMS)}")
        system = SYSTEMS[system]
    if engines < 1:
        raise ValueError(f"engines must be >= 1, got {engines}")
    config = config or SchedulerConfig()
    if not system.two_pass:
        return _simulate(programs, profile=profile, system=system, rate=rate, seed=seed, engines=engines,
                         config=config, link_subagents=link_subagents, ranks=ranks, declared=declared,
                         tenant_weights=tenant_weights)
    if ranks is not None or declared is not None:
        raise ValueError(f"the {system.name} system learns what its programs will do itself: no ranks or "
                         "declarations to give it")
    seen = Clairvoyance()
    _simulate(programs, profile=profile, system=SYSTEMS[LEARNING_SYSTEM], rate=rate, seed=seed, engines=engines,
              config=config, link_subagents=link_subagents, ranks=seen)
    seen.learning = False
    if system.declared_error is not None:
        return _simulate(programs, profile=profile, system=system, rate=rate, seed=seed, engines=engines,
                         config=config, link_subagents=link_subagents,
                         declared=declarations(seen.tokens, system.declared_error, seed),
                         tenant_weights=tenant_weights)
    return _simulate(programs, profile=profile, system=system, rate=rate, seed=seed, engines=engines,
                     config=config.with_overrides(boundaries=CLAIRVOYANT_LEVELS.boundaries,
                                                  quanta=CLAIRVOYANT_LEVELS.quanta, beta=CLAIRVOYANT_LEVELS.beta),
                     link_subagents=link_subagents, ranks=seen)


def _simulate(programs: Sequence[AgentProgram], *, profile: EngineProfile, system: System, rate: float, seed: int,
              engines: int, config: SchedulerConfig, link_subagents: bool,
              ranks: ProgramRanks | None = None, declared: Mapping[str, int] | None = None,
              tenant_weights: Mapping[str, float] | None = None) -> SimRun:
    """One run of ``simulate_programs``."""
    if system.policy is not None and system.engine_scheduler == "autellix":
        config = config.with_overrides(policy=system.policy)
    arrivals = poisson_arrivals(len(programs), rate, seed)
    stats: list[ProgramStat] = []
    calls: list[CallStat] = []
    holder: dict[str, Any] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = {f"engine-{i}": _Engine(f"engine-{i}", EngineModel(
            profile, scheduler=system.engine_scheduler, config=config, prefix_caching=system.prefix_caching,
            chunked_prefill=system.chunked_prefill), loop) for i in range(engines)}
        gateway = SimGateway(system, config, pool, link_subagents=link_subagents, ranks=ranks)
        gateway.store.tenants.configure(tenant_weights or {})
        holder["pool"], holder["gateway"] = pool, gateway

        engines_hear_ends = system.policy is not None and system.engine_scheduler == "autellix"

        def tell_ended(program_id: str) -> None:
            """A session's end, as the gateway tells the engines that run Autellix's scheduler."""
            if engines_hear_ends:
                for engine in pool.values():
                    engine.model.retention.ended(program_id)

        async def one(program: AgentProgram) -> None:
            stat = ProgramStat(program.program_id, program.workload, loop.time())
            stats.append(stat)
            if gateway.admission is not None:  # its time waiting to be admitted counts in its latency
                await gateway.admission.enter(program.program_id)
            await gateway.store.open(program.program_id, loop.time(), owner=program.tenant)
            if declared is not None and declared.get(program.program_id):
                gateway.store.declare(program.program_id, declared[program.program_id])
            llm = SimLLM(gateway, stat, calls)
            try:
                await program.run(llm)
            except ValueError as exc:  # the engine refused a call (as a 400 would): this program fails
                stat.error = f"{type(exc).__name__}: {exc}"
            finally:
                stat.finish = loop.time()
                for subagent in llm.subagents[::-1]:  # subagents first, then their root
                    await gateway.store.end(subagent, remember=False)
                    tell_ended(subagent)
                await gateway.store.end(program.program_id, remember=False)
                tell_ended(program.program_id)
                if gateway.ranks is not None:
                    gateway.ranks.ended(program.program_id)
                if gateway.admission is not None:
                    gateway.admission.leave(program.program_id)

        # one arrival at a time: a timer per waiting program would make the loop's heap huge
        tasks = []
        for program, at in zip(programs, arrivals, strict=True):
            if at > loop.time():
                await asyncio.sleep(at - loop.time())
            tasks.append(loop.create_task(one(program)))
        await asyncio.gather(*tasks)

    wall = time.perf_counter()
    _, end = run_virtual(main())
    wall = time.perf_counter() - wall
    pool: dict[str, _Engine] = holder["pool"]
    engine_stats = {name: e.model.stats() for name, e in pool.items()}
    queries = sum(s["prefix_queries_tokens"] for s in engine_stats.values())
    hits = sum(s["prefix_hits_tokens"] for s in engine_stats.values())
    result = RunResult(stats, calls, 0.0, end,
                       prefix_cache_hit_rate=hits / queries if system.prefix_caching and queries else None)
    # what the loop processed: engine plans (single steps and decode runs), call arrivals and finishes,
    # program arrivals
    events = sum(e.plans for e in pool.values()) + 2 * len(calls) + len(stats)
    gateway: SimGateway = holder["gateway"]
    held: dict[str, Any] = {}
    if gateway.flow is not None:
        held["flow_control_held_calls"] = gateway.flow.held
    if gateway.admission is not None:
        held |= {"admission_held_programs": gateway.admission.held,
                 "admission_refusals": gateway.admission.refused}
    return SimRun(result, engine_stats, events, wall, end, extra=held)


def sim_summary(run: SimRun) -> dict[str, Any]:
    """The benchmark's metrics, plus the simulator's speed."""
    busy = [s["busy_seconds"] / run.simulated_seconds for s in run.engines.values()] if run.simulated_seconds else []
    return summarize(run.result) | {
        "simulated_seconds": run.simulated_seconds,
        "engine_utilization": sum(busy) / len(busy) if busy else 0.0,
        "preemptions": sum(s["preemptions"] for s in run.engines.values()),
        "prefill_tokens": sum(s["prefill_tokens"] for s in run.engines.values()),
    } | run.extra


def speed_stats(run: SimRun) -> dict[str, float]:
    return {
        "events": float(run.events),
        "engine_steps": sum(s["steps"] for s in run.engines.values()),
        "wall_seconds": run.wall_seconds,
        "simulated_seconds": run.simulated_seconds,
        "events_per_second": run.events / run.wall_seconds if run.wall_seconds > 0 else 0.0,
        "sim_to_wall_ratio": run.simulated_seconds / run.wall_seconds if run.wall_seconds > 0 else 0.0,
    }
