"""The gateway's waiting rooms in simulated time: llm-d's per-program request
queues (``RequestFlowControl``) and Autellix's program admission
(``AdmissionGate``), each the core's pure rule driven by the engine models' state.

Both hold coroutines on futures and release them when the engines' loads (or
the programs that finish) say so; the serving simulator calls ``pump`` after
every engine step and every change that can free room. A released request is
on its way to an engine but not in its counts yet: the flow control counts it
as waiting on an engine until ``arrived``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence

from autellix.core.admission import AdmissionDecision, ProgramAdmission, Verdict
from autellix.core.engine_load import EngineLoad
from autellix.core.flow_control import ProgramFairQueues, UtilizationDetector

#: The engines' loads now.
Loads = Callable[[], Sequence[EngineLoad]]


class RequestFlowControl:
    """llm-d's flow control: calls wait in per-program queues while the pool is
    saturated (``UtilizationDetector``) and leave in program-aware fairness order
    (``ProgramFairQueues``)."""

    def __init__(self, loads: Loads, loop: asyncio.AbstractEventLoop, *,
                 queues: ProgramFairQueues[asyncio.Future[None]] | None = None,
                 detector: UtilizationDetector | None = None) -> None:
        self._loads = loads
        self._loop = loop
        self.queues: ProgramFairQueues[asyncio.Future[None]] = queues or ProgramFairQueues()
        self.detector = detector or UtilizationDetector()
        #: Released calls not yet in an engine's queue.
        self._in_transit = 0
        self.held = 0

    def _pool(self) -> list[EngineLoad]:
        loads = list(self._loads())
        n = len(loads)
        return [dataclasses.replace(load, waiting=load.waiting + self._in_transit // n
                                    + (1 if i < self._in_transit % n else 0)) for i, load in enumerate(loads)]

    async def wait_turn(self, program_id: str) -> None:
        """Return when this call of ``program_id`` may go to an engine."""
        future: asyncio.Future[None] = self._loop.create_future()
        self.queues.push(program_id, future, self._loop.time())
        self.pump()
        if not future.done():
            self.held += 1
        await future

    def arrived(self) -> None:
        """A released call reached its engine (the engine's own counts show it now)."""
        self._in_transit -= 1

    def completed(self, program_id: str, *, prompt_tokens: int, completion_tokens: int) -> None:
        self.queues.completed(program_id, self._loop.time(), prompt_tokens=prompt_tokens,
                              completion_tokens=completion_tokens)
        self.pump()

    def pump(self) -> None:
        """Release calls, best program first, while the pool is not saturated."""
        now = self._loop.time()
        while len(self.queues) and not self.detector.saturated(self._pool()):
            picked = self.queues.pick(now)
            assert picked is not None
            self._in_transit += 1
            picked[1].set_result(None)


class AdmissionGate:
    """Program admission (``ProgramAdmission``): a new program waits here while the
    engines have no room; a refused one retries after the Retry-After it was given,
    as a well-behaved client does."""

    def __init__(self, loads: Loads, loop: asyncio.AbstractEventLoop,
                 admission: ProgramAdmission | None = None) -> None:
        self._loads = loads
        self._loop = loop
        self.admission = admission or ProgramAdmission()
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self.held = 0
        self.refused = 0

    async def enter(self, program_id: str, *, priority: int = 0) -> None:
        """Return once ``program_id`` is admitted."""
        while True:
            decision: AdmissionDecision = self.admission.arrive(program_id, self._loop.time(), self._loads(),
                                                                priority=priority)
            if decision.verdict is Verdict.ADMIT:
                return
            if decision.verdict is Verdict.WAIT:
                self.held += 1
                future: asyncio.Future[None] = self._loop.create_future()
                self._waiters[program_id] = future
                await future
                return
            self.refused += 1
            assert decision.retry_after is not None
            await asyncio.sleep(decision.retry_after)

    def call_finished(self, program_id: str, context_tokens: int) -> None:
        self.admission.context(program_id, context_tokens)

    def leave(self, program_id: str) -> None:
        self.admission.leave(program_id, self._loop.time())
        self.pump()

    def pump(self) -> None:
        if self.admission.waiting:
            for program_id in self.admission.admit_waiting(self._loop.time(), self._loads()):
                self._waiters.pop(program_id).set_result(None)
