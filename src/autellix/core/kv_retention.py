"""Whether an engine keeps, offloads or drops a paused program's KV prefix, and when it expects the program back.

An agent program's calls come in bursts: a call ends, a tool runs for a
second, the next call sends the same context plus the tool's answer. While
the program is away its prefix can be

* **kept** in device memory, held so that no other call's allocation takes it
  (the program resumes with a prefix-cache hit; the blocks serve nobody else
  meanwhile);
* **offloaded** to host memory (the transfer out now, the transfer back in if
  it returns; the device blocks are free at once);
* **dropped**: handed back to the engine's LRU free list, where the next
  allocations that find the list short take them and the program recomputes
  what was lost.

Keeping costs nothing while the engine has blocks to spare, so every paused
program's prefix is kept until an allocation finds the free list short. Then
prefixes are given up one program at a time in the order that costs least
(:func:`release_order`): what giving one up costs, in engine seconds, is its
blocks times the cheaper of the expected recompute (the chance it returns x
the prefill time of its tokens) and the transfers (out now, in if it returns,
when a host pool with room exists), divided by the block-seconds the release
frees (its blocks x the time until it is expected back). So a large prefix
that returns in a moment is the last to go, and one expected late, or
probably never, goes first.

The expectation comes from the engine's own observations
(:class:`ReturnPredictor`): the gaps between a program's calls, log-normal
per program, shrunk towards the gaps of all programs while a program has few
of its own, and the share of pauses that ended in a return. Given how long a
program has been away, the predictor says when it is expected back (the
conditional median) and how likely it is to return at all.

Pure and deterministic: time is passed in, the standard library only. The
vLLM scheduler plugin (``autellix.engine.kv.retention``) and the simulator's
engine model (``autellix.sim.engine_model``) both decide with this module.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from statistics import NormalDist
from typing import Generic, TypeVar

_NORMAL = NormalDist()
#: An engine's handle of a KV block, and a block's content hash (the engine's types).
Block = TypeVar("Block")
BlockHash = TypeVar("BlockHash")

#: A program expected back sooner than this is valued as if it returned in
#: this many seconds (no hold is worth infinitely much per block-second).
MIN_RETURN_S = 0.01
#: A paused program whose chance of returning has fallen below this is
#: released at the first shortage whatever it costs to recompute.
GONE_BELOW_PROBABILITY = 0.02


class Retention(StrEnum):
    KEEP = "keep"
    OFFLOAD = "offload"
    DROP = "drop"


@dataclass(frozen=True, slots=True)
class RetentionCosts:
    """Engine seconds per KV block of each way to give a prefix up."""

    #: Prefill time of one block's tokens (what recomputing it costs).
    recompute_s_per_block: float
    #: Device-to-host and host-to-device transfer of one block; infinite without a host pool.
    swap_out_s_per_block: float = math.inf
    swap_in_s_per_block: float = math.inf

    def __post_init__(self) -> None:
        for name in ("recompute_s_per_block", "swap_out_s_per_block", "swap_in_s_per_block"):
            value = getattr(self, name)
            if not value >= 0:  # NaN too
                raise ValueError(f"{name} must be >= 0 seconds, got {value!r}")

    @property
    def can_swap(self) -> bool:
        return math.isfinite(self.swap_out_s_per_block) and math.isfinite(self.swap_in_s_per_block)

    def drop_cost(self, blocks: int, return_probability: float) -> float:
        return return_probability * blocks * self.recompute_s_per_block

    def offload_cost(self, blocks: int, return_probability: float) -> float:
        return blocks * (self.swap_out_s_per_block + return_probability * self.swap_in_s_per_block)


@dataclass(frozen=True, slots=True)
class HeldPrefix:
    """A paused program's prefix, held in device memory."""

    key: Hashable
    blocks: int
    #: Seconds until the program is expected back (0: it is back, its call waits to run).
    returns_in: float
    #: The chance that it comes back at all.
    return_probability: float

    def __post_init__(self) -> None:
        if self.blocks < 0 or not self.returns_in >= 0 or not 0 <= self.return_probability <= 1:
            raise ValueError(f"bad held prefix: {self}")


