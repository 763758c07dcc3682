"""A model of one vLLM V1 engine: its scheduler, KV cache and step cost, no clock.

``EngineModel.step(now)`` plans one batch as vLLM V1's ``Scheduler.schedule``
does and says how long it takes on the profiled hardware; the caller advances
its own clock (virtual in the simulator, real in the emulator) by that much.
What is modelled, and why it is enough for latency and throughput:

* the running set is bounded by ``max_num_seqs``; one token budget
  (``max_num_batched_tokens``) is shared by decodes (one token each, running
  requests first) and prefills, chunked when ``chunked_prefill`` is on (without
  it a prompt must fit the budget whole, and the budget is at least the context);
* KV capacity is ``kv_blocks`` blocks of ``block_size`` tokens; with prefix
  caching, full blocks are shared by chained hash and freed blocks stay cached
  until evicted LRU (``autellix.sim.kv_cache``);
* when a running request needs a block and none is free, the worst request is
  preempted by recompute (blocks freed, back to waiting): the last admitted
  under FCFS, the largest (priority, arrival) under the priority policies, as
  vLLM does;
* schedulers: ``fcfs`` (arrival order), ``vllm-priority`` (the request's
  ``priority``, then arrival), ``mlfq`` and ``autellix``: the plugin's
  ``CallPlanner`` over the policy core (classic MLFQ, or the configured
  PLAS/ATLAS), which sets each request's priority to its queue rank, demotes,
  promotes, and preempts running calls that rank below waiting ones when every
  slot is taken, exactly as ``autellix.engine.scheduler`` drives it in vLLM;
* KV retention across a program's pauses (the plugin's default; the
  profile's ``kv_retention``, ``host_kv_blocks`` and ``swap_s_per_block``):
  when a program that has come back before has no call left, its last call's
  cached blocks are pinned; an allocation that finds the free list short gives
  pins up in the order ``autellix.core.kv_retention`` decides, offloading a
  prefix to host memory (:class:`autellix.sim.kv_cache.HostCache`, transfers
  priced per block and added to the step) or dropping it to the LRU free list;
  a returning call reuses it by hash, from device or host. Every engine counts
  the prefix blocks a program's call computes again
  (``recomputed_prefix_tokens``), retention on or off.

Not modelled: sampling, speculative decoding, swapping preempted calls, CUDA
graphs' batch-size buckets (folded into the cost model), and the API server's
own queueing.

Beyond ``step``: ``step_until`` / ``coalescible`` + ``decode_steps`` run a
stretch of pure decode steps as one, with the same outcome as step by step
(the simulator's speed; ``docs/simulation.md``).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from autellix.core import SchedulerConfig
from autellix.core.engine_load import EngineLoad
from autellix.core.kv_retention import Retention, RetentionCosts, RetentionLedger
from autellix.core.mlq import ProgramViews, backlog_ratio_floor
from autellix.core.preemption import lost_kv_tokens
from autellix.engine.planner import CallIdentity, CallPlanner
from autellix.sim.cost_model import StepCost
from autellix.sim.kv_cache import BlockPool, HostCache, block_hashes

SCHEDULERS = ("fcfs", "vllm-priority", "mlfq", "autellix")
PROFILE_PACKAGE = "autellix.sim.profiles"


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"engine profile {name}: expected an integer >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class EngineProfile:
    """Capacity and step cost of one engine on one kind of hardware."""

    name: str
    block_size: int
    kv_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    cost: StepCost
    max_model_len: int = 8192
    #: Seconds a call spends outside the engine's steps (HTTP, API server), on
    #: its way in; the simulator delays each call's arrival by this much.
    call_overhead: float = 0.0
    #: The Autellix schedulers hold a paused program's prefix until memory runs
    #: short (``autellix.core.kv_retention``); off, it is left to the LRU free
    #: list as stock vLLM leaves it (the stock schedulers never hold).
    kv_retention: bool = True
    #: Host memory for offloaded prefixes, in blocks (0: no swap path, prefixes are only dropped).
    host_kv_blocks: int = 0
    #: Seconds to move one block between device and host memory, each way
    #: (Llama-3.1-8B on an A100: 2 MiB a 16-token block, about 84 us at 25 GB/s over PCIe 4.0 x16).
    swap_s_per_block: float = 0.0
    #: Where the numbers come from (sources, fit quality, engine settings); not used by the model.
    provenance: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("block_size", "kv_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            _positive_int(name, getattr(self, name))
        if not isinstance(self.cost, StepCost):
            raise ValueError("engine profile cost: expected a StepCost")
        if not (isinstance(self.call_overhead, int | float) and 0 <= self.call_overhead < math.inf):
            raise ValueError(f"engine profile call_overhead: expected seconds >= 0, got {self.call_overhead!r}")
        if not isinstance(self.kv_retention, bool):
            raise ValueError(f"engine profile kv_retention: expected true or false, got {self.kv_retention!r}")
        if isinstance(self.host_kv_blocks, bool) or not isinstance(self.host_kv_blocks, int) or self.host_kv_blocks < 0:
            raise ValueError(f"engine profile host_kv_blocks: expected an integer >= 0, got {self.host_kv_blocks!r}")
        if not (isinstance(self.swap_s_per_block, int | float) and 0 <= self.swap_s_per_block < math.inf):
            raise ValueError(f"engine profile swap_s_per_block: expected seconds >= 0, got {self.swap_s_per_block!r}")

    def step_seconds(self, prefill_tokens: int, decode_seqs: int, kv_tokens: int, new_requests: int = 0) -> float:
        return self.cost.seconds(prefill_tokens, decode_seqs, kv_tokens, new_requests)

    @property
    def kv_tokens(self) -> int:
        return self.block_size * self.kv_blocks

    def with_overrides(self, **changes: Any) -> EngineProfile:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    # ---- files ------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineProfile:
        if not isinstance(data, dict):
            raise ValueError("engine profile: expected a JSON object")
        missing = [k for k in ("name", "block_size", "kv_blocks", "max_num_seqs", "max_num_batched_tokens", "cost")
                   if k not in data]
        if missing:
            raise ValueError(f"engine profile: missing {', '.join(missing)}")
        cost = data["cost"]
        if not isinstance(cost, dict):
            raise ValueError("engine profile cost: expected an object of coefficients")
        try:
            step_cost = StepCost(**{k: cost[k] for k in StepCost.__dataclass_fields__ if k in cost or
                                    StepCost.__dataclass_fields__[k].default is dataclasses.MISSING})
        except KeyError as exc:
            raise ValueError(f"engine profile cost: missing {exc.args[0]}") from None
        return cls(name=str(data["name"]), block_size=data["block_size"], kv_blocks=data["kv_blocks"],
                   max_num_seqs=data["max_num_seqs"], max_num_batched_tokens=data["max_num_batched_tokens"],
                   cost=step_cost, max_model_len=data.get("max_model_len", 8192),
                   call_overhead=data.get("call_overhead", 0.0), kv_retention=data.get("kv_retention", True),
                   host_kv_blocks=data.get("host_kv_blocks", 0), swap_s_per_block=data.get("swap_s_per_block", 0.0),
                   provenance={k: v for k, v in data.items() if k not in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "provenance"}
        out["cost"] = self.cost.to_dict()
        return out | self.provenance

    @classmethod
    def load(cls, name_or_path: str | Path) -> EngineProfile:
        """A bundled profile by name (``profiles/<name>.json``) or a JSON file by path."""
        path = Path(name_or_path)
        if path.suffix == ".json" or path.exists():
            try:
                text = path.read_text()
            except OSError as exc:
                raise ValueError(f"engine profile {str(path)!r}: {exc.strerror}") from None
        else:
            resource = resources.files(PROFILE_PACKAGE) / f"{name_or_path}.json"
            if not resource.is_file():
                raise ValueError(f"unknown engine profile {str(name_or_path)!r}; "
                                 f"bundled: {', '.join(bundled_profiles())}")
            text = resource.read_text()
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ValueError(f"engine profile {str(name_or_path)!r}: not JSON ({exc})") from None


def bundled_profiles() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(PROFILE_PACKAGE).iterdir() if p.name.endswith(".json"))


@dataclass
class SimRequest:
    """One call as an engine receives it."""

    request_id: str
    #: Prompt token ids; equal prefixes share KV blocks when prefix caching is on.
    prompt: Sequence[int]
    max_tokens: int
    program_id: str | None = None
    thread_id: str | None = None
    #: vLLM-style priority, lower first (the ``vllm-priority`` scheduler's order).
    priority: int = 0
    #: The gateway's ``vllm_xargs``: the program's attained service and waiting time, and the
    #: subagent tree they are the totals of.
    service: float | None = None
    wait: float | None = None
    tree: str | None = None
    #: The tokens it will generate, when the caller knows them (the simulator's
    #: replies): their blocks become shareable with later calls that repeat them.
    output: Sequence[int] | None = None


@dataclass(frozen=True)
class RequestOutcome:
    """A request that left the engine: what vLLM's per-request metrics report."""

    request_id: str
    arrival: float
    finished_at: float
    first_scheduled: float | None
    first_token: float | None
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    #: Execution time: the steps it ran in (the scheduler's own count under the
    #: Autellix scheduler, the sum of its steps' times otherwise).
    model_time: float
    preemptions: int
    aborted: bool = False

    @property
    def queue_time(self) -> float:
        return (self.first_scheduled if self.first_scheduled is not None else self.finished_at) - self.arrival


