"""What clients see of the gateway's state, shared by the tenant and admin routes: sessions and engine names."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

from autellix.core import ProgramEntry
from autellix.protocol import SESSION_OBJECT

#: The process table's times: on the monotonic clock (a gateway restart starts it anew).
_TIMES = ("created_at", "last_arrival", "last_finish")


def engine_label(url: str) -> str:
    """An engine's name in metrics: stable, and no address a tenant could call directly."""
    return "engine-" + hashlib.sha256(url.encode()).hexdigest()[:8]


def session_view(entry: ProgramEntry, pins: dict[str, str], *, engine_addresses: bool) -> dict[str, Any]:
    """A session as clients see it: times as Unix timestamps (seconds), like OpenAI's ``created``.
    Engines by address only with ``engine_addresses`` (the admin listener); a tenant sees each
    engine's ``engine_label``, as ``/metrics`` names it: no address to call engines directly."""
    name: Callable[[str], str] = (lambda url: url) if engine_addresses else engine_label
    view = {**entry.to_dict(), "object": SESSION_OBJECT, "pins": {model: name(url) for model, url in pins.items()}}
    view["engines"] = sorted(name(url) for url in view["engines"])
    if view["pinned_engine"] is not None:
        view["pinned_engine"] = name(view["pinned_engine"])
    offset = time.time() - time.monotonic()
    for field_name in _TIMES:
        if view.get(field_name) is not None:
            view[field_name] = round(view[field_name] + offset, 3)
    for call in view.get("active", ()):
        call["arrival"] = round(call["arrival"] + offset, 3)
        if call["engine"] is not None:
            call["engine"] = name(call["engine"])
    return view


__all__ = ["engine_label", "session_view"]
