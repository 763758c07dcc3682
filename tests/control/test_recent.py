"""``RecentIds``: remembered ids bounded in count and in age, so that session churn cannot grow memory."""

from __future__ import annotations

import pytest

from autellix.control.recent import RecentIds


def test_ids_are_forgotten_ttl_after_they_were_last_added() -> None:
    ids = RecentIds(max_items=100, ttl_s=10.0)
    assert ids.add("a", 0.0) and ids.add("b", 5.0)
    assert not ids.add("a", 8.0)  # seen again: its age restarts, and it is not new
    ids.forget_old(12.0)
    assert "a" in ids and "b" in ids
    ids.forget_old(15.0)  # b was added 10 s ago: gone; a only 7 s ago
    assert "a" in ids and "b" not in ids and len(ids) == 1
    ids.forget_old(18.0)
    assert "a" not in ids and len(ids) == 0
    assert ids.add("a", 18.0)  # forgotten: new again


def test_steady_churn_holds_at_most_rate_times_ttl_ids() -> None:
    """A new id every 0.25 s for an hour with a 60 s memory: never more than 240 held; the count
    cap bounds it further."""
    ids, capped = RecentIds(max_items=1_000_000, ttl_s=60.0), RecentIds(max_items=100, ttl_s=60.0)
    largest = largest_capped = 0
    for n in range(14_400):
        ids.add(f"sess-{n}", n * 0.25)
        capped.add(f"sess-{n}", n * 0.25)
        largest, largest_capped = max(largest, len(ids)), max(largest_capped, len(capped))
    assert largest == 240 and largest_capped == 100
    assert "sess-14399" in capped and "sess-14299" not in capped  # the oldest go first


def test_a_bad_bound_is_refused() -> None:
    with pytest.raises(ValueError):
        RecentIds(max_items=-1)
    with pytest.raises(ValueError):
        RecentIds(max_items=10, ttl_s=0.0)
