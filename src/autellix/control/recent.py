"""Ids remembered for a while: bounded in count and in age, so memory is too.

The gateway remembers ids past the life of what they named: ended session ids
(a late call gets a clear 404, and an implicit session id is not silently
reopened), and program keys it has counted (``autellix.gateway.lifecycle``).
Remembered by count alone, such a set grows with every new session until its
cap, which under steady session churn takes hours and, at 100,000 ids, some
40 MiB. ``RecentIds`` forgets an id ``ttl_s`` seconds after it was last added
(and the oldest first beyond ``max_items``), so under a steady rate of new ids
it holds at most ``min(max_items, rate * ttl_s)`` of them: its size stops
growing once ``ttl_s`` has passed.

Pure state, time passed in; callers pass non-decreasing times (a time earlier
than one already passed counts as that one).
"""

from __future__ import annotations

import math
from collections import OrderedDict


class RecentIds:
    """Ids, each forgotten ``ttl_s`` after it was last ``add``-ed; at most ``max_items``."""

    def __init__(self, max_items: int, ttl_s: float = math.inf) -> None:
        if max_items < 0:
            raise ValueError(f"max_items: must be at least 0, got {max_items}")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s: must be positive, got {ttl_s}")
        self.max_items, self.ttl_s = max_items, ttl_s
        #: id -> when it was last added; oldest first (times never decrease along it).
        self._added: OrderedDict[str, float] = OrderedDict()
        self._now = -math.inf

    def add(self, item: str, now: float) -> bool:
        """Remember ``item`` as of ``now`` (again: its age restarts). True if it was not remembered."""
        self.forget_old(now)
        new = item not in self._added
        if not new:
            self._added.move_to_end(item)
        self._added[item] = self._now
        while len(self._added) > self.max_items:
            self._added.popitem(last=False)
        return new

    def forget_old(self, now: float) -> None:
        """Forget the ids added ``ttl_s`` or more before ``now``."""
        self._now = max(self._now, now)
        horizon = self._now - self.ttl_s
        while self._added and next(iter(self._added.values())) <= horizon:
            self._added.popitem(last=False)

    def discard(self, item: str) -> None:
        self._added.pop(item, None)

    def __contains__(self, item: object) -> bool:
        """Remembered: added less than ``ttl_s`` before the latest time passed."""
        added = self._added.get(item)  # type: ignore[call-overload]
        return added is not None and added > self._now - self.ttl_s

    def __len__(self) -> int:
        return len(self._added)


__all__ = ["RecentIds"]