def release_cost(prefix: HeldPrefix, costs: RetentionCosts, *, offload: bool) -> float:
    """Engine seconds that giving ``prefix`` up costs: by offloading (``offload``) or by dropping."""
    if offload:
        return costs.offload_cost(prefix.blocks, prefix.return_probability)
    return costs.drop_cost(prefix.blocks, prefix.return_probability)


def release_order(held: Iterable[HeldPrefix], costs: RetentionCosts, *,
                  host_free_blocks: int = 0) -> list[tuple[HeldPrefix, Retention]]:
    """Every held prefix, in the order to give them up (cheapest per block-second
    freed first), each with how: offload when that is cheaper than dropping and
    the host pool still has room for it after the ones before, else drop.
    Prefixes that will probably never be used again come first."""

    def rank(prefix: HeldPrefix) -> tuple[bool, float, float]:
        cheapest = costs.drop_cost(prefix.blocks, prefix.return_probability)
        if costs.can_swap:
            cheapest = min(cheapest, costs.offload_cost(prefix.blocks, prefix.return_probability))
        block_seconds = max(prefix.blocks, 1) * max(prefix.returns_in, MIN_RETURN_S)
        return (prefix.return_probability >= GONE_BELOW_PROBABILITY, cheapest / block_seconds, -prefix.returns_in)

    room = host_free_blocks
    out: list[tuple[HeldPrefix, Retention]] = []
    for prefix in sorted(held, key=rank):
        how = Retention.DROP
        if (costs.can_swap and 0 < prefix.blocks <= room
                and costs.offload_cost(prefix.blocks, prefix.return_probability)
                < costs.drop_cost(prefix.blocks, prefix.return_probability)):
            how = Retention.OFFLOAD
            room -= prefix.blocks
        out.append((prefix, how))
    return out


def plan_retention(held: Sequence[HeldPrefix], costs: RetentionCosts, *, shortfall: int,
                   host_free_blocks: int = 0) -> dict[Hashable, Retention]:
    """Per held prefix: keep, offload or drop, so that the released prefixes free
    at least ``shortfall`` blocks (the blocks an allocation lacks: memory
    pressure) at the least cost; with no shortfall every prefix is kept. When
    all of them together free less, all are released."""
    plan = {prefix.key: Retention.KEEP for prefix in held}
    freed = 0
    for prefix, how in release_order(held, costs, host_free_blocks=host_free_blocks):
        if freed >= shortfall:
            break
        plan[prefix.key] = how
        freed += prefix.blocks
    return plan


# ---- when a program comes back ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Forecast:
    returns_in: float
    return_probability: float


@dataclass(slots=True)
class _LogWindow:
    """Mean and variance of the last ``size`` values, kept in O(1) per value."""

    size: int
    values: deque[float] = field(default_factory=deque)
    total: float = 0.0
    squares: float = 0.0

    def add(self, value: float) -> None:
        self.values.append(value)
        self.total += value
        self.squares += value * value
        if len(self.values) > self.size:
            old = self.values.popleft()
            self.total -= old
            self.squares -= old * old

    def __len__(self) -> int:
        return len(self.values)

    def mean(self) -> float:
        return self.total / len(self.values)

    def variance(self) -> float:
        n = len(self.values)
        return max(0.0, (self.squares - self.total * self.total / n) / (n - 1)) if n > 1 else 0.0


@dataclass(slots=True)
class _Program:
    gaps: _LogWindow
    active: int = 0
    paused_at: float | None = None
    #: The pause was counted as one that ended without a return (it may still return).
    written_off: bool = False


