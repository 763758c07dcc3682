"""Program admission at the gateway (``autellix.control.admission``): the core's rule on asyncio, over loads."""

from __future__ import annotations

import asyncio

import pytest

from autellix.control.admission import ProgramGate
from autellix.control.limits import Refusal
from autellix.core.admission import AdmissionParams, ProgramAdmission
from autellix.core.engine_load import EngineLoad

#: One engine: 100 blocks of 16 tokens, 2 slots.
LOADS = [EngineLoad(running=2, waiting=3, slots=2, kv_blocks_used=90, kv_blocks_total=100, kv_block_size=16)]


def gate(**params: object) -> tuple[ProgramGate, list[float]]:
    clock = [0.0]
    settings: dict[str, object] = {"kv_limit": 1.0, "queue_per_slot": 1.0, "max_hold_lives": None, **params}
    admission = ProgramAdmission(AdmissionParams(**settings))  # type: ignore[arg-type]
    return ProgramGate(admission, lambda: LOADS, clock=lambda: clock[0]), clock


def finish_one(g: ProgramGate, program_id: str, tokens: int) -> None:
    """A program that ran and left: it teaches the gate a working set of ``tokens``."""
    g.call_finished(program_id, tokens)
    g.leave(program_id)


def test_programs_wait_past_the_limit_and_are_admitted_as_others_leave() -> None:
    async def run() -> None:
        g, clock = gate()
        await g.enter("p0")
        finish_one(g, "p0", 800)  # 50 blocks a program: 2 fit in 100 blocks at kv_limit 1
        await g.enter("a")
        await g.enter("b")
        waiting = asyncio.create_task(g.enter("c"))
        await asyncio.sleep(0)
        assert not waiting.done() and g.admission.waiting == 1 and g.held == 1
        clock[0] = 5.0
        g.leave("a")
        await asyncio.wait_for(waiting, 1)
        assert g.admission.is_admitted("c") and g.admission.waiting == 0

    asyncio.run(run())


def test_a_full_queue_refuses_with_retry_after_and_a_sheddable_class_is_never_queued() -> None:
    async def run() -> None:
        g, _ = gate()
        await g.enter("p0")
        finish_one(g, "p0", 800)
        await g.enter("a")
        await g.enter("b")
        queued = [asyncio.create_task(g.enter(f"q{i}")) for i in range(2)]  # 2 slots x 1 per slot
        await asyncio.sleep(0)
        with pytest.raises(Refusal) as full:
            await g.enter("late")
        assert full.value.status == 429 and int(full.value.retry_after) >= 1 and g.refused == 1
        with pytest.raises(Refusal):
            await g.enter("batch-job", priority=-1)
        for task in queued:
            task.cancel()
        await asyncio.gather(*queued, return_exceptions=True)
        assert g.admission.waiting == 0  # callers who left took their place with them

    asyncio.run(run())


def test_a_higher_class_goes_first_and_a_known_program_joins() -> None:
    async def run() -> None:
        g, _ = gate(queue_per_slot=4.0)
        await g.enter("p0")
        finish_one(g, "p0", 800)
        await g.enter("a")
        await g.enter("b")
        low = asyncio.create_task(g.enter("low"))
        await asyncio.sleep(0)
        high = asyncio.create_task(g.enter("high", priority=5))
        await asyncio.sleep(0)
        assert g.admission.waiting_ids() == ["high", "low"]
        await g.enter("a")  # admitted already (a concurrent first call of one session): goes on
        g.leave("a")
        await asyncio.wait_for(high, 1)
        assert not low.done()
        low.cancel()

    asyncio.run(run())
