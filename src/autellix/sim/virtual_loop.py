"""An asyncio event loop on a virtual clock: simulated time, real coroutines.

The agent programs are ordinary async functions (``autellix.workloads``):
they ``await`` LLM calls, ``asyncio.sleep`` through tools and ``gather``
parallel branches. Run on this loop, they run unchanged in simulated time:
whenever nothing is ready to run, the loop jumps its clock to the next timer
instead of waiting for it, so an hour of serving takes as long as its events
take to process. Nothing here does real I/O; a loop with no ready callback and
no timer left is a deadlock (every coroutine waits for something nobody will
deliver) and raises.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Deadlock(RuntimeError):
    """Coroutines are waiting, but no timer or callback can ever wake them."""


class _VirtualSelector(selectors.SelectSelector):
    """Never waits: a select with a timeout advances the loop's clock by it."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Deadlock("every coroutine waits and no timer is left")
        if timeout > 0:
            self.now += timeout
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """``loop.time()`` is simulated seconds from 0."""

    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)
        # timers due within this of "now" fire now: floating-point sums of
        # step times must not leave a timer a hair in the future forever
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._virtual.now


def run_virtual(main: Coroutine[Any, Any, T]) -> tuple[T, float]:
    """Run ``main`` to completion in simulated time; returns (its result, the clock at the end)."""
    loop = VirtualClockLoop()
    try:
        result = loop.run_until_complete(main)
        return result, loop.time()
    finally:
        loop.close()
