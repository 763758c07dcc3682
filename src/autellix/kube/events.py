"""Kubernetes Events about the operator's resources, built as core/v1 Event objects (pure).

``kubectl describe`` lists the Events whose ``involvedObject`` names the object
(kind, name, namespace and uid) and shows ``source.component`` in its "From"
column. The shape is client-go's event recorder's (the legacy core/v1 form:
``firstTimestamp``/``lastTimestamp`` and ``count``, no ``eventTime``), which
every supported API server accepts.
"""

from __future__ import annotations

import datetime
from typing import Any, Literal

#: ``source.component`` and ``reportingComponent`` of every Event the operator posts.
COMPONENT = "autellix-operator"
#: The API server's limit on an Event's message (client-go truncates the same way).
MAX_MESSAGE = 1024
MAX_REASON = 128
EventType = Literal["Normal", "Warning"]
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def involved_object(obj: dict[str, Any]) -> dict[str, str]:
    """The ObjectReference ``kubectl describe`` matches an Event to ``obj`` by."""
    meta = obj.get("metadata") or {}
    ref = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta.get("name"),
           "namespace": meta.get("namespace"), "uid": meta.get("uid")}
    missing = sorted(k for k, v in ref.items() if not v)
    if missing:
        raise ValueError(f"an Event needs the object's {', '.join(missing)}")
    return {k: str(v) for k, v in ref.items()}


def kube_event(obj: dict[str, Any], type_: EventType, reason: str, message: str, *,
               now: datetime.datetime, instance: str = COMPONENT) -> dict[str, Any]:
    """A core/v1 Event about ``obj`` (a namespaced object): ``type_`` Normal or Warning, ``reason`` a
    CamelCase word, ``message`` what happened and why (cut to the API server's 1024 characters)."""
    if type_ not in ("Normal", "Warning"):
        raise ValueError(f"type: expected Normal or Warning, got {type_!r}")
    if not reason or len(reason) > MAX_REASON or not reason[0].isupper() or not reason.isalnum():
        raise ValueError(f"reason: expected a CamelCase word of at most {MAX_REASON} letters, got {reason!r}")
    ref = involved_object(obj)
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    stamp = now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    # Named as client-go names them: the object's name and the time in hex nanoseconds.
    nanoseconds = (now - EPOCH) // datetime.timedelta(microseconds=1) * 1000
    suffix = f".{nanoseconds:x}"
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": ref["name"][: 253 - len(suffix)] + suffix, "namespace": ref["namespace"]},
        "involvedObject": ref,
        "type": type_,
        "reason": reason,
        "message": message,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance[:128],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
