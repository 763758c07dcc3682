"""Background tasks of the gateway's parts: a step repeated on a timer, and a task stopped by cancelling it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


async def cancel(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to do) and wait until it has ended: after a part's stop, nothing of it runs."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class Repeating:
    """A service that runs ``step`` every ``interval`` seconds while it runs: the first time ``interval`` after its
    start, or at once (``at_once``). A step that fails is logged and the next one runs on time: a store out of
    reach or a file half written must not end the loop."""

    def __init__(self, name: str, interval: float, step: Callable[[], Awaitable[object]], *,
                 at_once: bool = False) -> None:
        self.name, self.interval, self.step, self.at_once = name, interval, step, at_once
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None

    async def _loop(self) -> None:
        if not self.at_once:
            await asyncio.sleep(self.interval)
        while True:
            try:
                await self.step()
            except Exception:  # the next step tries again
                log.exception("%s failed", self.name)
            await asyncio.sleep(self.interval)


__all__ = ["Repeating", "cancel"]
