"""Tenant shares: each tenant's weighted share of model time, and how far each tenant is ahead of it.

PLAS and ATLAS rank programs, so a tenant that runs a swarm of fresh programs
ranks all of them at zero service, ahead of another tenant's one long agent,
and takes the engines from it. Shares give each tenant a weight (default 1);
its service over its weight is its *normalised service*, and what it is ahead
of the least-served tenant with calls in flight decides:

* **at an engine, its slot quota** (``slot_quotas``): the engine's slots split
  between its active tenants by weight, a tenant's weight halved for every
  ``QUOTA_HALVING_S`` seconds of the engine's time it is ahead. Each tenant's
  best-ranked calls, as many as its quota, run ahead of every call beyond a
  quota (``CallPlanner``, ``QueuedCall.band``), and within the quotas and
  beyond them the order is the policy's. Programs keep their own priority:
  alike tenants each keep their small programs first, and what a tenant's
  calls do not fill of its quota goes to the others (work-conserving);
* **at the gateway, its lead** (``lead``: what it is ahead, times
  ``LEAD_GAIN``), added to every program's priority of the tenant
  (``ProcessTable.view``): the priority the gateway sends engines that rank by
  it alone (``send_priority``), where there are no slots to give a quota of;
* anti-starvation reads a program's waiting as patiently as its tenant's
  weight is short of the heaviest active tenant's (``patience``): a tenant of a
  third of another's weight waits three times as long for the same service, by
  design;
* a tenant alone has no quota and no lead: it loses nothing.

A tenant's service is charged as its calls finish. Credit is not banked: a
tenant that starts calls again after a pause starts at least at the least
normalised service of the tenants active then, and what it was ahead by when it
paused halves every ``half_life_s`` of the pause, so neither a long sleep nor
a short one pays.

Pure state, time passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

#: A tenant's weight when none is set.
DEFAULT_WEIGHT = 1.0
#: A tenant ahead of the least-served active tenant by this many seconds of the whole engine's time (its
#: normalised service over the engine's slots) counts at half its weight in its slot quota, a quarter at
#: twice that (``slot_quotas``). Untilted quotas left a lone agent, whose bursts need more than half of
#: the engine between stretches that need less, at 1.26x its latency beside a tenant like it against
#: another tenant's swarm (a scratch version); tilted, 1.09x (experiments/tenant_shares.py).
QUOTA_HALVING_S = 0.5
#: What a second of lead weighs against a second of a program's own priority. A tenant's one program
#: ranks by its own service, which is its tenant's too: at a gain of 1, such a program that could
#: use the whole engine held only a third of it against another tenant's swarm of fresh programs
#: (both count the lone tenant's service), at 4 it holds about 4/9 (experiments/tenant_shares.py).
LEAD_GAIN = 4.0


@dataclass(slots=True)
class TenantShare:
    """One tenant's account."""

    name: str
    weight: float = DEFAULT_WEIGHT
    #: Model time its calls took here, in all, and elsewhere as last heard (other gateway replicas').
    service: float = 0.0
    elsewhere: float = 0.0
    #: Service over weight on the shares' reckoning (floored on return: ``TenantShares.call_started``).
    normalized: float = 0.0
    #: Its model time with a half-life of ``TenantShares.half_life_s``: what ``recent_share`` divides.
    recent: float = 0.0
    recent_at: float = 0.0
    in_flight: int = 0
    #: When its last call in flight ended (None while it has calls in flight, or before its first).
    idle_since: float | None = None


