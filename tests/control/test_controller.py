"""The request controller without any transport, on the simulator's virtual clock.

This is how the simulator drives it: ``clock`` is the virtual loop's time, the
engine call is a coroutine that waits out modelled seconds, and the directory
of engines is the simulator's own. No HTTP anywhere."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Collection

import pytest

from autellix.backends import CallOutcome, VllmBackend
from autellix.control import Attempt, CallOwner, CallSpec, EngineFailure, MemoryProgramStore, RequestController
from autellix.control.controller import RetryPolicy
from autellix.core import QueueSpec, SchedulerConfig, balancer_from_config, policy_by_name
from autellix.protocol import APIError, CallRecord
from autellix.sim.virtual_loop import run_virtual


class VirtualEngines:
    """An ``EngineDirectory``: engines by model, load = calls in flight, no I/O."""

    def __init__(self, models: dict[str, str]) -> None:
        self.models = models  # engine -> model
        self.inflight = dict.fromkeys(models, 0)
        self.failures: list[tuple[str, bool]] = []

    def candidates(self, model: str, exclude: Collection[str] = ()) -> dict[str, float]:
        return {e: float(n) for e, n in self.inflight.items() if self.models[e] == model and e not in exclude}

    def begin(self, url: str) -> None:
        self.inflight[url] += 1

    def end(self, url: str) -> None:
        self.inflight[url] -= 1

    def answered(self, url: str) -> None:
        pass

    def failed(self, url: str, *, hung: bool) -> None:
        self.failures.append((url, hung))

    async def call_record(self, url: str, call_id: str) -> CallRecord | None:
        return None

    def seconds_per_token(self, url: str) -> float:
        return 0.01

    def slots(self, url: str) -> int | None:
        return None


def controller(engines: VirtualEngines, *, policy: str = "plas", max_attempts: int = 3,
               sleeps: list[float] | None = None) -> RequestController:
    config = SchedulerConfig(policy=policy)
    loop = asyncio.get_running_loop()

    async def sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)
        await asyncio.sleep(seconds)

    return RequestController(store=MemoryProgramStore(policy_by_name(policy)), engines=engines,
                             backend=VllmBackend(), balancer=balancer_from_config(config),
                             queues=QueueSpec.from_config(config), retry=RetryPolicy(max_attempts=max_attempts),
                             clock=loop.time, sleep=sleep, rng=random.Random(7))


def spec(program: str, model: str = "m", prompt_tokens: int = 10) -> CallSpec:
    return CallSpec(path="/v1/chat/completions", body={"model": model, "messages": []}, model=model,
                    owner=CallOwner(program, None, ephemeral=False), prompt_tokens=prompt_tokens)


def test_service_is_model_time_and_the_rest_is_waiting_on_the_virtual_clock() -> None:
    async def main() -> tuple[float, float, float]:
        engines = VirtualEngines({"e0": "m"})
        c = controller(engines)
        await c.store.open("p", 0.0)
        lock = asyncio.Lock()  # the engine runs one call at a time: the second one queues

        async def send(attempt: Attempt) -> str:
            async with lock:
                await asyncio.sleep(2.0)
            await attempt.settle(CallOutcome(200, completion_tokens=5, model_time=2.0))
            return attempt.engine

        assert await asyncio.gather(c.call(spec("p"), send), c.call(spec("p"), send)) == ["e0", "e0"]
        entry = c.store.entry("p")
        return entry.service, entry.waiting, asyncio.get_running_loop().time()

    (service, waiting, _), end = run_virtual(main())
    assert end == pytest.approx(4.0)  # simulated seconds, no wall-clock wait
    assert service == pytest.approx(4.0)  # PLAS: both calls' model time
    assert waiting == pytest.approx(2.0)  # the second call queued behind the first


def test_the_engine_is_told_the_programs_priority_and_fields() -> None:
    async def main() -> tuple[list[dict], int]:
        c = controller(VirtualEngines({"e0": "m"}))
        await c.store.open("p", 0.0)
        seen: list[dict] = []

        async def send(attempt: Attempt) -> None:
            seen.append(attempt.body)
            await asyncio.sleep(1.0)
            await attempt.settle(CallOutcome(200, model_time=1.0))

        for _ in range(2):
            await c.call(spec("p"), send)
        return seen, c.queues.level_for(1.0)

    (bodies, level), _ = run_virtual(main())
    assert level > 0 and [b["priority"] for b in bodies] == [0, level]  # 1 s of service: a lower queue
    assert bodies[1]["vllm_xargs"]["autellix_program"] == "p"
    assert bodies[1]["vllm_xargs"]["autellix_service"] == pytest.approx(1.0)


@pytest.mark.parametrize("engines", [3, 6])
def test_one_retry_budget_per_call(engines: int) -> None:
    async def main() -> tuple[VirtualEngines, RequestController, list[float]]:
        directory = VirtualEngines({f"e{i}": "m" for i in range(engines)})
        sleeps: list[float] = []
        c = controller(directory, sleeps=sleeps)
        await c.store.open("p", 0.0)

        async def send(attempt: Attempt) -> None:
            raise EngineFailure("connect", "refused")

        with pytest.raises(APIError) as info:
            await c.call(spec("p"), send)
        assert info.value.status == 502
        return directory, c, sleeps

    (directory, c, sleeps), _ = run_virtual(main())
    assert len(directory.failures) == 3 and len({e for e, _ in directory.failures}) == 3
    log = c.recent[-1]
    assert log.result == "failed" and [a.reason for a in log.attempts] == ["connect"] * 3
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 0.05 and 0 <= sleeps[1] <= 0.1  # full jitter, doubling
    entry = c.store.entry("p")
    assert entry.calls_aborted == 1 and not entry.active and entry.service == 0


def test_a_failure_that_may_have_run_is_not_retried_and_hung_engines_are_told() -> None:
    async def main() -> VirtualEngines:
        directory = VirtualEngines({"e0": "m", "e1": "m", "e2": "m"})
        c = controller(directory)
        await c.store.open("p", 0.0)

        async def send(attempt: Attempt) -> None:
            if attempt.number == 1:
                raise EngineFailure("hung", hung=True)
            raise EngineFailure("body_cut", retryable=False)

        with pytest.raises(APIError):
            await c.call(spec("p"), send)
        return directory

    directory, _ = run_virtual(main())
    assert [hung for _, hung in directory.failures] == [True, False]  # two attempts, then no more


def test_candidates_serve_the_model_and_pins_are_per_model() -> None:
    async def main() -> tuple[list[tuple[str, str]], dict[str, str]]:
        directory = VirtualEngines({"a0": "alpha", "a1": "alpha", "b0": "beta"})
        c = controller(directory)
        await c.store.open("p", 0.0)
        routed: list[tuple[str, str]] = []

        async def send(attempt: Attempt) -> None:
            routed.append((attempt.body["model"], attempt.engine))
            await attempt.settle(CallOutcome(200, model_time=0.0))

        for i in range(6):
            model = ("alpha", "beta")[i % 2]
            await c.call(spec("p", model, prompt_tokens=5000), send)  # long prompts: pinned
        return routed, c.store.pins("p")

    (routed, pins), _ = run_virtual(main())
    assert all(engine[0] == model[0] for model, engine in routed)
    assert pins == {"alpha": routed[0][1], "beta": "b0"}
    assert {e for m, e in routed if m == "alpha"} == {routed[0][1]}


def test_no_engine_for_the_model_is_503_and_changes_no_service() -> None:
    async def main() -> RequestController:
        c = controller(VirtualEngines({"a0": "alpha"}))
        await c.store.open("p", 0.0)

        async def send(attempt: Attempt) -> None:
            raise AssertionError("never sent")

        with pytest.raises(APIError) as info:
            await c.call(spec("p", "beta"), send)
        assert info.value.status == 503
        return c

    c, _ = run_virtual(main())
    assert c.store.entry("p").service == 0 and c.recent[-1].result == "no_engine"


def test_a_record_in_the_answer_is_charged_without_asking_the_engine() -> None:
    """The engine's record came with its answer (``RECORD_HEADER``): the call is charged its
    ``service_s`` and the engine is not asked again; without one, the controller asks."""

    class RecordingEngines(VirtualEngines):
        def __init__(self, models: dict[str, str]) -> None:
            super().__init__(models)
            self.asked: list[str] = []

        async def call_record(self, url: str, call_id: str) -> CallRecord | None:
            self.asked.append(call_id)
            return CallRecord(call=call_id, program="p", finished=True, service_s=0.75, wait_s=0.0, steps=3,
                              promotions=0, demotions=0, preemptions=0)

    async def main() -> tuple[float, list[str], list[str]]:
        engines = RecordingEngines({"e0": "m"})
        c = controller(engines)
        await c.store.open("p", 0.0)
        sent: list[str] = []

        async def with_record(attempt: Attempt) -> None:
            sent.append(attempt.call_id)
            await asyncio.sleep(2.0)
            record = CallRecord(call=attempt.call_id, program="p", finished=True, service_s=1.25, wait_s=0.75,
                                steps=9, promotions=0, demotions=0, preemptions=0)
            await attempt.settle(CallOutcome(200, completion_tokens=5, record=record))

        async def without(attempt: Attempt) -> None:
            sent.append(attempt.call_id)
            await asyncio.sleep(2.0)
            await attempt.settle(CallOutcome(200, completion_tokens=5))

        await c.call(spec("p"), with_record)
        await c.call(spec("p"), without)
        return c.store.entry("p").service, engines.asked, sent

    (service, asked, sent), _ = run_virtual(main())
    assert service == pytest.approx(1.25 + 0.75)  # the header's record, then the asked one
    assert asked == [sent[1]]  # only the call whose answer carried no record
