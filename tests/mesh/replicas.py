"""Gateway replicas' program stores for the store's tests: each on a connection of its own to one server."""

from __future__ import annotations

from typing import Any

from autellix.control.store.connection import StoreConnection
from autellix.control.store.redis_programs import RedisProgramStore
from autellix.core import PLAS


def replica(url: str, *, prefix: str = "autellix:", **options: Any) -> RedisProgramStore:
    """One replica's program store (PLAS), on a connection of its own to the store at ``url``."""
    return RedisProgramStore(StoreConnection(url, prefix=prefix), PLAS(), **options)


async def stop(store: RedisProgramStore) -> None:
    """The replica's SIGTERM path: its last write behind, then its connection closed."""
    await store.close()
    await store.connection.close()
