"""Which cores a CPU engine's model workers keep to themselves (``autellix.engine.cores``)."""

from __future__ import annotations

import time

from autellix.engine.cores import CoreSplit, cpu_seconds_by_role, cpu_used, process_role, split_cores


def test_everything_else_goes_to_the_cores_no_worker_is_bound_to() -> None:
    # vLLM binds a worker's OpenMP threads to all but the reserved cores
    split = split_cores([{0, 1, 2}, {0, 1, 2}, {2}], range(4))
    assert split == CoreSplit(engine=frozenset({0, 1, 2}), others=frozenset({3}))
    assert split.to_mapping() == {"engine": [0, 1, 2], "others": [3]}


def test_no_split_without_a_bound_worker_or_a_free_core() -> None:
    assert split_cores([], range(2)) is None  # no worker found: nothing to protect
    assert split_cores([{0, 1}], range(2)) is None  # the workers hold every core: nowhere to move to


def test_each_process_of_a_local_stack_has_a_role() -> None:
    python = "/repo/.venv/bin/python"
    assert process_role("VLLM::Worker_TP0", [python]) == "worker"
    assert process_role("VLLM::EngineCore", [python]) == "engine_core"
    api_server = [python, "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"]
    assert process_role("python", api_server) == "api_server"
    assert process_role("python", [python, "-m", "autellix", "gateway", "--port", "9000"]) == "gateway"
    assert process_role("python", [python, "-c", "pass"]) == "other"


def test_cpu_seconds_are_counted_by_role_between_two_readings() -> None:
    before = cpu_seconds_by_role()
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # this process's own work
        pass
    used = cpu_used(before, cpu_seconds_by_role())
    assert used["client"] >= 0.19
    assert all(seconds >= 0 for seconds in used.values())  # other tests' engines may be up meanwhile
    # a process that ended between the readings drops out; one that started counts from zero
    assert cpu_used({"client": 1.0, "gone": 2.0}, {"client": 1.5, "worker": 3.0}) == {"client": 0.5, "worker": 3.0}