class TenantShares:
    """Every tenant's normalised service, and which tenants have calls in flight."""

    def __init__(self, *, half_life_s: float = 60.0, max_tenants: int = 100_000, lead_gain: float = LEAD_GAIN,
                 quota_halving_s: float = QUOTA_HALVING_S) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half_life_s: must be positive, got {half_life_s}")
        if lead_gain < 0 or not quota_halving_s > 0:
            raise ValueError("lead_gain must be >= 0 and quota_halving_s positive")
        self.half_life_s = half_life_s
        #: What the lead weighs (``lead``): 0 where slot quotas share the engine instead (``CallPlanner``).
        self.lead_gain = lead_gain
        self.quota_halving_s = quota_halving_s
        self.max_tenants = max_tenants
        self._tenants: dict[str | None, TenantShare] = {}
        #: Weights set by name (the gateway's keys): a tenant's account starts with its weight here.
        self._configured: dict[str, float] = {}
        self._active: set[str | None] = set()
        #: The least normalised service and the largest weight of the active tenants (None: recompute).
        self._floor: float | None = None
        self._heaviest: float | None = None

    def __len__(self) -> int:
        return len(self._tenants)

    def __iter__(self) -> Iterator[TenantShare]:
        return iter(list(self._tenants.values()))

    def account(self, tenant: str | None) -> TenantShare:
        share = self._tenants.get(tenant)
        if share is None:
            share = self._tenants[tenant] = TenantShare(name=tenant or "", weight=self._configured_weight(tenant))
            if len(self._tenants) > self.max_tenants:
                self._forget_idle(keep=tenant)
        return share

    def set_weight(self, tenant: str | None, weight: float) -> None:
        """``tenant``'s weight from now on (its normalised service so far stays as it is)."""
        share = self.account(tenant)
        weight = _checked(weight)
        if share.weight != weight:
            share.weight, self._heaviest = weight, None

    def configure(self, weights: Mapping[str, float]) -> None:
        """Every named tenant's weight (the gateway's keys): those not named go back to the default."""
        self._configured = {tenant: _checked(weight) for tenant, weight in weights.items()}
        for tenant, share in self._tenants.items():
            if tenant is not None:
                share.weight = self._configured_weight(tenant)
        self._heaviest = None

    def weight(self, tenant: str | None) -> float:
        share = self._tenants.get(tenant)
        return share.weight if share is not None else self._configured_weight(tenant)

    def _configured_weight(self, tenant: str | None) -> float:
        return self._configured.get(tenant, DEFAULT_WEIGHT) if tenant is not None else DEFAULT_WEIGHT

    # ---- calls -------------------------------------------------------------------
    def call_started(self, tenant: str | None, now: float) -> None:
        share = self.account(tenant)
        if share.in_flight == 0:
            self._return(share, tenant, now)
            self._active.add(tenant)
            self._floor = self._heaviest = None
        share.in_flight += 1

    def _return(self, share: TenantShare, tenant: str | None, now: float) -> None:
        """A tenant that had no call in flight starts one: no credit from its pause, and
        what it was ahead by decays over the pause."""
        others = [self._tenants[t].normalized for t in self._active if t != tenant]
        if not others:
            return
        floor = min(others)
        ahead = share.normalized - floor
        if ahead <= 0:
            share.normalized = floor
        elif share.idle_since is not None:
            share.normalized = floor + ahead * 0.5 ** (max(0.0, now - share.idle_since) / self.half_life_s)

    def call_ended(self, tenant: str | None, model_time: float, now: float) -> None:
        """A call of ``tenant`` finished (``model_time`` > 0) or left without a result."""
        share = self._tenants.get(tenant)
        if share is None or share.in_flight == 0:
            raise KeyError(f"tenant {tenant!r} has no call in flight")
        if model_time > 0:
            share.service += model_time
            share.normalized += model_time / share.weight
            share.recent = self._recent(share, now) + model_time
            share.recent_at = now
            self._floor = None
        share.in_flight -= 1
        if share.in_flight == 0:
            share.idle_since = now
            self._active.discard(tenant)
            self._floor = self._heaviest = None

    def served_elsewhere(self, tenant: str | None, service: float) -> None:
        """``tenant``'s calls have taken ``service`` seconds of model time elsewhere in all (other gateway
        replicas', through the shared store): what it grew by since last heard counts as if served here."""
        share = self.account(tenant)
        grown = service - share.elsewhere
        if grown > 0:
            share.elsewhere = service
            share.normalized += grown / share.weight
            self._floor = None

    # ---- what the queues read ------------------------------------------------------
    def lead(self, tenant: str | None) -> float:
        """How far ``tenant`` is ahead of the least-served active tenant, in seconds of model time
        per unit of weight, times ``lead_gain`` (0 for the least-served, for a tenant alone, and for
        one with no call in flight)."""
        if len(self._active) < 2 or tenant not in self._active or not self.lead_gain:
            return 0.0
        return self.lead_gain * (self._tenants[tenant].normalized - self._least_normalized())

    def _least_normalized(self) -> float:
        if self._floor is None:
            self._floor = min(self._tenants[t].normalized for t in self._active)
        return self._floor

    def slot_quotas(self, capacity: int) -> dict[str | None, int] | None:
        """How many of an engine's ``capacity`` slots each active tenant's calls may hold ahead of every
        other tenant's, by weight, in whole slots that add up to ``capacity`` (the largest remainders
        round up); None for fewer than two active tenants (nothing to share).

        Each tenant counts at its weight, halved for every ``quota_halving_s`` seconds of the engine's
        time (``capacity`` times that in normalised service) it is ahead of the least-served active
        tenant: a tenant that held less than its share while it had fewer calls than its quota gets
        more of the engine when its calls come in a burst, and one that held more gets less, until
        they are even (credit is not banked past a pause: ``call_started``)."""
        if len(self._active) < 2:
            return None
        floor = self._least_normalized()
        scale = self.quota_halving_s * capacity
        tilted = {}
        for tenant in self._active:
            share = self._tenants[tenant]
            tilted[tenant] = share.weight * 0.5 ** ((share.normalized - floor) / scale)
        total = sum(tilted.values())
        exact = {tenant: capacity * part / total for tenant, part in tilted.items()}
        quotas = {tenant: math.floor(quota) for tenant, quota in exact.items()}
        by_remainder = sorted(exact, key=lambda tenant: (quotas[tenant] - exact[tenant], str(tenant)))
        for tenant in by_remainder[: capacity - sum(quotas.values())]:
            quotas[tenant] += 1
        return quotas

    def patience(self, tenant: str | None) -> float:
        """The heaviest active tenant's weight over ``tenant``'s (1 for the heaviest and a tenant alone): how
        many times longer than that tenant's programs its programs wait for their service by their weights,
        so anti-starvation (``core.mlq``) reads their waiting that much more patiently."""
        if len(self._active) < 2 or tenant not in self._active:
            return 1.0
        if self._heaviest is None:
            self._heaviest = max(self._tenants[t].weight for t in self._active)
        return self._heaviest / self._tenants[tenant].weight

    def describe(self, now: float) -> list[dict[str, object]]:
        """Every tenant's account, JSON-friendly (the gateway's ``GET /admin/tenants``), by name, with its
        part of all tenants' model time over about the last ``half_life_s`` (``recent_share``)."""
        recent = {tenant: self._recent(share, now) for tenant, share in self._tenants.items()}
        total = sum(recent.values())
        return [{"tenant": share.name or None, "weight": share.weight, "service": share.service,
                 "service_elsewhere": share.elsewhere, "calls_in_flight": share.in_flight, "lead": self.lead(tenant),
                 "recent_share": recent[tenant] / total if total > 0 else 0.0}
                for tenant, share in sorted(self._tenants.items(), key=lambda item: item[1].name)]

    def _recent(self, share: TenantShare, now: float) -> float:
        return share.recent * 0.5 ** (max(0.0, now - share.recent_at) / self.half_life_s)

    def _forget_idle(self, *, keep: str | None) -> None:
        """Over ``max_tenants``: forget the tenants idle longest (each loses only what it was ahead by)."""
        idle = sorted((s.idle_since or 0.0, i, t) for i, (t, s) in enumerate(self._tenants.items())
                      if t not in self._active and t != keep)
        for _, _, tenant in idle[: len(self._tenants) - self.max_tenants]:
            del self._tenants[tenant]


def _checked(weight: float) -> float:
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < math.inf:
        raise ValueError(f"tenant weight: expected a positive number, got {weight!r}")
    return float(weight)


__all__ = ["DEFAULT_WEIGHT", "TenantShare", "TenantShares"]
