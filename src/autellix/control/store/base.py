"""The gateway's store as one object: its programs, stored responses and engine drains, with its health and metrics.

A gateway (and the endpoint picker, which runs the gateway's parts) keeps three
kinds of state, reached through one ``GatewayStore``:

* ``programs``: the process table, sessions and pins (``autellix.control.store.programs``);
* ``responses``: where each stored Responses API response lives, for the chains that
  continue it (``autellix.control.store.responses``);
* ``drains``: where an engine drain goes before it applies here (``autellix.control.store.drains``).

``open_store`` picks where they live: in this process (``MemoryStore``: one
gateway), or, with a store URL (``GatewayConfig.store_url``, ``--store``), in a
Redis-compatible server shared by gateway replicas, over one client and its
connection pool (``autellix.control.store.shared``). Both answer the same interface,
which also has the store's health (``ping``; ``ready``: whether it answered its last
look, which is not the gateway's readiness), its metrics (``collectors``, for the
gateway's registry), the takeover's check (``check_takeovers``) and its life as one
of the gateway's services (``start``; ``stop``: the last write behind).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Protocol

from prometheus_client.registry import Collector

from autellix.control.store.drains import DrainSharing, LocalDrains
from autellix.control.store.programs import MemoryProgramStore, ProgramStore
from autellix.control.store.responses import MemoryResponseRecords, ResponseRecords
from autellix.control.store.takeover import ServiceWitness, TakeoverCounts
from autellix.core import Policy

#: The URLs of a shared store: Redis over TCP, over TLS, or over a Unix socket.
STORE_SCHEMES = ("redis://", "rediss://", "unix://")


class GatewayStore(Protocol):
    """A gateway's programs, stored responses and engine drains, with the store's health, metrics and life."""

    @property
    def programs(self) -> ProgramStore: ...

    @property
    def responses(self) -> ResponseRecords: ...

    @property
    def drains(self) -> DrainSharing: ...

    @property
    def ready(self) -> bool:
        """Whether the store answered its last look (``/metrics`` says so; the gateway serves on either way)."""
        ...

    async def ping(self) -> bool:
        """Look at the store now; whether it answered (a failure is counted in its metrics, never raised)."""
        ...

    def collectors(self) -> Sequence[Collector]:
        """The store's metrics, for the registry of the gateway that serves it (once)."""
        ...

    def check_takeovers(self, witness: ServiceWitness) -> None:
        """Check every program taken over from another replica against ``witness`` (the engines); a store
        that never takes programs over (one gateway) does nothing."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """Write what is written behind, then let go of the store."""
        ...


class MemoryStore:
    """Everything in this process: one gateway."""

    def __init__(self, policy: Policy, *, idle_ttl: float = math.inf, response_ttl: float = math.inf) -> None:
        self.programs = MemoryProgramStore(policy, idle_ttl=idle_ttl)
        self.responses = MemoryResponseRecords(ttl=response_ttl)
        self.drains = LocalDrains()
        # no program is ever taken over here, but every gateway exports the same metrics (at 0 here)
        self._takeovers = TakeoverCounts()

    @property
    def ready(self) -> bool:
        return True

    async def ping(self) -> bool:
        return True

    def collectors(self) -> Sequence[Collector]:
        return self._takeovers.collectors()

    def check_takeovers(self, witness: ServiceWitness) -> None:
        return None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        await self.programs.flush()


def open_store(url: str | None, policy: Policy, *, idle_ttl: float = math.inf, response_ttl: float = math.inf,
               poll_interval: float = 1.0) -> GatewayStore:
    """The store at ``url`` (one of ``STORE_SCHEMES``: shared with other replicas), or in memory (None); a
    ``ValueError`` for any other URL. ``idle_ttl``: seconds an idle program stays; ``response_ttl``: seconds a
    stored response can be chained from; ``poll_interval``: seconds between two reads of the shared drains."""
    if url is None:
        return MemoryStore(policy, idle_ttl=idle_ttl, response_ttl=response_ttl)
    if not url.startswith(STORE_SCHEMES):
        raise ValueError(f"--store: expected a redis:// URL, got {redacted_url(url)!r}")
    from autellix.control.store.shared import SharedStore  # redis: only with a shared store

    return SharedStore(url, policy, idle_ttl=idle_ttl, response_ttl=response_ttl, poll_interval=poll_interval)


def redacted_url(url: str) -> str:
    """``url`` with its password, if it has one, as ``***`` (``redis://:***@host:6379/0``, and a
    ``password=`` query parameter): what a log line or an error may show of a store's URL."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    rest, question, query = rest.partition("?")
    userinfo, at, location = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.partition(':')[0]}:***@{location}"
    query = re.sub(r"(^|&)(password=)[^&]*", r"\1\2***", query)
    return f"{scheme}://{rest}{question}{query}"


__all__ = ["STORE_SCHEMES", "GatewayStore", "MemoryStore", "open_store", "redacted_url"]