class ReturnPredictor:
    """When each paused program is expected back, learnt from the gaps between its calls.

    A gap is the time from the moment a program had no call left on the engine
    to the arrival of its next call. Each program's log gaps are a normal
    distribution whose mean and variance are the program's own, shrunk towards
    the engine-wide ones with the weight of ``prior_weight`` gaps; the
    engine-wide ones start from ``prior_median_s`` and ``prior_sigma`` with the
    same weight. The chance of a return is the share of pauses that ended in
    one, starting from ``prior_return_probability`` (worth ``prior_weight``
    pauses); a pause that lasts past the 99.9th percentile of its program's
    gaps counts as one that did not.
    """

    def __init__(self, *, prior_median_s: float = 1.0, prior_sigma: float = 1.0, prior_weight: float = 4.0,
                 prior_return_probability: float = 0.9, window: int = 32, pooled_window: int = 1024) -> None:
        if not (prior_median_s > 0 and prior_sigma > 0 and prior_weight > 0 and 0 < prior_return_probability < 1
                and window >= 2 and pooled_window >= 2):
            raise ValueError("return predictor: priors must be positive, the probability in (0, 1), windows >= 2")
        self.prior_mu = math.log(prior_median_s)
        self.prior_sigma = prior_sigma
        self.prior_weight = prior_weight
        self.prior_return_probability = prior_return_probability
        self.window = window
        self._pooled = _LogWindow(pooled_window)
        self._programs: dict[Hashable, _Program] = {}
        self.returns = 0
        self.write_offs = 0

    def __contains__(self, program: object) -> bool:
        return program in self._programs

    def __len__(self) -> int:
        return len(self._programs)

    # ---- what the engine sees ----------------------------------------------------------
    def call_started(self, program: Hashable, now: float) -> float | None:
        """A call of ``program`` arrived. Returns the gap it ended, if the program was paused."""
        state = self._programs.get(program)
        if state is None:
            state = self._programs[program] = _Program(_LogWindow(self.window))
        gap = None
        if state.paused_at is not None:
            gap = max(now - state.paused_at, 1e-6)
            state.gaps.add(math.log(gap))
            self._pooled.add(math.log(gap))
            self.returns += 1
            if state.written_off:
                self.write_offs -= 1
            state.paused_at, state.written_off = None, False
        state.active += 1
        return gap

    def call_finished(self, program: Hashable, now: float) -> bool:
        """A call of ``program`` left the engine. Returns whether the program is now paused (no call left)."""
        state = self._programs.get(program)
        if state is None or state.active <= 0:
            return False
        state.active -= 1
        if state.active == 0:
            state.paused_at = now
            return True
        return False

    def forget(self, program: Hashable) -> None:
        self._programs.pop(program, None)

    def ended(self, program: Hashable) -> None:
        """``program`` will not be back (its session ended): a pause it is in counts as one that
        did not end in a return, and it is forgotten."""
        state = self._programs.pop(program, None)
        if state is not None and state.paused_at is not None and not state.written_off:
            self.write_offs += 1

    def has_returned(self, program: Hashable) -> bool:
        """Whether ``program`` came back after a pause at least once (within the window kept)."""
        state = self._programs.get(program)
        return state is not None and len(state.gaps) > 0

    def paused(self) -> list[Hashable]:
        return [key for key, state in self._programs.items() if state.paused_at is not None]

    def paused_at(self, program: Hashable) -> float | None:
        state = self._programs.get(program)
        return state.paused_at if state is not None else None

    # ---- what it expects ---------------------------------------------------------------
    def gap_distribution(self, program: Hashable) -> tuple[float, float]:
        """(mu, sigma) of the program's log gaps."""
        k = self.prior_weight
        pooled = self._pooled
        n = len(pooled)
        mu = (k * self.prior_mu + pooled.total) / (k + n)
        var = (k * self.prior_sigma ** 2 + (n - 1) * pooled.variance()) / (k + max(n - 1, 0))
        state = self._programs.get(program)
        if state is not None and len(state.gaps):
            own = state.gaps
            m = len(own)
            mu = (k * mu + own.total) / (k + m)
            var = (k * var + (m - 1) * own.variance()) / (k + m - 1)
        return mu, max(math.sqrt(var), 1e-3)

    def return_probability(self) -> float:
        """The share of pauses that ended in a return (engine-wide, with the prior)."""
        k = self.prior_weight
        return (k * self.prior_return_probability + self.returns) / (k + self.returns + self.write_offs)

    def forecast(self, program: Hashable, now: float) -> Forecast:
        """When the paused ``program`` is expected back, given how long it has been away,
        and how likely it is to come back at all. A program that is not paused is back: (0, 1)."""
        state = self._programs.get(program)
        if state is None or state.paused_at is None:
            return Forecast(0.0, 1.0)
        mu, sigma = self.gap_distribution(program)
        elapsed = max(now - state.paused_at, 0.0)
        # survival of the log-normal gap at the time already spent away
        z = (math.log(elapsed) - mu) / sigma if elapsed > 0 else -math.inf
        survival = 1.0 - _NORMAL.cdf(z) if elapsed > 0 else 1.0
        if survival < 1e-3 and not state.written_off:
            state.written_off = True
            self.write_offs += 1
        p = self.return_probability()
        probability = p * survival / (p * survival + 1.0 - p) if survival > 0 else 0.0
        # the conditional median: half of the remaining survival mass lies before it
        quantile = min(1.0 - survival / 2.0, 1.0 - 1e-12)
        median_gap = math.exp(mu + sigma * _NORMAL.inv_cdf(quantile))
        return Forecast(max(median_gap - elapsed, 0.0), probability)


