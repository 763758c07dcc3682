"""A model of one vLLM V1 engine's scheduler: its running and waiting requests, and each step's batch, no clock.

``EngineModel.step(now)`` plans one batch as vLLM V1's ``Scheduler.schedule``
does and says how long it takes on the profiled hardware
(``autellix.sim.engine_profile``); the caller advances its own clock (virtual
in the simulator, real in the emulator) by that much. What is modelled, and
why it is enough for latency and throughput:

* the running set is bounded by ``max_num_seqs``; one token budget
  (``max_num_batched_tokens``) is shared by decodes (one token each, running
  requests first) and prefills, chunked when ``chunked_prefill`` is on (without
  it a prompt must fit the budget whole, and the budget is at least the context);
* KV capacity is ``kv_blocks`` blocks of ``block_size`` tokens; with prefix
  caching, full blocks are shared by chained hash and freed blocks stay cached
  until evicted LRU (``autellix.sim.engine_kv``, over ``autellix.sim.kv_cache``);
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
* KV retention across a program's pauses (the plugin's default):
  ``autellix.sim.engine_retention``.

Not modelled: sampling, speculative decoding, swapping preempted calls, CUDA
graphs' batch-size buckets (folded into the cost model), and the API server's
own queueing.

Beyond ``step``: ``step_until`` / ``coalescible`` + ``decode_steps`` run a
stretch of pure decode steps as one, with the same outcome as step by step
(``autellix.sim.engine_decode``; the simulator's speed, ``docs/simulation.md``).
The requests it takes and the results it gives are ``autellix.sim.engine_request``'s.
"""

from __future__ import annotations

import heapq
import itertools
import math

from autellix.core import SchedulerConfig
from autellix.core.engine_load import EngineLoad
from autellix.core.preemption import lost_kv_tokens
from autellix.engine.planner import CallIdentity, CallPlanner
from autellix.sim.cost_model import decode_run_kv_tokens
from autellix.sim.engine_decode import run_length
from autellix.sim.engine_kv import RequestBlocks
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.engine_request import RequestOutcome, Seq, SimRequest, StepResult
from autellix.sim.engine_retention import PrefixRetention
from autellix.sim.kv_cache import BlockHashes, BlockPool
from autellix.sim.kv_cache import block_hashes as python_block_hashes

SCHEDULERS = ("fcfs", "vllm-priority", "mlfq", "autellix")


