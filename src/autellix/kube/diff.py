"""Drift between a desired child object and the live one (pure).

The API server adds defaults (clusterIP, terminationMessagePath, ...) to what
the operator sends, so "unchanged" means: every field the operator sets has the
value it sets. Lists must match element by element (same length), since the
operator's merge patches replace lists whole.
"""

from __future__ import annotations

from typing import Any

#: Fields the operator never sets; ignored when comparing.
_IGNORED_METADATA = ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields")


def covers(live: Any, desired: Any) -> bool:
    """True when ``live`` holds every value of ``desired`` (extra keys in ``live`` are fine)."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(k in live and covers(live[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(live, list) and len(live) == len(desired) and all(
            covers(a, b) for a, b in zip(live, desired, strict=True))
    if isinstance(desired, bool) or isinstance(live, bool):
        return live is desired
    if isinstance(desired, int | float) and isinstance(live, int | float):
        return float(live) == float(desired)
    return bool(live == desired)


def managed_part(desired: dict[str, Any]) -> dict[str, Any]:
    """What to compare and patch: metadata labels/owners and the spec (status belongs to the cluster)."""
    meta = {k: v for k, v in desired.get("metadata", {}).items()
            if k in ("labels", "annotations", "ownerReferences") and k not in _IGNORED_METADATA}
    out: dict[str, Any] = {"metadata": meta}
    if "spec" in desired:
        out["spec"] = desired["spec"]
    return out


def drifted(live: dict[str, Any], desired: dict[str, Any]) -> bool:
    return not covers(live, managed_part(desired))
