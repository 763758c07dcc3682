"""Which running calls an engine preempts so that the best-ranked calls run.

Algorithm 1 forms each batch afresh from the queues: the first calls in queue
order that fit. An engine keeps running calls between steps, so the batch it
should run differs from the one it runs only where a waiting call now outranks
a running one. Preempting exactly those running calls, worst-ranked first and
no more than the slots the waiting ones need, turns the queue order into the
engine's batch with the fewest context switches (``preemption_victims`` with
no rule: the paper's eager form).

A preemption is not free, so by default it must pay for itself
(``PreemptionRule``):

* **The newcomer must gain.** It takes a running call's slot only if it sits in
  a better *queue* than the victim, not merely earlier in the same queue. Two
  calls of one queue belong to programs of the same attained-service class:
  swapping them is round robin, a context switch with nothing to gain under
  least-attained-service, while a newcomer from a better queue belongs to a
  program with a fraction of the victim's service (the boundaries are x4
  apart), which is expected to finish much sooner. Between tenants, a call
  within its tenant's slot quota outranks one beyond another's whatever their
  queues (``QueuedCall.band``): that is how a tenant gets its quota back.
* **The victim's loss counts.** Preemption by recompute throws away the
  victim's KV: the engine recomputes what the prefix cache no longer holds,
  and that prefill is paid by every call in the batch. The engine says, per
  running call, how many computed tokens a preemption would lose
  (``lost_kv_tokens``: none when the KV connector swaps them out, the last
  partial block when the prefix cache will hold the rest, all of them under
  KV pressure). Among the calls a newcomer may displace, those of the worst
  queue go first and, within it, those that lose least.
* **A budget per step.** At most ``max_victims`` calls and ``max_lost_tokens``
  recomputed tokens per planning step: a burst of arrivals displaces running
  calls gradually, while calls finishing on their own free slots too, instead
  of flushing the batch at once (each flush costs a prefill wave).

Preemption for KV pressure (vLLM's own, when a running call needs a block and
none is free) is the engine's and is not decided here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable
from dataclasses import dataclass
from itertools import islice

from autellix.core.mlq import QueuedCall

#: Above this share of KV blocks held by running calls, the blocks a victim frees
#: are likely to be evicted before it runs again (vLLM reuses free blocks in
#: LRU order), so the prefix cache is not counted on to hold them.
CACHE_HOLDS_BELOW_USAGE = 0.9


@dataclass(frozen=True, slots=True)
class PreemptionRule:
    """When the planner may preempt a running call for a waiting one."""

    #: Running calls preempted per planning step at most (0: never); engines
    #: take it from ``SchedulerConfig.max_preemptions``.
    max_victims: int = 2
    #: KV tokens the victims of one planning step may lose in total (recomputed later).
    max_lost_tokens: int = 8192
    #: Queues by which the newcomer must outrank its victim (1: any better queue).
    min_level_gap: int = 1
    #: A newcomer preempts only if it would otherwise wait at least this many
    #: steps for a running call to leave on its own (``SlotTurnover``): 32 steps
    #: is about half a second of decode on an A100, half the first quantum the
    #: paper's layout gave a call before it could be demoted.
    min_wait_steps: float = 32.0

    def __post_init__(self) -> None:
        if self.max_victims < 0 or self.max_lost_tokens < 0 or self.min_level_gap < 0 or self.min_wait_steps < 0:
            raise ValueError("preemption budgets, the level gap and the wait must be >= 0")


class SlotTurnover:
    """How fast running calls leave on their own: departures per engine step,
    averaged with a half-life of ``half_life`` steps. A newcomer that is k-th in
    line for a slot expects to wait k / rate steps without a preemption."""

    def __init__(self, half_life: float = 64.0) -> None:
        if not half_life > 0:
            raise ValueError("half_life must be > 0 steps")
        self.half_life = half_life
        self._departures = 0.0
        self._steps = 0.0

    def stepped(self, steps: int = 1) -> None:
        decay = 0.5 ** (steps / self.half_life)
        self._departures *= decay
        self._steps = self._steps * decay + steps

    def departed(self, count: int = 1) -> None:
        self._departures += count

    @property
    def rate(self) -> float:
        """Departures per step (0 before any)."""
        return self._departures / self._steps if self._steps > 0 else 0.0

    def expected_wait_steps(self, position: int) -> float:
        """Steps until the ``position``-th (1-based) call in line gets a slot freed by a departure."""
        rate = self.rate
        return position / rate if rate > 0 else float("inf")


def lost_kv_tokens(computed_tokens: int, *, block_size: int, swappable: bool, kv_usage: float,
                   prefix_caching: bool = True) -> int:
    """KV tokens a preemption by recompute would make the engine compute again.

    ``swappable``: the KV connector keeps the victim's blocks in host memory
    (nothing lost); ``kv_usage``: the share of KV blocks running calls hold,
    which decides whether the prefix cache will still hold the victim's full
    blocks when it resumes (the partial last block is never cached)."""
    if swappable or computed_tokens <= 0:
        return 0
    if prefix_caching and kv_usage < CACHE_HOLDS_BELOW_USAGE:
        return computed_tokens % block_size
    return computed_tokens


def preemption_victims(ordered: Iterable[QueuedCall], running: Collection[Hashable], capacity: int, *,
                       rule: PreemptionRule | None = None,
                       lost_tokens: Callable[[QueuedCall], int] | None = None,
                       turnover: SlotTurnover | None = None) -> list[QueuedCall]:
    """Running calls to preempt.

    ``ordered``: every live call in queue order (``MultiLevelQueue`` iterates so), the calls
    beyond their tenants' quotas (``band`` 1) after all the others;
    ``running``: ids of the calls the engine runs now; ``capacity``: how many
    calls a batch holds (vLLM's ``max_num_seqs``). The batch is the first
    ``capacity`` calls; each waiting call in it needs a slot, taken first from
    free slots, then from running calls outside the batch.

    Without ``rule``: every slot the batch needs, worst-ranked victims first.
    With one: only preemptions that pay for themselves (module docstring);
    ``lost_tokens(call)`` is what preempting ``call`` loses (0 if not given);
    ``turnover``: how soon slots free up on their own (no wait gate if not given).
    """
    if capacity < 1:
        raise ValueError("capacity must be >= 1")
    calls = iter(ordered)
    batch = list(islice(calls, capacity))  # the rest is read only when someone must go
    newcomers = [c for c in batch if c.call_id not in running]
    needed = len(newcomers) - max(capacity - len(running), 0)
    if needed <= 0:
        return []
    outside = [c for c in calls if c.call_id in running][::-1]  # worst-ranked first
    if rule is None:
        return outside[:needed]
    # Free slots go to the best-ranked newcomers (the engine admits in rank order);
    # the rest need a victim each, best-ranked newcomer first.
    needy = newcomers[len(newcomers) - needed:]
    cost = lost_tokens or (lambda _call: 0)
    # beyond a tenant's quota first, then the worst queue, and within a queue the call that loses least, then
    # the worst-ranked: the candidates a newcomer outranks come first, and a worse-ranked newcomer outranks no more
    candidates = sorted(((c, cost(c)) for c in outside), key=lambda cl: (-cl[0].band, -cl[0].level, cl[1]))
    victims: list[QueuedCall] = []
    spent = 0
    for position, newcomer in enumerate(needy, 1):
        if len(victims) >= rule.max_victims or not candidates \
                or not outranks(newcomer, candidates[0][0], rule.min_level_gap):
            break
        if turnover is not None and turnover.expected_wait_steps(position) < rule.min_wait_steps:
            continue  # a running call will leave soon enough: waiting costs less than a switch
        for i, (call, lost) in enumerate(candidates):
            if not outranks(newcomer, call, rule.min_level_gap):
                break
            if spent + lost > rule.max_lost_tokens:
                continue
            victims.append(call)
            spent += lost
            del candidates[i]
            break
    return victims


def outranks(newcomer: QueuedCall, victim: QueuedCall, min_level_gap: int) -> bool:
    """The newcomer may take the victim's slot: it is within its tenant's slot quota and the victim is
    beyond its own (``QueuedCall.band``), or both are on the same side and the newcomer sits at least
    ``min_level_gap`` queues (at least one) better."""
    if victim.band != newcomer.band:
        return victim.band > newcomer.band
    return victim.level - newcomer.level >= max(min_level_gap, 1)
