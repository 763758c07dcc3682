"""Autellix's scheduler inside vLLM's V1 engine (``--scheduler-cls``).

vLLM's scheduler already does the hard, hardware-specific part well: token
budgets, chunked prefill, KV block allocation, prefix caching and recompute
preemption when memory runs out. What it lacks is the paper's order: quanta,
demotion, program-level priority and anti-starvation, and preemption of a
running call when a better-ranked one waits. So this class wraps, never
rewrites, ``Scheduler.schedule``:

1. Every request carries its call's queue rank (``QueuedCall.rank``, from the
   policy core) as its vLLM ``priority``. vLLM's priority policy then admits
   waiting requests in rank order and, when KV blocks run out, preempts the
   worst-ranked running one.
2. Each planning step (every ``multi_step`` steps) the planner runs Algorithm 1's
   demotion and anti-starvation, re-keys the requests that moved, and preempts
   running requests that rank below waiting ones when all ``max_num_seqs``
   slots are taken. Running requests are kept in rank order, so the token
   budget also goes to the best-ranked first.
3. Between ``schedule`` and ``update_from_output`` the engine runs the model
   (synchronously here), so that interval is each scheduled call's model time.
   Quanta count in scheduler steps: one decode token, or one prefill chunk.

4. KV retention across tool pauses (``autellix.engine.kv.retention``): when a
   program's last call leaves, its prefix is held for the program's next call
   and given back, in the order ``autellix.core.kv_retention`` decides, when
   an allocation finds the free list short.

Subclassing ``Scheduler`` (through ``TracedScheduler``, which records each
step when ``AUTELLIX_STEP_TRACE`` is set), not ``AsyncScheduler``: vLLM forces async scheduling
off on CPU; on GPU run with ``--no-async-scheduling`` (engine-image does), since
preempting a request that has a step in flight is only safe in the sync loop.
Parameters come from ``AUTELLIX_*`` environment variables (``SchedulerConfig.from_env``).
"""

from __future__ import annotations

import heapq
import logging
import os
import time
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from vllm.v1.core.sched.request_queue import PriorityRequestQueue, SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from autellix.core import SchedulerConfig
from autellix.core.preemption import lost_kv_tokens
from autellix.engine.feedback import FeedbackPublisher, ProgramEnds
from autellix.engine.kv.connector import AutellixSwapConnector
from autellix.engine.kv.pool import ResumeAccounting
from autellix.engine.kv.retention import (
    HostSwap,
    NoHostSwap,
    PrefixRetention,
    RetainingKVCacheManager,
    retention_enabled,
)
from autellix.engine.kv_events import describe as describe_kv_events
from autellix.engine.planner import CallIdentity, CallPlanner
from autellix.engine.step_trace import StepTrace
from autellix.protocol import INFO_KV_EVENTS, INFO_MAX_NUM_SEQS

log = logging.getLogger("autellix.engine.scheduler")


class RankedRequestQueue(PriorityRequestQueue):
    """vLLM's priority heap, re-keyed in place when ranks change."""

    def reorder(self) -> None:
        heapq.heapify(self._heap)


