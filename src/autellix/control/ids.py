"""Ids for calls and one-call programs: unique across gateway replicas, with no system call each.

``uuid.uuid4`` reads the kernel's random source on every id, about 2 µs, twice on a keyless
call's path. Here each generator draws 64 random bits once and counts after them: two
replicas' ids collide only if their prefixes do (for a thousand generators, a chance of
about one in 10^13).
"""

from __future__ import annotations

import itertools
import secrets


class UniqueIds:
    """``ids()``: ``<prefix><16 random hex digits>-<counter in hex>``, a new one each call."""

    def __init__(self, prefix: str = "") -> None:
        self._head = f"{prefix}{secrets.token_hex(8)}-"
        self._count = itertools.count(1)

    def __call__(self) -> str:
        return f"{self._head}{next(self._count):x}"


__all__ = ["UniqueIds"]
