"""The KV event index: blocks held per engine, and the longest cached run of a prompt's blocks."""

from __future__ import annotations

import pytest

from autellix.core import PrefixIndex


def test_longest_run_from_the_first_block_per_engine():
    index = PrefixIndex()
    index.stored("a", [1, 2, 3], 16)
    index.stored("b", [1, 2], 32)
    index.stored("c", [2, 3], 16)  # holds later blocks without the first: nothing usable
    assert index.cached_tokens([1, 2, 3, 4], ["a", "b", "c"]) == {"a": 48, "b": 64}
    assert index.cached_tokens([9, 2, 3], ["a", "b", "c"]) == {}
    assert index.cached_tokens([], ["a"]) == {}
    # only the engines asked about
    assert index.cached_tokens([1, 2, 3], ["b"]) == {"b": 64}


def test_a_removed_block_ends_the_run_and_copies_are_counted():
    index = PrefixIndex()
    index.stored("a", [1, 2, 3], 16)
    index.stored("a", [2], 16)  # a second copy of block 2 (two calls computed it at once)
    index.removed("a", [2])
    assert index.cached_tokens([1, 2, 3], ["a"]) == {"a": 48}
    index.removed("a", [2])
    assert index.cached_tokens([1, 2, 3], ["a"]) == {"a": 16}
    index.removed("a", [2, 77])  # unknown removals change nothing
    index.removed("zzz", [1])
    assert index.held("a") == frozenset({1, 3})


def test_cleared_and_forgotten_engines_hold_nothing():
    index = PrefixIndex()
    index.stored("a", [1, 2], 16)
    index.stored("b", [1, 2], 16)
    index.cleared("a")
    assert index.cached_tokens([1, 2], ["a", "b"]) == {"b": 32}
    assert index.engines() == ["a", "b"]
    index.forget("b")
    assert index.engines() == ["a"]
    assert index.cached_tokens([1, 2], ["a", "b"]) == {}
    assert index.summary() == {"a": 0}


def test_bad_block_size_is_refused_and_changes_nothing():
    index = PrefixIndex()
    with pytest.raises(ValueError, match="block size"):
        index.stored("a", [1], 0)
    assert index.engines() == []
