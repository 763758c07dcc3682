"""Posts the operator's Events (``events.kube_event``) through ``KubeApi``; a lasting warning once per state.

An Event reports work; it never fails it: a post the API server refuses, or
cannot take, is logged (a warning the first time, until a post succeeds again)
and dropped. A condition that persists across many polls (the gateway
unreachable, a name taken) is posted once when it starts, not at every poll:
``warning`` posts only when the object's topic moves to another reason, and
``resolved`` ends the state, so that its return posts again. The states live
in memory: a new leader posts a lasting warning once more.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from autellix.kube.events import COMPONENT, EventType, kube_event
from autellix.kube.kubeapi import KubeApi, object_path

log = logging.getLogger("autellix.kube")


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _uid(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


class EventRecorder:
    def __init__(self, api: KubeApi, instance: str = COMPONENT,
                 clock: Callable[[], datetime.datetime] = _utcnow) -> None:
        self._api = api
        self._instance = instance
        self._clock = clock
        #: (object uid, topic) -> the reason of the warning posted for it.
        self._states: dict[tuple[str, str], str] = {}
        self._failing = False

    async def post(self, obj: dict[str, Any], type_: EventType, reason: str, message: str) -> bool:
        """One Event about ``obj``; False when it could not be posted."""
        meta = obj.get("metadata") or {}
        try:
            event = kube_event(obj, type_, reason, message, now=self._clock(), instance=self._instance)
            await self._api.create(object_path("v1", "Event", event["metadata"]["namespace"]), event)
        except (ValueError, ApiException, aiohttp.ClientError, OSError, TimeoutError) as exc:
            detail = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)
            (log.debug if self._failing else log.warning)(
                "cannot post Event %s on %s %s/%s: %s", reason, obj.get("kind"), meta.get("namespace"),
                meta.get("name"), detail)
            self._failing = True
            return False
        self._failing = False
        return True

    async def warning(self, obj: dict[str, Any], topic: str, reason: str, message: str) -> bool:
        """A Warning for ``topic`` (e.g. ``gateway``) of ``obj`` being in state ``reason``: posted, and True,
        only when the topic was in no state or another one (the caller logs a line then)."""
        key = (_uid(obj), topic)
        if self._states.get(key) == reason:
            return False
        self._states[key] = reason
        await self.post(obj, "Warning", reason, message)
        return True

    def resolved(self, obj: dict[str, Any], topic: str) -> str | None:
        """``topic`` of ``obj`` is fine again; the reason of the warning it ends (None: there was none)."""
        return self._states.pop((_uid(obj), topic), None)

    def forget(self, uid: str) -> None:
        """The object is gone: its states go too."""
        for key in [k for k in self._states if k[0] == uid]:
            del self._states[key]