@dataclass
class StepResult:
    seconds: float
    tokens: dict[str, int]
    first_token: list[str]
    finished: list[str]
    preempted: list[str]
    prefill_tokens: int
    decode_seqs: int
    cached_tokens: int
    #: KV tokens the step's attention read (the cost model's third term).
    kv_tokens: int = 0
    #: Requests admitted from waiting into the batch this step.
    new_requests: int = 0
    #: Requests that finished this step, by id.
    outcomes: dict[str, RequestOutcome] = field(default_factory=dict)
    #: Steps this result stands for (``step`` runs one; ``run_until`` may coalesce several).
    steps: int = 1


class _Seq:
    """A request inside the engine."""

    __slots__ = (
        "arrival",
        "blocks",
        "cached",
        "computed",
        "first_scheduled",
        "first_token",
        "hashes",
        "known",
        "model_time",
        "num_output",
        "num_prompt",
        "num_tokens",
        "order",
        "preemptions",
        "priority",
        "program",
        "registered",
        "req",
        "running",
        "tokens",
    )

    def __init__(self, req: SimRequest, arrival: float, order: int) -> None:
        self.req = req
        self.tokens: Sequence[int] = req.prompt if req.output is None else [*req.prompt, *req.output]
        self.num_prompt = len(req.prompt)
        #: Tokens whose ids are known (prompt, plus generated ones the caller gave).
        self.known = self.num_prompt
        self.num_output = 0
        self.num_tokens = self.num_prompt
        self.computed = 0
        self.blocks: list[int] = []
        self.hashes: list[int] = []
        self.registered = 0
        self.arrival = arrival
        self.order = order
        self.priority = req.priority
        #: The program the engine charges it to (the planner's and the retention ledger's key).
        self.program = req.program_id or f"request:{req.request_id}"
        self.running = False
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.model_time = 0.0
        self.preemptions = 0
        self.cached = 0

    def key(self) -> tuple[int, float, int]:
        return (self.priority, self.arrival, self.order)


