"""Which cores a CPU engine's model workers keep to themselves (``autellix.engine.cores``)."""

from __future__ import annotations

from autellix.engine.cores import CoreSplit, split_cores


def test_everything_else_goes_to_the_cores_no_worker_is_bound_to() -> None:
    # vLLM binds a worker's OpenMP threads to all but the reserved cores
    split = split_cores([{0, 1, 2}, {0, 1, 2}, {2}], range(4))
    assert split == CoreSplit(engine=frozenset({0, 1, 2}), others=frozenset({3}))
    assert split.to_mapping() == {"engine": [0, 1, 2], "others": [3]}


def test_no_split_without_a_bound_worker_or_a_free_core() -> None:
    assert split_cores([], range(2)) is None  # no worker found: nothing to protect
    assert split_cores([{0, 1}], range(2)) is None  # the workers hold every core: nowhere to move to
