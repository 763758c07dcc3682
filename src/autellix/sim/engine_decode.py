"""Decode runs: how many pure decode steps the engine model can take as one, with the outcome of step by step.

While every running request decodes and nothing can join or leave the batch,
the engine's steps differ only in the KV tokens they read, so ``k`` of them
can be applied at once (``EngineModel.decode_steps``): the simulator's speed
(``docs/simulation.md``). A run ends before the first finish, a quantum
running out, the KV cache filling, or the next anti-starvation sweep that
could promote a waiting call. Read-only: nothing here changes the engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autellix.core.mlq import ProgramViews, backlog_ratio_floor
from autellix.engine.planner import CallPlanner
from autellix.sim.cost_model import StepCost
from autellix.sim.engine_request import Seq

#: The engine model's waiting requests: a heap of (rank key, request).
Waiting = Sequence[tuple[tuple[int, float, int], Seq]]


def run_length(running: Sequence[Seq], waiting: Waiting, planner: CallPlanner | None, *, cost: StepCost,
               block_size: int, slots: int, token_budget: int, free_blocks: int, start: float,
               until: float = math.inf) -> int:
    """How many pure decode steps can run from ``start`` (ending by ``until``)
    before anything but an arrival could change the batch: the first finish,
    a quantum running out, the KV cache filling, the next anti-starvation sweep."""
    d = len(running)
    if d > token_budget:
        return 0
    if waiting and (len(running) < slots or (planner is not None and waiting_outranks(waiting, running))):
        return 0
    if any(s.computed != s.num_tokens - 1 for s in running):
        return 0
    if planner is not None and waiting:
        until = min(until, first_promotion(planner, waiting))
    k = min(s.req.max_tokens - s.num_output for s in running)
    if planner is not None:
        queue = planner.queue
        for s in running:
            call = queue.get(s.req.request_id)
            if call is not None and call.quantum_left < k:
                k = max(int(call.quantum_left), 0)
    # time: steps that end by ``until``
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
    bs = block_size
    while k > 0 and sum(max(0, -(-(s.computed + k) // bs) - len(s.blocks)) for s in running) > free_blocks:
        k //= 2
    return k


def first_promotion(planner: CallPlanner, waiting: Waiting) -> float:
    """The earliest time a waiting call could meet the core's anti-starvation
    condition, (program wait + call wait) >= bound x (program service + call
    model time), the bound no lower than the core's at the lowest the backlog's
    ratio can reach meanwhile (``backlog_ratio_floor``): only a waiting call's
    wait grows, one second per second, so the run ends before that and the next
    step's sweep decides, as in the plugin (which sweeps every
    ``SWEEP_INTERVAL_S``). Deciding stays the core's."""
    queue = planner.queue
    if math.isinf(queue.spec.beta):
        return math.inf
    views = ProgramViews(planner.program_view)
    # never later than beta's time either: with no backlog factor this is the bound's floor
    bound = min(queue.spec.beta, queue.spec.starvation_bound(backlog_ratio_floor(queue, views.__getitem__)))
    first = math.inf
    for _, seq in waiting:
        call = queue.get(seq.req.request_id)
        if call is None or call.level == 0:
            continue
        view = views[call.program_id]
        # wait(t) = t - wait_origin - model_time
        at = call.wait_origin + call.model_time + bound * (view.charged + call.model_time) - view.wait
        first = min(first, at)
    return first


def waiting_outranks(waiting: Waiting, running: Sequence[Seq]) -> bool:
    """Under the Autellix schedulers: does the best waiting call rank ahead of the worst running one?"""
    return bool(waiting) and waiting[0][0] < max(s.key() for s in running)
