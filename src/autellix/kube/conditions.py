"""Status conditions (pure): the Kubernetes convention of type/status/reason/message,
with ``lastTransitionTime`` moving only when ``status`` flips."""

from __future__ import annotations

from typing import Any


def set_condition(conditions: list[dict[str, Any]] | None, type_: str, status: bool, reason: str, message: str,
                  now: str, observed_generation: int | None = None) -> list[dict[str, Any]]:
    """A new list with condition ``type_`` set; the others are kept in order."""
    text = "True" if status else "False"
    previous = next((c for c in conditions or [] if c.get("type") == type_), None)
    since = previous["lastTransitionTime"] if previous and previous.get("status") == text and \
        previous.get("lastTransitionTime") else now
    cond: dict[str, Any] = {"type": type_, "status": text, "reason": reason, "message": message,
                            "lastTransitionTime": since}
    if observed_generation is not None:
        cond["observedGeneration"] = observed_generation
    out = [c for c in conditions or [] if c.get("type") != type_]
    index = next((i for i, c in enumerate(conditions or []) if c.get("type") == type_), len(out))
    out.insert(index, cond)
    return out


def condition(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)
