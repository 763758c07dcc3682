"""A prompt's block hashes as vLLM computes them: checked against vLLM's own functions."""

from __future__ import annotations

import random

import pytest

from autellix.core import VllmBlockHasher


def test_digests_and_event_hashes_match_vllms():
    kv_cache_utils = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    hashing = pytest.importorskip("vllm.utils.hashing")
    kv_cache_utils.init_none_hash(hashing.sha256)
    rng = random.Random(7)
    tokens = [rng.randrange(128_000) for _ in range(16 * 9 + 5)]
    hasher = VllmBlockHasher(16)
    digests, parent = [], None
    for start in range(0, len(tokens) - 15, 16):
        parent = kv_cache_utils.hash_block_tokens(hashing.sha256, parent, tokens[start:start + 16], None)
        digests.append(parent)
    assert hasher.digests(tokens) == digests  # the partial last block has no hash
    assert hasher.chain(tokens) == [kv_cache_utils.maybe_convert_block_hash(d) for d in digests]
    # continued from block 4 with its parent's digest: the same chain's tail
    assert hasher.digests(tokens, start=4, parent=digests[3]) == digests[4:]


def test_the_seed_and_block_size_change_every_hash():
    tokens = list(range(64))
    base = VllmBlockHasher(16).chain(tokens)
    assert len(base) == 4
    assert set(VllmBlockHasher(16, seed="42").chain(tokens)).isdisjoint(base)
    assert VllmBlockHasher(32).chain(tokens)[0] not in base
    # a prefix's hashes are the longer prompt's first ones
    assert VllmBlockHasher(16).chain(tokens[:40]) == base[:2]


def test_unknown_algorithms_and_sizes_are_refused():
    with pytest.raises(ValueError, match="sha256_cbor"):
        VllmBlockHasher(16, algorithm="sha256_cbor")
    with pytest.raises(ValueError, match="block size"):
        VllmBlockHasher(0)
    with pytest.raises(ValueError, match="parent"):
        VllmBlockHasher(16).digests(list(range(64)), start=2)