class EngineModel:
    """One engine: queues, KV cache and step cost; time is always passed in."""

    def __init__(self, profile: EngineProfile, *, scheduler: str = "autellix", config: SchedulerConfig | None = None,
                 prefix_caching: bool = True, chunked_prefill: bool = True,
                 block_hashes: BlockHashes = python_block_hashes) -> None:
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
        self.retention = PrefixRetention(profile, self.pool,
                                         hold=self.planner is not None and prefix_caching and profile.kv_retention,
                                         idle_ttl=self.config.program_idle_ttl)
        self.kv = RequestBlocks(self.pool, profile.block_size, prefix_caching=prefix_caching,
                                retention=self.retention, hashes=block_hashes)
        self._seqs: dict[str, Seq] = {}
        self._running: list[Seq] = []
        self._waiting: list[tuple[tuple[int, float, int], Seq]] = []  # heap by key
        self._order = itertools.count()
        self._front = 0  # fcfs: preempted requests go back to the front
        self._steps = 0
        self._clock = -math.inf
        # counters
        self.preemptions = 0
        self.recomputed_tokens = 0
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
        seq = Seq(request, now, next(self._order))
        self.retention.arrived(seq, now)
        if self.planner is not None:
            who = CallIdentity(program_id=seq.program, thread_id=request.thread_id, service=request.service,
                               wait=request.wait, tree=request.tree, rank=request.rank,
                               declared=request.declared, tenant=request.tenant,
                               tenant_weight=request.tenant_weight)
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
    def _push_waiting(self, seq: Seq, *, front: bool = False) -> None:
        seq.running = False
        if self.priority_order:
            key = seq.key()
        elif front:
            self._front -= 1
            key = (self._front, 0.0, 0)
        else:
            key = (0, seq.arrival, seq.order)
        heapq.heappush(self._waiting, (key, seq))

    def _victim(self) -> Seq:
        if self.priority_order:
            return max(self._running, key=Seq.key)
        return self._running[-1]

    def _preempt(self, seq: Seq) -> None:
        self._running.remove(seq)
        self.pool.release(seq.blocks)
        self.recomputed_tokens += seq.computed
        seq.blocks, seq.computed, seq.registered = [], 0, 0
        seq.preemptions += 1
        self.preemptions += 1
        self._push_waiting(seq, front=True)

    def _leave(self, seq: Seq, now: float, *, aborted: bool) -> RequestOutcome:
        del self._seqs[seq.req.request_id]
        unpin = self.retention.leaving(seq, now, aborted=aborted)
        self.pool.release(seq.blocks)
        self.pool.release(unpin)
        self.retention.left(now)
        seq.blocks = []
        seq.running = False
        model_time = seq.model_time
        if self.planner is not None:
            record = self.planner.leave(seq.req.request_id, now, finished=not aborted)
            if record is not None:
                model_time = record.service_s
        return RequestOutcome(seq.req.request_id, seq.arrival, now, seq.first_scheduled, seq.first_token,
                              seq.num_prompt, seq.num_output, seq.cached, model_time, seq.preemptions, aborted)

    def _replan(self, now: float) -> list[Seq]:
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
        self._running.sort(key=Seq.key)
        return out

    def _lost_tokens(self, request_id: str) -> int:
        """What preempting the running request would make the engine recompute (no swapping here)."""
        seq = self._seqs[request_id]
        return lost_kv_tokens(seq.computed, block_size=self.profile.block_size, swappable=False,
                              kv_usage=self.pool.usage(), prefix_caching=self.prefix_caching)

    # ---- one step ------------------------------------------------------------------
    def step(self, now: float) -> StepResult:
        """Plan one batch at ``now`` and apply its outcome, which the caller sees
        ``.seconds`` later (tokens, first tokens, finished requests). The phases, as
        vLLM's scheduler runs them: the planner's re-plan, the running requests,
        the waiting ones, the batch's price, its outcome."""
        self._clock = max(self._clock, now)
        # Calls the planner preempts go before vLLM's schedule() runs (as in the
        # plugin), so unlike preemptions for KV they do not stop admissions this step.
        replanned: list[Seq] = []
        if self.planner is not None and self._steps % self.config.multi_step == 0:
            replanned = self._replan(now)
        scheduled: dict[str, tuple[Seq, int]] = {}
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

    def _schedule_running(self, scheduled: dict[str, tuple[Seq, int]], budget: int) -> tuple[int, list[Seq]]:
        """Running requests first, in order (rank order under the priority schedulers), each its next tokens
        within ``budget``; requests preempted to free KV blocks for them. The budget left and those preempted."""
        preempted: list[Seq] = []
        index = 0
        bs = self.profile.block_size
        kv = self.kv
        while index < len(self._running) and budget > 0:
            seq = self._running[index]
            n = min(seq.num_tokens - seq.computed, budget)
            # fast path: the tokens fit the blocks it holds (most decode steps)
            if seq.computed + n > len(seq.blocks) * bs:
                ok = True
                while not kv.allocate(seq, n, self._clock):
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
                kv.register_full_blocks(seq, seq.computed + n)
        return budget, preempted

    def _schedule_waiting(self, scheduled: dict[str, tuple[Seq, int]], budget: int,
                          now: float) -> tuple[int, int, int]:
        """Waiting requests admitted while the budget, the slots and the KV blocks allow, their prefix hits
        and restored blocks counted. The budget left, how many were admitted, the tokens found cached."""
        bs = self.profile.block_size
        kv, retention = self.kv, self.retention
        cached_now = admitted = 0
        while self._waiting and budget > 0 and len(self._running) < self.profile.max_num_seqs:
            seq = self._waiting[0][1]
            fresh = seq.computed == 0
            hits = kv.prefix_hits(seq) if fresh else []
            restore = retention.restorable(seq, len(hits)) if fresh else 0
            n = seq.num_tokens - seq.computed - (len(hits) + restore) * bs
            if not self.chunked_prefill and n > budget:
                break
            n = min(n, budget)
            if not kv.allocate(seq, n, self._clock, hits, restore):
                break
            heapq.heappop(self._waiting)
            kv.looked_up(seq, len(hits))
            cached_now += (len(hits) + restore) * bs
            seq.cached += (len(hits) + restore) * bs
            if fresh:
                retention.admitted(seq, len(hits), restore)
            seq.running = True
            if seq.first_scheduled is None:
                seq.first_scheduled = now
            self._running.append(seq)
            admitted += 1
            scheduled[seq.req.request_id] = (seq, n)
            budget -= n
            kv.register_full_blocks(seq, seq.computed + n)
        return budget, admitted, cached_now

    def _price(self, scheduled: dict[str, tuple[Seq, int]], admitted: int) -> tuple[float, int, int, int]:
        """The batch's cost in seconds (the profile's, plus KV moved this step), and its prefill tokens,
        decoding requests and KV tokens read; the engine's clock and counters advance by it."""
        swap_seconds = self.retention.take_swap_seconds()
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

    def _advance(self, scheduled: dict[str, tuple[Seq, int]], seconds: float,
                 end: float) -> tuple[dict[str, int], list[str], list[str], list[Seq]]:
        """The batch's outcome at ``end``: tokens computed and generated per request, first tokens, the
        requests that finished (by id, and themselves)."""
        self._clock = end
        bs = self.profile.block_size
        tokens: dict[str, int] = {}
        first: list[str] = []
        finished: list[str] = []
        done: list[Seq] = []
        caching = self.prefix_caching
        produced = 0
        for rid, (seq, n) in scheduled.items():
            seq.computed += n
            seq.model_time += seconds
            if caching and seq.computed // bs > seq.registered:
                self.kv.register_full_blocks(seq)
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

    def _retire(self, done: list[Seq], end: float) -> dict[str, RequestOutcome]:
        """Finished requests leave the batch; their outcomes, by id."""
        outcomes: dict[str, RequestOutcome] = {}
        if done:
            gone = set(map(id, done))
            self._running = [s for s in self._running if id(s) not in gone]
            for seq in done:
                outcomes[seq.req.request_id] = self._leave(seq, end, aborted=False)
                self.finished_requests += 1
        return outcomes

    # ---- coalesced decode steps (``autellix.sim.engine_decode``) ----------------------
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
        before anything but an arrival could change the batch (``engine_decode.run_length``)."""
        return run_length(self._running, self._waiting, self.planner, cost=self.profile.cost,
                          block_size=self.profile.block_size, slots=self.profile.max_num_seqs,
                          token_budget=self.token_budget, free_blocks=self.pool.free_blocks, start=start,
                          until=until)

    def decode_batch(self) -> tuple[int, int]:
        """(sequences, KV tokens read) of the next pure decode step; each later one reads one more per sequence."""
        return len(self._running), sum(s.computed + 1 for s in self._running)

    def decode_steps(self, start: float, k: int) -> StepResult:
        """Apply ``k`` pure decode steps from ``start`` (at most ``coalescible``)."""
        running = list(self._running)
        d, kv0 = self.decode_batch()
        kv_total = decode_run_kv_tokens(k, d, kv0)
        seconds = self.profile.cost.decode_run_seconds(k, d, kv0)
        end = start + seconds
        bs = self.profile.block_size
        kv = self.kv
        tokens: dict[str, int] = {}
        finished: list[str] = []
        done: list[Seq] = []
        for seq in running:
            kv.grow(seq, seq.computed + k)
            seq.computed += k
            seq.num_output += k
            seq.num_tokens += k
            if seq.req.output is not None:
                seq.known = seq.num_tokens
            seq.model_time += seconds
            if self.prefix_caching and seq.computed // bs > seq.registered:
                kv.register_full_blocks(seq)
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
        return self.retention.reclaimable_blocks()

    def kv_usage(self) -> float:
        """Share of KV blocks held by requests (cached free blocks do not count, as in vLLM)."""
        return self.pool.usage()

    def load(self) -> EngineLoad:
        """What the gateway reads of this engine (its metrics), now."""
        return EngineLoad(running=len(self._running), waiting=len(self._waiting), slots=self.profile.max_num_seqs,
                          kv_blocks_used=self.pool.used_blocks, kv_blocks_total=self.profile.kv_blocks,
                          kv_block_size=self.profile.block_size)

    def stats(self) -> dict[str, float]:
        kv = self.kv
        return {
            "running": float(len(self._running)),
            "waiting": float(len(self._waiting)),
            "kv_usage": self.kv_usage(),
            "prefix_hit_rate": kv.hit_tokens / kv.queried_tokens if kv.queried_tokens else 0.0,
            "prefix_queries_tokens": float(kv.queried_tokens),
            "prefix_hits_tokens": float(kv.hit_tokens),
            "preemptions": float(self.preemptions),
            "recomputed_tokens": float(self.recomputed_tokens),
            "steps": float(self._steps),
            "generated_tokens": float(self.generated_tokens),
            "busy_seconds": self.busy_seconds,
            "prefill_tokens": float(self.prefill_tokens),
            "decode_seq_steps": float(self.decode_seq_steps),
            "new_requests": float(self.admitted),
            "finished_requests": float(self.finished_requests),
        } | self.retention.stats()  # KV retention across pauses

    def check_invariants(self) -> None:
        """KV within capacity, every block accounted for, the batch within bounds (tests)."""
        self.pool.check()
        assert len(self._running) <= self.profile.max_num_seqs, "more running than max_num_seqs"
        bs = self.profile.block_size
        assert all(len(s.blocks) * bs >= s.computed for s in self._running), "computed tokens without KV blocks"
        held = {b for s in self._running for b in s.blocks} | set(self.retention.held())
        assert len(held) == self.pool.used_blocks, "a referenced block neither a running request nor a hold holds"
        assert not any(s.blocks for _, s in self._waiting), "a waiting request holds blocks"
        assert all(s.running for s in self._running), "running flag mismatch"