class TracedScheduler(Scheduler):
    """Stock vLLM scheduling, each step traced (``AUTELLIX_STEP_TRACE``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.step_trace = StepTrace.from_env()

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        output = super().schedule(*args, **kwargs)
        if self.step_trace is not None:
            self.step_trace.scheduled(t0, output, self.requests, len(self.running),
                                      len(self.waiting) + len(self.kv_holding_waiting))
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        t2 = time.monotonic()
        result = super().update_from_output(scheduler_output, model_runner_output)
        if self.step_trace is not None:
            self.step_trace.updated(t2, idle=not (self.running or self.waiting or self.kv_holding_waiting))
        return result

    def shutdown(self) -> None:
        if self.step_trace is not None:
            self.step_trace.flush()
        super().shutdown()


class AutellixScheduler(TracedScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: What the planner and retention read as now; an in-process scenario in step time replaces it.
        self.clock: Callable[[], float] = time.monotonic
        self.autellix_config = SchedulerConfig.from_env()
        if self.policy is not SchedulingPolicy.PRIORITY:
            log.info("Autellix orders requests by queue rank: using vLLM's priority policy")
            self.policy = SchedulingPolicy.PRIORITY
        # Both queues are still empty here; ours can be re-keyed.
        self.waiting = RankedRequestQueue()
        self.kv_holding_waiting = RankedRequestQueue()
        self.planner = CallPlanner(self.autellix_config)
        self.feedback = FeedbackPublisher.from_env()
        #: Sessions' ends from the gateway: their programs' holds go (None: no feedback socket).
        self.program_ends = ProgramEnds.from_env()
        self._steps = 0
        self._left = 0
        # tokens recomputed after preemption (docs/kv-swap.md)
        self.kv_resume = ResumeAccounting()
        # the swap connector, when loaded, keeps preempted calls' and paused programs' KV in host memory
        self.host_swap: HostSwap = (self.connector if isinstance(self.connector, AutellixSwapConnector)
                                    else NoHostSwap())
        manager = self.kv_cache_manager
        hold = (retention_enabled() and bool(self.cache_config.enable_prefix_caching)
                and len(self.kv_cache_config.kv_cache_groups) == 1
                and manager.block_pool.hash_block_size == self.block_size)
        self.retention = PrefixRetention(manager, self.block_size, self.host_swap, hold=hold)
        if hold:
            RetainingKVCacheManager.adopt(manager, self.retention, self._now)
        if self.feedback is not None:
            self.feedback.publish("hello", {"scheduler": "autellix", "pid": os.getpid(),
                                            "config": self.autellix_config.to_mapping(),
                                            INFO_MAX_NUM_SEQS: self.max_num_running_reqs,
                                            INFO_KV_EVENTS: describe_kv_events(
                                                self.vllm_config, manager.block_pool.hash_block_size)})
        log.info("Autellix scheduler: %s", self.autellix_config.to_mapping())

    def _now(self) -> float:
        return self.clock()

    # ---- arrivals and departures ------------------------------------------------
    def add_request(self, request: Request) -> None:
        # A known id is a streaming-input session's next chunk: the same call.
        if request.request_id not in self.requests:
            params = request.sampling_params
            who = CallIdentity.of(request.request_id, params.extra_args if params else None, request.session_id)
            now = self.clock()
            request.priority = self.planner.arrive(request.request_id, who, now).rank
            self.retention.arrived(who.program_id, request, now, named=who.named)
        super().add_request(request)

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        # Every way out (stop, length, abort, error) passes here exactly once.
        finished = request.status not in (RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR)
        now = self.clock()
        who = self.planner.identity(request.request_id)
        if who is not None:  # before vLLM frees its blocks: the program's prefix may be held
            if finished:
                self.retention.finished(who.program_id, request, now, named=who.named,
                                        expect_return=who.expect_return)
            else:
                self.retention.aborted(who.program_id, request, now)
            self._left += 1
            if self._left % 256 == 0:
                self.retention.expire(now, self.autellix_config.program_idle_ttl)
        record = self.planner.leave(request.request_id, now, finished=finished)
        if record is not None and record.call is not None and self.feedback is not None:
            self.feedback.publish("call", record.to_dict())
        self.kv_resume.forget((request.request_id,))
        return super()._free_request(request, *args, **kwargs)

    # ---- one step -----------------------------------------------------------------
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self._steps % self.autellix_config.multi_step == 0:
            self._sessions_ended()
            self._replan(self.clock())
        output = super().schedule(*args, **kwargs)
        self.planner.started(output.num_scheduled_tokens)
        for new in output.scheduled_new_reqs:  # first admissions: the prefix they found, held or not
            who = self.planner.identity(new.req_id)
            if who is not None:
                self.retention.admitted(who.program_id, self.requests[new.req_id], new.num_computed_tokens)
        if self.kv_resume.preempted:
            resumes = self.kv_resume.resumes
            recomputed = self.kv_resume.scheduled(output.num_scheduled_tokens, self.requests)
            if self.kv_resume.resumes > resumes:
                self.host_swap.count_resumed(self.kv_resume.resumes - resumes, recomputed)
        return output

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        # held prefixes are references vLLM's reset would find still taken
        self.retention.release_all()
        return super().reset_prefix_cache(*args, **kwargs)

    def _preempt_request(self, request: Request, timestamp: float, *args: Any, **kwargs: Any) -> None:
        # Every preemption (ours and vLLM's under KV pressure) passes here while the
        # request still holds its blocks: the swap connector, when loaded, copies
        # them to host memory in this step instead of letting them be recomputed.
        self.kv_resume.preempting(request.request_id, request.num_computed_tokens)
        self.host_swap.swap_out(request, self.kv_cache_manager.get_block_ids(request.request_id))
        super()._preempt_request(request, timestamp, *args, **kwargs)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        self.planner.step_done(self.clock())
        self._steps += 1
        return super().update_from_output(scheduler_output, model_runner_output)

    def shutdown(self) -> None:
        if self.program_ends is not None:
            self.program_ends.close()
        super().shutdown()

    def _sessions_ended(self) -> None:
        """The programs whose sessions ended since the last look: the prefixes held for them go."""
        if self.program_ends is not None:
            for program in self.program_ends.take():
                self.retention.ended(program)

    def _replan(self, now: float) -> None:
        moved, victims = self.planner.replan(now, (r.request_id for r in self.running), self.max_num_running_reqs,
                                             lost_tokens=self._lost_tokens)
        requests = self.requests
        waiting_moved = False
        for call in moved:
            request = requests.get(call.call_id)
            if request is not None and request.priority != call.rank:
                request.priority = call.rank
                waiting_moved |= request.status != RequestStatus.RUNNING
        if waiting_moved:
            self.waiting.reorder()
            self.kv_holding_waiting.reorder()
        if victims:
            self._preempt(victims, now)
        self.running.sort(key=_by_priority)

    def _lost_tokens(self, request_id: str) -> int:
        """What preempting a running request would make vLLM recompute: nothing if
        the swap connector can keep its blocks in host memory, else what the
        prefix cache may not hold (``autellix.core.preemption.lost_kv_tokens``)."""
        request = self.requests[request_id]
        computed = request.num_computed_tokens
        block_size = self.block_size
        capacity = self.host_swap.capacity
        return lost_kv_tokens(computed, block_size=block_size, swappable=-(-computed // block_size) <= capacity,
                              kv_usage=self.kv_cache_manager.usage,
                              prefix_caching=bool(self.cache_config.enable_prefix_caching))

    def _preempt(self, victims: list[Any], now: float) -> None:
        chosen = {call.call_id for call in victims}
        keep = []
        for request in self.running:
            if request.request_id in chosen and request.status == RequestStatus.RUNNING:
                # vLLM's V1 preemption: free the blocks, recompute later (prefix
                # caching keeps the recompute cheap while the blocks survive).
                self._preempt_request(request, now)
                # as reset_prefix_cache does: a call resumed in this same step must
                # reach the model runner as new, not as last step's continuation
                self.prev_step_scheduled_req_ids.discard(request.request_id)
            else:
                keep.append(request)
        self.running = keep


#: A request's sort key: its call's rank.
_by_priority = attrgetter("priority")
