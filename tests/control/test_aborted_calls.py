"""A call whose client left is charged the model time the engine spent on it (no free service)."""

from __future__ import annotations

import asyncio

import pytest

from autellix.backends import CallOutcome
from autellix.control import Attempt, EngineFailure
from autellix.protocol import CallRecord
from autellix.sim.virtual_loop import run_virtual
from tests.control.test_controller import VirtualEngines, controller, spec


class RecordingEngines(VirtualEngines):
    """Keeps the scheduler's record of every call: ``service`` seconds of model time each."""

    def __init__(self, service: float) -> None:
        super().__init__({"e0": "m"})
        self.service, self.asked = service, 0

    async def call_record(self, url: str, call_id: str) -> CallRecord | None:
        self.asked += 1
        return CallRecord(call=call_id, program="p", finished=False, service_s=self.service, wait_s=0.0, steps=3,
                          promotions=0, demotions=0, preemptions=0)


def test_a_client_that_leaves_after_its_tokens_is_charged_the_engine_time() -> None:
    async def main() -> tuple[float, int]:
        engines = RecordingEngines(service=0.8)
        c = controller(engines)
        await c.store.open("p", 0.0)

        async def send(attempt: Attempt) -> None:
            await asyncio.sleep(1.0)  # the engine generated everything...
            raise asyncio.CancelledError  # ...and the client hung up before [DONE]

        with pytest.raises(asyncio.CancelledError):
            await c.call(spec("p"), send)
        entry = c.store.entry("p")
        return entry.service, engines.asked

    (service, asked), _ = run_virtual(main())
    assert service == pytest.approx(0.8) and asked == 1


def test_a_cut_stream_without_a_record_is_charged_its_priced_tokens() -> None:
    async def main() -> float:
        engines = VirtualEngines({"e0": "m"})  # no scheduler record; 0.01 s a token
        c = controller(engines)
        await c.store.open("p", 0.0)

        async def send(attempt: Attempt) -> None:
            await asyncio.sleep(2.0)
            await attempt.settle(CallOutcome(200, completion_tokens=50, broken=True))

        await c.call(spec("p"), send)
        return c.store.entry("p").service

    service, _ = run_virtual(main())
    assert service == pytest.approx(0.5)


def test_an_engine_that_failed_is_not_asked_and_nothing_is_charged() -> None:
    async def main() -> tuple[float, int]:
        engines = RecordingEngines(service=0.8)
        c = controller(engines, max_attempts=1)

        async def send(attempt: Attempt) -> None:
            raise EngineFailure("connect", retryable=True)

        await c.store.open("p", 0.0)
        with pytest.raises(Exception, match="failed before answering"):
            await c.call(spec("p"), send)
        return c.store.entry("p").service, engines.asked

    (service, asked), _ = run_virtual(main())
    assert service == 0.0 and asked == 0


class SlowRecordEngines(RecordingEngines):
    """The engine's record takes a while to come (the plugin waits for the call to finish)."""

    async def call_record(self, url: str, call_id: str) -> CallRecord | None:
        await asyncio.sleep(5.0)
        return await super().call_record(url, call_id)


@pytest.mark.parametrize("outcome", [CallOutcome(200, completion_tokens=40),
                                     CallOutcome(200, completion_tokens=40, broken=True)],
                         ids=["finished", "cut"])
def test_a_call_cancelled_while_its_record_is_fetched_still_leaves_the_table(outcome: CallOutcome) -> None:
    """The client hangs up while the gateway asks the engine for the call's record: the call
    must not stay active (its program would never expire); it is charged what is known."""
    async def main() -> tuple[dict, float, int]:
        engines = SlowRecordEngines(service=0.8)
        c = controller(engines)
        await c.store.open("p", 0.0)

        async def send(attempt: Attempt) -> None:
            await asyncio.sleep(1.0)
            await attempt.settle(outcome)  # a stream settles before its [DONE]; the record is awaited

        task = asyncio.ensure_future(c.call(spec("p"), send))
        await asyncio.sleep(2.0)  # inside settle, waiting for the record
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        entry = c.store.entry("p")
        return dict(entry.active), entry.service, entry.calls_done + entry.calls_aborted

    (active, service, settled), _ = run_virtual(main())
    assert active == {} and settled == 1
    assert service == pytest.approx(0.4)  # 40 tokens at 0.01 s: priced, the record never came
