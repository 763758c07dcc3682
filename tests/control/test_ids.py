"""Ids of calls and one-call programs: unique within a generator and across generators (replicas)."""

from __future__ import annotations

from autellix.control.ids import UniqueIds


def test_ids_never_repeat_and_two_generators_never_share_one() -> None:
    first, second = UniqueIds("call-"), UniqueIds("call-")
    drawn = [first() for _ in range(10_000)] + [second() for _ in range(10_000)]
    assert len(set(drawn)) == len(drawn)
    assert all(i.startswith("call-") for i in drawn)
    assert first().rsplit("-", 1)[0] != second().rsplit("-", 1)[0]  # each replica its own random part
