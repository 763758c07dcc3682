"""Program admission at the gateway: new programs wait their turn while the engines are saturated.

The rule is the policy core's (``autellix.core.admission.ProgramAdmission``: a
program limit that follows the engines' KV capacity, one FCFS queue by
priority class, a bounded queue, a longest hold); this module runs it on the
gateway's clock over the engine pool's loads, with asyncio futures for the
programs that wait. Only new programs are held: the calls of an admitted
program, and its subagents (they belong to an admitted tree), go straight on.

* ``enter``: a new program asks to start; returns once it is admitted, or
  raises a 429 (``Refusal``, with ``Retry-After``) when the queue is full or
  its class is sheddable (below zero) and there is no room. A caller that
  leaves while waiting (the client hung up) leaves the queue.
* ``call_finished``: an admitted program's call ended with this many tokens of
  context (its working set, which the limit is made of).
* ``leave``: the program ended, expired or was a one-call program that
  finished; waiting programs are admitted as room frees (``pump``, also on a
  timer: room frees as the engines' loads change, too).

One gateway's queue: replicas behind Envoy each hold their own (a program's
first call lands on one replica), each against the whole pool's capacity.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from autellix.control.background import cancel
from autellix.control.limits import Refusal
from autellix.core.admission import AlreadyKnown, ProgramAdmission, Verdict
from autellix.core.engine_load import EngineLoad

#: Seconds between two admission passes when nothing else frees room.
PUMP_INTERVAL_S = 1.0


class ProgramGate:
    """Admission of new programs over the engines' loads (``loads()``), on ``clock``."""

    def __init__(self, admission: ProgramAdmission, loads: Callable[[], Sequence[EngineLoad]], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.admission, self.loads, self.clock = admission, loads, clock
        self._waiters: dict[str, asyncio.Future[None]] = {}
        #: Programs that had to wait, and programs refused, since the start.
        self.held = 0
        self.refused = 0
        self._task: asyncio.Task[None] | None = None

    async def enter(self, program_id: str, *, priority: int = 0) -> None:
        """Return once ``program_id`` is admitted (at once when there is room); ``Refusal`` (429) when it may
        not wait. A program already admitted (a concurrent first call of one implicit session) goes on."""
        waiter = self._waiters.get(program_id)
        if waiter is None:
            try:
                decision = self.admission.arrive(program_id, self.clock(), self.loads(), priority=priority)
            except AlreadyKnown:
                return
            if decision.verdict is Verdict.ADMIT:
                return
            if decision.verdict is Verdict.REFUSE:
                self.refused += 1
                assert decision.retry_after is not None
                raise Refusal("The engines are saturated and the queue of new programs is full"
                              + (" (a sheddable priority class is not queued)" if priority < 0 else "")
                              + "; calls of programs already running go on. Try again later.",
                              "program_queue_full", max(1.0, math.ceil(decision.retry_after)))
            waiter = self._waiters[program_id] = asyncio.get_running_loop().create_future()
            self.held += 1
        try:
            await asyncio.shield(waiter)
        except BaseException:  # the client left while its program waited: it leaves the queue
            if not waiter.done():
                self._waiters.pop(program_id, None)
                self.admission.leave(program_id)
                waiter.cancel()
            raise

    def call_finished(self, program_id: str, context_tokens: int) -> None:
        self.admission.context(program_id, max(0, context_tokens))

    def leave(self, program_id: str) -> None:
        """The program left the table (ended, expired, a one-call program that finished)."""
        if self.admission.leave(program_id, self.clock()):
            self.pump()

    def pump(self) -> None:
        """Admit waiting programs while there is room (and any that waited its longest hold)."""
        if self.admission.waiting:
            for program_id in self.admission.admit_waiting(self.clock(), self.loads()):
                waiter = self._waiters.pop(program_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)

    def describe(self) -> dict[str, Any]:
        """What ``GET /admin/admission`` shows."""
        loads = self.loads()
        return {"admitted": self.admission.admitted, "waiting": self.admission.waiting,
                "queue": self.admission.waiting_ids(), "program_limit": self.admission.program_limit(loads),
                "queue_limit": self.admission.queue_limit(loads), "working_set_tokens": self.admission.working_set(),
                "longest_hold_s": self.admission.longest_hold(), "held_total": self.held,
                "refused_total": self.refused,
                "engines": [{"running": e.running, "waiting": e.waiting, "slots": e.slots,
                             "kv_blocks_used": e.kv_blocks_used, "kv_blocks_total": e.kv_blocks_total}
                            for e in loads]}

    # ---- a service of the gateway: the timer --------------------------------------------
    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(PUMP_INTERVAL_S)
            self.pump()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="program-admission")

    async def stop(self) -> None:
        await cancel(self._task)
        for waiter in self._waiters.values():
            waiter.cancel()
        self._waiters.clear()


__all__ = ["PUMP_INTERVAL_S", "ProgramGate"]
