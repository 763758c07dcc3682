"""Versioned snapshots of Envoy's configuration, one per node, and the cache that holds them.

The idea of go-control-plane's snapshot cache: the control plane never talks to
Envoy directly; it replaces a node's whole snapshot, and every ADS stream of that
node wakes up and sends the resource types whose version changed. A type's
version is a digest of its resources, so rebuilding an unchanged snapshot sends
nothing. The cache lives on the ADS server's event loop; only that loop touches it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import betterproto2

from autellix.mesh.resources import content_version

#: The snapshot a node gets when it has none of its own.
ANY_NODE = ""


@dataclass(frozen=True)
class Snapshot:
    resources: Mapping[str, Mapping[str, betterproto2.Message]]
    versions: Mapping[str, str]

    @classmethod
    def of(cls, resources: Mapping[str, Mapping[str, betterproto2.Message]]) -> Snapshot:
        return cls({t: dict(r) for t, r in resources.items()},
                   {t: content_version(dict(r)) for t, r in resources.items()})

    def version(self, type_url: str) -> str:
        return self.versions.get(type_url, "")

    def select(self, type_url: str, names: Iterable[str]) -> list[betterproto2.Message]:
        """The resources asked for: all of the type for a wildcard request (no names, or ``*``)."""
        by_name = self.resources.get(type_url, {})
        wanted = [n for n in names if n != "*"]
        if not wanted:
            return [by_name[n] for n in sorted(by_name)]
        return [by_name[n] for n in wanted if n in by_name]


class SnapshotCache:
    def __init__(self) -> None:
        self._snapshots: dict[str, Snapshot] = {}
        self._watchers: set[asyncio.Event] = set()

    def set_snapshot(self, node_id: str, snapshot: Snapshot) -> None:
        """Replace a node's snapshot (``ANY_NODE``: every node without its own) and wake its streams."""
        self._snapshots[node_id] = snapshot
        for changed in self._watchers:
            changed.set()

    def get(self, node_id: str) -> Snapshot | None:
        return self._snapshots.get(node_id) or self._snapshots.get(ANY_NODE)

    def watch(self) -> asyncio.Event:
        """An event set on every snapshot change; the stream clears it and compares versions itself."""
        changed = asyncio.Event()
        self._watchers.add(changed)
        return changed

    def unwatch(self, changed: asyncio.Event) -> None:
        self._watchers.discard(changed)