# ---- an engine's holds ---------------------------------------------------------------------
def common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    """How many leading items ``a`` and ``b`` share (block hashes: the blocks a prefix shares)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class Release(Generic[Block]):
    """A hold the engine gives up: unpin ``blocks`` (offloading them first when ``how`` says so)."""

    program: Hashable
    blocks: tuple[Block, ...]
    how: Retention


class RetentionLedger(Generic[Block, BlockHash]):
    """The prefixes one engine holds for its paused programs, and what it decides about them.

    The engine (the vLLM plugin, or the simulator's engine model) tells the
    ledger what happens to calls and does what the ledger answers with its own
    blocks: pin the blocks :meth:`finished` returns (once a program has come back
    after a pause, the evidence that it returns, or from its first pause when its
    call said it expects to come back), unpin those
    :meth:`resumed` and :meth:`ended` (the program's session ended) return, and,
    when an allocation finds the free list short, unpin (offloading first, where
    it says so) what :meth:`shortage` returns.
    Blocks are the engine's handles; the ledger only counts and returns them.

    It also measures what the holds are for: per program the block hashes of
    its last finished call, so that when its next call is admitted the engine
    can say how much of the prefix it had computed before is computed again
    (:meth:`admitted`). With ``hold`` off it only measures: nothing is pinned,
    paused prefixes are left to the engine's LRU free list (stock vLLM).
    """

    def __init__(self, costs: RetentionCosts, predictor: ReturnPredictor | None = None, *, hold: bool = True) -> None:
        self.costs = costs
        self.predictor = predictor or ReturnPredictor()
        self.hold = hold
        self._holds: dict[Hashable, tuple[Block, ...]] = {}
        self._last_hashes: dict[Hashable, Sequence[BlockHash]] = {}
        self.held_blocks = 0
        #: Counts: holds taken, holds given up by offloading / dropping, holds ended by the program's return.
        self.kept = self.offloaded = self.dropped = self.resumed_holds = 0
        self.offloaded_blocks = self.dropped_blocks = 0
        #: Prefix blocks admitted calls found computed (locally or restored) vs. computed again.
        self.reused_prefix_blocks = self.recomputed_prefix_blocks = 0

    def __contains__(self, program: object) -> bool:
        return program in self._holds

    def held(self, program: Hashable) -> tuple[Block, ...]:
        return self._holds.get(program, ())

    def all_held(self) -> list[Block]:
        return [block for blocks in self._holds.values() for block in blocks]

    # ---- calls -------------------------------------------------------------------------------
    def arrived(self, program: Hashable, now: float) -> None:
        """A call of ``program`` arrived (its hold stays until the call is admitted)."""
        self.predictor.call_started(program, now)

    def admitted(self, program: Hashable, hashes: Sequence[BlockHash], reused_blocks: int) -> int:
        """A call of ``program`` was admitted with ``reused_blocks`` full blocks of its
        prompt already computed (prefix cache or host pool). Returns the blocks of
        the prefix its program's last call had computed that it computes again."""
        before = self._last_hashes.get(program)
        if not before:
            return 0
        common = common_prefix(hashes, before)
        reused = min(reused_blocks, common)
        self.reused_prefix_blocks += reused
        self.recomputed_prefix_blocks += common - reused
        return common - reused

    def resumed(self, program: Hashable) -> tuple[Block, ...]:
        """The program's call took its prefix (admitted): the hold ends. Returns the blocks to unpin."""
        blocks = self._drop_hold(program)
        if blocks:
            self.resumed_holds += 1
        return blocks

    def finished(self, program: Hashable, now: float, blocks: Sequence[Block],
                 hashes: Sequence[BlockHash], *, expect_return: bool = False) -> tuple[tuple[Block, ...],
                                                                                     tuple[Block, ...]]:
        """A call of ``program`` left the engine holding ``blocks`` (its full, cached
        blocks, hashed ``hashes``). Returns (blocks to pin now, blocks to unpin): the
        program's prefix is held when no other call of it is left on the engine and
        it is expected back: it came back after a pause before (a program of one call
        never does), or the call said so (``expect_return``: it offered tools)."""
        self._last_hashes[program] = tuple(hashes)
        paused = self.predictor.call_finished(program, now)
        expected = expect_return or self.predictor.has_returned(program)
        if not (paused and blocks and self.hold and expected):
            return (), ()
        unpin = self._drop_hold(program)
        held = tuple(blocks)
        self._holds[program] = held
        self.held_blocks += len(held)
        self.kept += 1
        return held, unpin

    def aborted(self, program: Hashable, now: float) -> tuple[Block, ...]:
        """A call of ``program`` was aborted: the program may be gone. Returns blocks to unpin."""
        self.predictor.call_finished(program, now)
        return self._drop_hold(program)

    def ended(self, program: Hashable) -> tuple[Block, ...]:
        """``program``'s session ended: it will not be back. Its hold is dropped and its history
        forgotten. Returns the blocks to unpin."""
        blocks = self._drop_hold(program)
        if blocks:
            self.dropped += 1
            self.dropped_blocks += len(blocks)
        self.predictor.ended(program)
        self._last_hashes.pop(program, None)
        return blocks

    # ---- memory pressure -------------------------------------------------------------------------
    def shortage(self, shortfall: int, now: float, *, host_free_blocks: int = 0) -> list[Release[Block]]:
        """An allocation lacks ``shortfall`` blocks: the holds to give up, cheapest first, and how."""
        if shortfall <= 0 or not self._holds:
            return []
        held = []
        for program, blocks in self._holds.items():
            forecast = self.predictor.forecast(program, now)
            held.append(HeldPrefix(program, len(blocks), forecast.returns_in, forecast.return_probability))
        plan = plan_retention(held, self.costs, shortfall=shortfall, host_free_blocks=host_free_blocks)
        out = []
        for prefix in held:
            how = plan[prefix.key]
            if how is Retention.KEEP:
                continue
            blocks = self._drop_hold(prefix.key)
            if how is Retention.OFFLOAD:
                self.offloaded += 1
                self.offloaded_blocks += len(blocks)
            else:
                self.dropped += 1
                self.dropped_blocks += len(blocks)
            out.append(Release(prefix.key, blocks, how))
        return out

    def release_all(self) -> list[Release[Block]]:
        """Every hold, dropped (the engine resets its prefix cache, or stops)."""
        out = [Release(program, self._drop_hold(program), Retention.DROP) for program in list(self._holds)]
        self.dropped += len(out)
        self.dropped_blocks += sum(len(r.blocks) for r in out)
        return out

    def expire(self, now: float, idle_s: float) -> list[Release[Block]]:
        """Programs paused for more than ``idle_s``: forgotten, their holds dropped."""
        out = []
        for program in self.predictor.paused():
            paused_at = self.predictor.paused_at(program)
            if paused_at is not None and now - paused_at > idle_s:
                blocks = self._drop_hold(program)
                if blocks:
                    self.dropped += 1
                    self.dropped_blocks += len(blocks)
                    out.append(Release(program, blocks, Retention.DROP))
                self.predictor.forget(program)
                self._last_hashes.pop(program, None)
        return out

    def _drop_hold(self, program: Hashable) -> tuple[Block, ...]:
        blocks = self._holds.pop(program, ())
        self.held_blocks -= len(blocks)
        return blocks

    def stats(self) -> dict[str, float]:
        return {
            "held_programs": float(len(self._holds)),
            "held_blocks": float(self.held_blocks),
            "kept": float(self.kept),
            "offloaded": float(self.offloaded),
            "dropped": float(self.dropped),
            "resumed_holds": float(self.resumed_holds),
            "offloaded_blocks": float(self.offloaded_blocks),
            "dropped_blocks": float(self.dropped_blocks),
            "reused_prefix_blocks": float(self.reused_prefix_blocks),
            "recomputed_prefix_blocks": float(self.recomputed_prefix_blocks),
            "return_probability": self.predictor.return_probability(),
        }