class EngineModel:
    """One engine: queues, KV cache and step cost; time is always passed in."""

    def __init__(self, profile: EngineProfile, *, scheduler: str = "autellix", config: SchedulerConfig | None = None,
                 prefix_caching: bool = True, chunked_prefill: bool = True) -> None:
        if scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
        self.profile = profile
        self.scheduler = scheduler
        self.config = config or SchedulerConfig()
        self.prefix_caching = prefix_caching
        self.chunked_prefill = chunked_prefill
        self.pool = BlockPool(profile.kv_blocks, caching=prefix_caching)
        # Without chunked prefill vLLM needs a whole prompt to fit one step's budget.
        self.token_budget = (profile.max_num_batched_tokens if chunked_prefill
                             else max(profile.max_num_batched_tokens, profile.max_model_len))
        self.planner: CallPlanner | None = None
        if scheduler == "mlfq":
            self.planner = CallPlanner(self.config.with_overrides(policy="mlfq"))
        elif scheduler == "autellix":
            self.planner = CallPlanner(self.config)
        self.priority_order = scheduler != "fcfs"
        # KV retention is the plugin's (the stock schedulers only count what is recomputed)
        holds = self.planner is not None and prefix_caching and profile.kv_retention
        swap = profile.swap_s_per_block if profile.host_kv_blocks else math.inf
        costs = RetentionCosts(recompute_s_per_block=profile.cost.per_prefill_token * profile.block_size,
                               swap_out_s_per_block=swap, swap_in_s_per_block=swap)
        self.ledger: RetentionLedger[int, int] = RetentionLedger(costs, hold=holds)
        self.host = HostCache(profile.host_kv_blocks) if holds and profile.host_kv_blocks else None
        #: Blocks of offloaded prefixes still in the prefix cache: block -> programs whose host copy it feeds.
        self._watched: dict[int, set[str]] = {}
        if self.host is not None:
            self.pool.on_evict = self._evicting
        self._swap_seconds = 0.0  # transfers planned for the step being built
        self._left = 0
        self.offloaded_saved_blocks = 0
        self.swap_seconds = 0.0
        self.restored_tokens = 0
        self._seqs: dict[str, _Seq] = {}
        self._running: list[_Seq] = []
        self._waiting: list[tuple[tuple[int, float, int], _Seq]] = []  # heap by key
        self._order = itertools.count()
        self._front = 0  # fcfs: preempted requests go back to the front
        self._steps = 0
        self._clock = -math.inf
        # counters
        self.preemptions = 0
        self.recomputed_tokens = 0
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.generated_tokens = 0
        self.busy_seconds = 0.0
        # what the steps held, summed (``autellix.engine.step_trace`` measures the same on the engine)
        self.prefill_tokens = 0
        self.decode_seq_steps = 0
        self.admitted = 0
        self.finished_requests = 0

    # ---- arrivals and departures ---------------------------------------------------
    def __contains__(self, request_id: object) -> bool:
        return request_id in self._seqs

    def __len__(self) -> int:
        return len(self._seqs)

    def add(self, request: SimRequest, now: float) -> None:
        if request.request_id in self._seqs:
            raise ValueError(f"request {request.request_id!r} is already in the engine")
        if isinstance(request.max_tokens, bool) or not isinstance(request.max_tokens, int) or request.max_tokens < 1:
            raise ValueError(f"request {request.request_id!r}: max_tokens must be an integer >= 1")
        if len(request.prompt) < 1:
            raise ValueError(f"request {request.request_id!r}: empty prompt")
        total = len(request.prompt) + request.max_tokens
        if total > self.profile.max_model_len:
            raise ValueError(f"request {request.request_id!r}: prompt plus max_tokens is {total} tokens, "
                             f"over the model's context of {self.profile.max_model_len}")
        if -(-total // self.profile.block_size) > self.profile.kv_blocks:
            raise ValueError(f"request {request.request_id!r}: needs more KV blocks than the engine has")
        if request.output is not None and len(request.output) < request.max_tokens:
            raise ValueError(f"request {request.request_id!r}: output shorter than max_tokens")
        seq = _Seq(request, now, next(self._order))
        self.ledger.arrived(seq.program, now)
        if self.planner is not None:
            who = CallIdentity(program_id=seq.program, thread_id=request.thread_id, service=request.service,
                               wait=request.wait, tree=request.tree)
            seq.priority = self.planner.arrive(request.request_id, who, now).rank
        elif not self.priority_order:
            seq.priority = 0
        self._seqs[request.request_id] = seq
        self._push_waiting(seq)

    def abort(self, request_id: str, now: float) -> None:
        seq = self._seqs.get(request_id)
        if seq is None:
            raise KeyError(f"request {request_id!r} is not in the engine")
        if seq.running:
            self._running.remove(seq)
        else:
            self._waiting = [(k, s) for k, s in self._waiting if s is not seq]
            heapq.heapify(self._waiting)
        self._leave(seq, max(now, self._clock), aborted=True)

    @property
    def idle(self) -> bool:
        return not self._seqs

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # ---- queues -------------------------------------------------------------------
    def _push_waiting(self, seq: _Seq, *, front: bool = False) -> None:
        seq.running = False
        if self.priority_order:
            key = seq.key()
        elif front:
            self._front -= 1
            key = (self._front, 0.0, 0)
        else:
            key = (0, seq.arrival, seq.order)
        heapq.heappush(self._waiting, (key, seq))

    def _victim(self) -> _Seq:
        if self.priority_order:
            return max(self._running, key=_Seq.key)
        return self._running[-1]

    def _preempt(self, seq: _Seq) -> None:
        self._running.remove(seq)
        self.pool.release(seq.blocks)
        self.recomputed_tokens += seq.computed
        seq.blocks, seq.computed, seq.registered = [], 0, 0
        seq.preemptions += 1
        self.preemptions += 1
        self._push_waiting(seq, front=True)

    def _leave(self, seq: _Seq, now: float, *, aborted: bool) -> RequestOutcome:
        del self._seqs[seq.req.request_id]
        if aborted:
            unpin = self.ledger.aborted(seq.program, now)
        else:
            # its cached full blocks: the prefix the program's next call starts with (a
            # request of no program is its own and never comes back)
            full = min(seq.registered, len(seq.hashes)) if seq.req.program_id is not None else 0
            pin, unpin = self.ledger.finished(seq.program, now, seq.blocks[:full], seq.hashes[:full])
            self.pool.touch(pin)  # before the request lets go of them
        self.pool.release(seq.blocks)
        self.pool.release(unpin)
        self._left += 1
        if self._left % 256 == 0:  # programs that went quiet (as the planner's table forgets them)
            for release in self.ledger.expire(now, self.config.program_idle_ttl):
                self.pool.release(release.blocks)
        seq.blocks = []
        seq.running = False
        model_time = seq.model_time
        if self.planner is not None:
            record = self.planner.leave(seq.req.request_id, now, finished=not aborted)
            if record is not None:
                model_time = record.service_s
        return RequestOutcome(seq.req.request_id, seq.arrival, now, seq.first_scheduled, seq.first_token,
                              seq.num_prompt, seq.num_output, seq.cached, model_time, seq.preemptions, aborted)

    def _replan(self, now: float) -> list[_Seq]:
        assert self.planner is not None
        moved, victims = self.planner.replan(now, (s.req.request_id for s in self._running),
                                             self.profile.max_num_seqs, lost_tokens=self._lost_tokens)
        waiting_moved = False
        for call in moved:
            seq = self._seqs.get(call.call_id)  # type: ignore[arg-type]
            if seq is not None and seq.priority != call.rank:
                seq.priority = call.rank
                waiting_moved |= not seq.running
        if waiting_moved:
            self._waiting = [(s.key(), s) for _, s in self._waiting]
            heapq.heapify(self._waiting)
        out = []
        for call in victims:
            seq = self._seqs.get(call.call_id)  # type: ignore[arg-type]
            if seq is not None and seq.running:
                self._preempt(seq)
                out.append(seq)
        self._running.sort(key=_Seq.key)
        return out

    def _lost_tokens(self, request_id: str) -> int:
        """What preempting the running request would make the engine recompute (no swapping here)."""
        seq = self._seqs[request_id]
        return lost_kv_tokens(seq.computed, block_size=self.profile.block_size, swappable=False,
                              kv_usage=self.pool.usage(), prefix_caching=self.prefix_caching)

    # ---- KV blocks ----------------------------------------------------------------
    def _ensure_hashes(self, seq: _Seq, blocks: int) -> None:
        have = len(seq.hashes)
        if blocks > have:
            bs = self.profile.block_size
            end = min(blocks * bs, seq.known)
            seq.hashes += block_hashes(seq.tokens[:end], bs, start=have,
                                       parent=seq.hashes[-1] if seq.hashes else 0)

    def _allocate(self, seq: _Seq, new_tokens: int, hits: list[int] | None = None, restore: int = 0) -> bool:
        """Blocks for ``new_tokens`` more of ``seq`` after its prefix ``hits`` and
        ``restore`` blocks loaded from the host cache; a short free list first
        takes back held prefixes (``_yield_holds``). False when it cannot fit."""
        bs = self.profile.block_size
        hits = hits or []
        have = len(seq.blocks) + len(hits)
        need = -(-(seq.computed + (len(hits) + restore) * bs + new_tokens) // bs) - have
        # a yielded hold may be the one ``hits`` point into: count again after each
        while (short := need + self.pool.free_among(hits) - self.pool.free_blocks) > 0:
            if not self._yield_holds(short):
                return False
        if hits:
            self.pool.touch(hits)
            seq.blocks += hits
            seq.registered = len(seq.blocks)
            seq.computed += len(hits) * bs
        if need > 0:
            seq.blocks += self.pool.allocate(need)
        if restore:
            first = len(hits)
            for i in range(first, first + restore):
                self.pool.register(seq.blocks[i], seq.hashes[i])
            seq.registered = first + restore
            seq.computed += restore * bs
            self.restored_tokens += restore * bs
            self._swap_seconds += restore * self.profile.swap_s_per_block
        return True

    # ---- prefixes of paused programs (``autellix.core.kv_retention``) ------------------
    def _yield_holds(self, short: int) -> bool:
        """Give up held prefixes until ``short`` more blocks could be free, in the
        ledger's order; offloaded ones are copied to the host cache first (their
        transfer is this step's). False when nothing is held."""
        host = self.host
        releases = self.ledger.shortage(short, self._clock, host_free_blocks=host.free_blocks if host else 0)
        for release in releases:
            if release.how is Retention.OFFLOAD and host is not None:
                hashes = list(itertools.takewhile(lambda h: h is not None, self.pool.hashes_of(release.blocks)))
                if hashes and host.store(release.program, hashes):
                    # copied to the host only if, and when, the pool reuses them (``_evicting``)
                    for block in release.blocks[:len(hashes)]:
                        self._watched.setdefault(block, set()).add(release.program)
            self.pool.release(release.blocks)
        return bool(releases)

    def _evicting(self, block: int, block_hash: int) -> None:
        """The pool reuses a cached block: an offloaded prefix that has it keeps a copy (one
        transfer, paid in the step being built, or the next one after a decode run)."""
        assert self.host is not None
        for program in self._watched.pop(block, ()):
            if self.host.save(program, block_hash):
                self._swap_seconds += self.profile.swap_s_per_block
                self.offloaded_saved_blocks += 1

    def _restorable(self, seq: _Seq, hits: int) -> int:
        """Blocks after the ``hits`` prefix-cache blocks that the host cache holds for ``seq``'s program."""
        if self.host is None:
            return 0
        end = min((seq.num_tokens - 1) // self.profile.block_size, len(seq.hashes))
        return self.host.restorable(seq.program, seq.hashes, hits, end)

    def _admitted(self, seq: _Seq, hits: int, restored: int) -> None:
        """``seq`` took its prefix: count what of its program's last prefix it computes
        again, end its program's hold and host copy."""
        full = (seq.num_tokens - 1) // self.profile.block_size
        self.ledger.admitted(seq.program, seq.hashes[:full], hits + restored)
        self.pool.release(self.ledger.resumed(seq.program))
        if self.host is not None:
            self.host.take(seq.program)

    def _register_full_blocks(self, seq: _Seq, upto: int | None = None) -> None:
        """Name ``seq``'s full blocks in the prefix cache, up to its computed tokens
        or ``upto`` (the tokens scheduled this step: vLLM V1 caches a block when it
        allocates it, so a call scheduled later in the same step shares it)."""
        if not self.prefix_caching:
            return
        full = min(seq.computed if upto is None else upto, seq.known) // self.profile.block_size
        if full > seq.registered:
            self._ensure_hashes(seq, full)
            for i in range(seq.registered, min(full, len(seq.hashes))):
                self.pool.register(seq.blocks[i], seq.hashes[i])
            seq.registered = full

    def _prefix_hits(self, seq: _Seq) -> list[int]:
        if not self.prefix_caching:
            return []
        # at least one token is computed, so the step yields logits (vLLM's rule)
        blocks = (seq.num_tokens - 1) // self.profile.block_size
        self._ensure_hashes(seq, blocks)
        return self.pool.cached_prefix(seq.hashes[:blocks])

    # ---- one step ------------------------------------------------------------------
    def step(self, now: float) -> StepResult:
        """Plan one batch at ``now`` and apply its outcome, which the caller sees
        ``.seconds`` later (tokens, first tokens, finished requests). The phases, as
        vLLM's scheduler runs them: the planner's re-plan, the running requests,
        the waiting ones, the batch's price, its outcome."""
        self._clock = max(self._clock, now)
        # Calls the planner preempts go before vLLM's schedule() runs (as in the
        # plugin), so unlike preemptions for KV they do not stop admissions this step.
        replanned: list[_Seq] = []
        if self.planner is not None and self._steps % self.config.multi_step == 0:
            replanned = self._replan(now)
        scheduled: dict[str, tuple[_Seq, int]] = {}
        budget, preempted = self._schedule_running(scheduled, self.token_budget)
        admitted = cached_now = 0
        if not preempted:
            budget, admitted, cached_now = self._schedule_waiting(scheduled, budget, now)
        if self.planner is not None:
            self.planner.started(scheduled)
        seconds, prefill, decode, kv = self._price(scheduled, admitted)
        end = now + seconds
        tokens, first, finished, done = self._advance(scheduled, seconds, end)
        if self.planner is not None:
            self.planner.step_done(end)
        outcomes = self._retire(done, end)
        return StepResult(seconds=seconds, tokens=tokens, first_token=first, finished=finished,
                          preempted=[s.req.request_id for s in replanned + preempted], prefill_tokens=prefill,
                          decode_seqs=decode, cached_tokens=cached_now, kv_tokens=kv, new_requests=admitted,
                          outcomes=outcomes)

    def _schedule_running(self, scheduled: dict[str, tuple[_Seq, int]], budget: int) -> tuple[int, list[_Seq]]:
        """Running requests first, in order (rank order under the priority schedulers), each its next tokens
        within ``budget``; requests preempted to free KV blocks for them. The budget left and those preempted."""
        preempted: list[_Seq] = []
        index = 0
        bs = self.profile.block_size
        while index < len(self._running) and budget > 0:
            seq = self._running[index]
            n = min(seq.num_tokens - seq.computed, budget)
            # fast path: the tokens fit the blocks it holds (most decode steps)
            if seq.computed + n > len(seq.blocks) * bs:
                ok = True
                while not self._allocate(seq, n):
                    victim = self._victim()
                    if victim.req.request_id in scheduled:
                        budget += scheduled.pop(victim.req.request_id)[1]
                        index -= 1
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is seq:
                        ok = False
                        break
                if not ok:
                    break
            scheduled[seq.req.request_id] = (seq, n)
            budget -= n
            index += 1
            if n > 1:  # a prefill chunk: its blocks are shareable from now
                self._register_full_blocks(seq, seq.computed + n)
        return budget, preempted

    def _schedule_waiting(self, scheduled: dict[str, tuple[_Seq, int]], budget: int,
                          now: float) -> tuple[int, int, int]:
        """Waiting requests admitted while the budget, the slots and the KV blocks allow, their prefix hits
        and restored blocks counted. The budget left, how many were admitted, the tokens found cached."""
        bs = self.profile.block_size
        cached_now = admitted = 0
        while self._waiting and budget > 0 and len(self._running) < self.profile.max_num_seqs:
            seq = self._waiting[0][1]
            fresh = seq.computed == 0
            hits = self._prefix_hits(seq) if fresh else []
            restore = self._restorable(seq, len(hits)) if fresh else 0
            n = seq.num_tokens - seq.computed - (len(hits) + restore) * bs
            if not self.chunked_prefill and n > budget:
                break
            n = min(n, budget)
            if not self._allocate(seq, n, hits, restore):
                break
            heapq.heappop(self._waiting)
            self.queried_tokens += seq.num_tokens
            self.hit_tokens += len(hits) * bs
            cached_now += (len(hits) + restore) * bs
            seq.cached += (len(hits) + restore) * bs
            if fresh:
                self._admitted(seq, len(hits), restore)
            seq.running = True
            if seq.first_scheduled is None:
                seq.first_scheduled = now
            self._running.append(seq)
            admitted += 1
            scheduled[seq.req.request_id] = (seq, n)
            budget -= n
            self._register_full_blocks(seq, seq.computed + n)
        return budget, admitted, cached_now

    def _price(self, scheduled: dict[str, tuple[_Seq, int]], admitted: int) -> tuple[float, int, int, int]:
        """The batch's cost in seconds (the profile's, plus KV moved this step), and its prefill tokens,
        decoding requests and KV tokens read; the engine's clock and counters advance by it."""
        swap_seconds, self._swap_seconds = self._swap_seconds, 0.0
        self.swap_seconds += swap_seconds
        prefill = decode = kv = 0
        for seq, n in scheduled.values():
            if n == 1 and seq.num_output > 0 and seq.computed == seq.num_tokens - 1:
                decode += 1
            else:
                prefill += n
            kv += seq.computed + n
        seconds = self.profile.step_seconds(prefill, decode, kv, admitted) + swap_seconds
        self._steps += 1
        self.busy_seconds += seconds
        self.prefill_tokens += prefill
        self.decode_seq_steps += decode
        self.admitted += admitted
        return seconds, prefill, decode, kv

    def _advance(self, scheduled: dict[str, tuple[_Seq, int]], seconds: float,
                 end: float) -> tuple[dict[str, int], list[str], list[str], list[_Seq]]:
        """The batch's outcome at ``end``: tokens computed and generated per request, first tokens, the
        requests that finished (by id, and themselves)."""
        self._clock = end
        bs = self.profile.block_size
        tokens: dict[str, int] = {}
        first: list[str] = []
        finished: list[str] = []
        done: list[_Seq] = []
        caching = self.prefix_caching
        produced = 0
        for rid, (seq, n) in scheduled.items():
            seq.computed += n
            seq.model_time += seconds
            if caching and seq.computed // bs > seq.registered:
                self._register_full_blocks(seq)
            if seq.computed >= seq.num_tokens:
                seq.num_output += 1
                seq.num_tokens += 1
                if seq.req.output is not None:
                    seq.known = seq.num_tokens
                tokens[rid] = 1
                produced += 1
                if seq.num_output == 1:
                    seq.first_token = end
                    first.append(rid)
                if seq.num_output >= seq.req.max_tokens:
                    finished.append(rid)
                    done.append(seq)
            else:
                tokens[rid] = 0
        self.generated_tokens += produced
        return tokens, first, finished, done

    def _retire(self, done: list[_Seq], end: float) -> dict[str, RequestOutcome]:
        """Finished requests leave the batch; their outcomes, by id."""
        outcomes: dict[str, RequestOutcome] = {}
        if done:
            gone = set(map(id, done))
            self._running = [s for s in self._running if id(s) not in gone]
            for seq in done:
                outcomes[seq.req.request_id] = self._leave(seq, end, aborted=False)
                self.finished_requests += 1
        return outcomes

    # ---- coalesced decode steps ---------------------------------------------------------
    def step_until(self, now: float, until: float) -> StepResult:
        """One step at ``now``, then, while nothing but decoding can happen, more
        decode steps in one go, ending before ``until`` (the caller's next
        event). The result stands for ``.steps`` steps: ``tokens`` counts each
        request's tokens over all of them, and every first token and finish
        falls in its last step (coalescing stops at the first finish).

        Equivalent to calling ``step`` repeatedly as long as: every running
        request decodes, none can be admitted (nothing waits, or every slot is
        taken and no waiting call outranks a running one), and, under the
        Autellix schedulers, no quantum runs out and no waiting call reaches
        the anti-starvation threshold. The simulator uses it; the emulator
        steps one at a time."""
        first = self.step(now)
        end = now + first.seconds
        if first.finished or first.first_token or first.preempted or not self._running:
            return first
        k = self.coalescible(end, until)
        if k < 1:
            return first
        extra = self.decode_steps(end, k)
        tokens = first.tokens
        for rid, n in extra.tokens.items():
            tokens[rid] = tokens.get(rid, 0) + n
        return StepResult(seconds=first.seconds + extra.seconds, tokens=tokens, first_token=[],
                          finished=extra.finished, preempted=[], prefill_tokens=first.prefill_tokens,
                          decode_seqs=first.decode_seqs + extra.decode_seqs, cached_tokens=first.cached_tokens,
                          kv_tokens=first.kv_tokens + extra.kv_tokens, new_requests=first.new_requests,
                          outcomes=extra.outcomes, steps=1 + k)

    def coalescible(self, start: float, until: float = math.inf) -> int:
        """How many pure decode steps can run from ``start`` (ending by ``until``)
        before anything but an arrival could change the batch: the first finish,
        a quantum running out, the KV cache filling, the next anti-starvation sweep."""
        running = self._running
        d = len(running)
        if d > self.token_budget:
            return 0
        if self._waiting and (len(running) < self.profile.max_num_seqs or (self.planner is not None
                              and self._waiting_outranks())):
            return 0
        if any(s.computed != s.num_tokens - 1 for s in running):
            return 0
        if self.planner is not None and self._waiting:
            until = min(until, self._first_promotion())
        k = min(s.req.max_tokens - s.num_output for s in running)
        if self.planner is not None:
            queue = self.planner.queue
            for s in running:
                call = queue.get(s.req.request_id)
                if call is not None and call.quantum_left < k:
                    k = max(int(call.quantum_left), 0)
        # time: steps that end by ``until``
        cost = self.profile.cost
        kv = sum(s.computed + 1 for s in running)
        t, steps = start, 0
        per_step = cost.overhead + cost.per_decode_seq * d
        while steps < k:
            t += per_step + cost.per_kv_token * (kv + steps * d)
            if t > until:
                break
            steps += 1
        k = steps
        # KV: the blocks the k steps need must be free now
        bs = self.profile.block_size
        while k > 0 and sum(max(0, -(-(s.computed + k) // bs) - len(s.blocks)) for s in running) \
                > self.pool.free_blocks:
            k //= 2
        return k

    def decode_batch(self) -> tuple[int, int]:
        """(sequences, KV tokens read) of the next pure decode step; each later one reads one more per sequence."""
        return len(self._running), sum(s.computed + 1 for s in self._running)

    def _first_promotion(self) -> float:
        """The earliest time a waiting call could meet the core's anti-starvation
        condition, (program wait + call wait) >= bound x (program service + call
        model time), the bound no lower than the core's at the lowest the backlog's
        ratio can reach meanwhile (``backlog_ratio_floor``): only a waiting call's
        wait grows, one second per second, so the run ends before that and the next
        step's sweep decides, as in the plugin (which sweeps every
        ``SWEEP_INTERVAL_S``). Deciding stays the core's."""
        assert self.planner is not None
        queue = self.planner.queue
        if math.isinf(queue.spec.beta):
            return math.inf
        views = ProgramViews(self.planner.program_view)
        # never later than beta's time either: with no backlog factor this is the bound's floor
        bound = min(queue.spec.beta, queue.spec.starvation_bound(backlog_ratio_floor(queue, views.__getitem__)))
        first = math.inf
        for _, seq in self._waiting:
            call = queue.get(seq.req.request_id)
            if call is None or call.level == 0:
                continue
            view = views[call.program_id]
            # wait(t) = t - wait_origin - model_time
            at = call.wait_origin + call.model_time + bound * (view.charged + call.model_time) - view.wait
            first = min(first, at)
        return first

    def _waiting_outranks(self) -> bool:
        """Under the Autellix schedulers: does the best waiting call rank ahead of the worst running one?"""
        return bool(self._waiting) and self._waiting[0][0] < max(s.key() for s in self._running)

    def decode_steps(self, start: float, k: int) -> StepResult:
        """Apply ``k`` pure decode steps from ``start`` (at most ``coalescible``)."""
        running = list(self._running)
        d = len(running)
        cost = self.profile.cost
        kv0 = sum(s.computed + 1 for s in running)
        kv_total = k * kv0 + d * k * (k - 1) // 2
        seconds = k * (cost.overhead + cost.per_decode_seq * d) + cost.per_kv_token * kv_total
        end = start + seconds
        bs = self.profile.block_size
        tokens: dict[str, int] = {}
        finished: list[str] = []
        done: list[_Seq] = []
        for seq in running:
            need = -(-(seq.computed + k) // bs) - len(seq.blocks)
            if need > 0:
                seq.blocks += self.pool.allocate(need)
            seq.computed += k
            seq.num_output += k
            seq.num_tokens += k
            if seq.req.output is not None:
                seq.known = seq.num_tokens
            seq.model_time += seconds
            if self.prefix_caching and seq.computed // bs > seq.registered:
                self._register_full_blocks(seq)
            tokens[seq.req.request_id] = k
            if seq.num_output >= seq.req.max_tokens:
                finished.append(seq.req.request_id)
                done.append(seq)
        self._steps += k
        self._clock = end
        self.busy_seconds += seconds
        self.decode_seq_steps += k * d
        self.generated_tokens += k * d
        if self.planner is not None:
            self.planner.step_done(end, steps=k)
        outcomes = self._retire(done, end)
        return StepResult(seconds=seconds, tokens=tokens, first_token=[], finished=finished, preempted=[],
                          prefill_tokens=0, decode_seqs=k * d, cached_tokens=0, kv_tokens=kv_total,
                          outcomes=outcomes, steps=k)

    # ---- observation -----------------------------------------------------------------
    def reclaimable_blocks(self) -> int:
        """Blocks only held prefixes reference: used, but any allocation takes them back."""
        held = collections.Counter(self.ledger.all_held())
        return sum(1 for block, holds in held.items() if self.pool.refs(block) == holds)

    def kv_usage(self) -> float:
        """Share of KV blocks held by requests (cached free blocks do not count, as in vLLM)."""
        return self.pool.usage()

    def load(self) -> EngineLoad:
        """What the gateway reads of this engine (its metrics), now."""
        return EngineLoad(running=len(self._running), waiting=len(self._waiting), slots=self.profile.max_num_seqs,
                          kv_blocks_used=self.pool.used_blocks, kv_blocks_total=self.profile.kv_blocks,
                          kv_block_size=self.profile.block_size)

    def stats(self) -> dict[str, float]:
        bs = self.profile.block_size
        return {
            "running": float(len(self._running)),
            "waiting": float(len(self._waiting)),
            "kv_usage": self.kv_usage(),
            "prefix_hit_rate": self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0,
            "prefix_queries_tokens": float(self.queried_tokens),
            "prefix_hits_tokens": float(self.hit_tokens),
            "preemptions": float(self.preemptions),
            "recomputed_tokens": float(self.recomputed_tokens),
            "steps": float(self._steps),
            "generated_tokens": float(self.generated_tokens),
            "busy_seconds": self.busy_seconds,
            "prefill_tokens": float(self.prefill_tokens),
            "decode_seq_steps": float(self.decode_seq_steps),
            "new_requests": float(self.admitted),
            "finished_requests": float(self.finished_requests),
            # KV retention across pauses (``autellix.core.kv_retention``)
            "recomputed_prefix_tokens": float(self.ledger.recomputed_prefix_blocks * bs),
            "reused_prefix_tokens": float(self.ledger.reused_prefix_blocks * bs),
            "held_blocks": float(self.ledger.held_blocks),
            "kv_kept": float(self.ledger.kept),
            "kv_offloaded": float(self.ledger.offloaded),
            "kv_dropped": float(self.ledger.dropped),
            "kv_offloaded_blocks": float(self.ledger.offloaded_blocks),
            "kv_offloaded_saved_blocks": float(self.offloaded_saved_blocks),
            "restored_tokens": float(self.restored_tokens),
            "swap_seconds": self.swap_seconds,
        }

    def check_invariants(self) -> None:
        """KV within capacity, every block accounted for, the batch within bounds (tests)."""
        self.pool.check()
        assert len(self._running) <= self.profile.max_num_seqs, "more running than max_num_seqs"
        bs = self.profile.block_size
        assert all(len(s.blocks) * bs >= s.computed for s in self._running), "computed tokens without KV blocks"
        held = {b for s in self._running for b in s.blocks} | set(self.ledger.all_held())
        assert len(held) == self.pool.used_blocks, "a referenced block neither a running request nor a hold holds"
        assert not any(s.blocks for _, s in self._waiting), "a waiting request holds blocks"
        assert all(s.running for s in self._running), "running flag mismatch"

