"""A tenant's standing: why opening fresh programs does not reset its priority.

PLAS and ATLAS rank a program by its attained service, and a new program
starts at zero, in the top queue. A client that opens a new session for every
call (or sends each call without one, or with a new implicit session id) would
stay in Q1 forever, ahead of every honest program that keeps its session.

The rule: a tenant (API key) keeps a *carry*, the service of its programs that
left the table (ended, expired or one-call), decaying with half-life
``half_life_s``. A new program of the tenant starts at the carry as its
service floor and takes it (the carry drops to zero), so:

* a program that cycles sessions hands its service from one session to the
  next: after n calls its n-th session starts where one long session would be,
  less the decay over the gaps between its calls (seconds, against a half-life
  of a minute): cycling gains (almost) nothing;
* an honest new program starts at zero unless its own tenant's programs ended
  within the last few half-lives, and then at most at what those programs
  attained; a tenant with no recent history is never delayed;
* service is never counted twice: a floor taken is gone from the carry.

Pure state, time passed in (seconds on the caller's clock).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class _Carry:
    service: float
    at: float


class TenantStanding:
    def __init__(self, half_life_s: float = 60.0, *, max_tenants: int = 100_000) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half_life_s: must be positive, got {half_life_s}")
        self.half_life_s = half_life_s
        self.max_tenants = max_tenants
        self._carry: dict[str | None, _Carry] = {}

    def _decayed(self, tenant: str | None, now: float) -> float:
        carry = self._carry.get(tenant)
        if carry is None:
            return 0.0
        return carry.service * math.pow(0.5, max(0.0, now - carry.at) / self.half_life_s)

    def carry(self, tenant: str | None, now: float) -> float:
        """The tenant's current carry (what its next new program would start at)."""
        return self._decayed(tenant, now)

    def program_left(self, tenant: str | None, service: float, now: float) -> None:
        """A program of ``tenant`` left the table with ``service`` seconds attained."""
        if service <= 0:
            return
        total = self._decayed(tenant, now) + service
        self._carry.pop(tenant, None)
        self._carry[tenant] = _Carry(total, now)  # most recent last: the oldest go first when full
        while len(self._carry) > self.max_tenants:
            del self._carry[next(iter(self._carry))]

    def take_floor(self, tenant: str | None, now: float) -> float:
        """The service a new program of ``tenant`` starts at; the carry is handed over."""
        floor = self._decayed(tenant, now)
        self._carry.pop(tenant, None)
        return floor if floor >= 1e-6 else 0.0


__all__ = ["TenantStanding"]
