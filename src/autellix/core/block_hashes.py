"""A prompt's KV block hashes as vLLM computes them, so its cached prefix can be looked up before it is sent.

vLLM V1 names a full block of ``block_size`` tokens by
``sha256(pickle((parent, tuple(tokens), extra_keys)))``, the parent being the
previous block's hash and, for the first block, ``NONE_HASH``: the hash of the
seed (``PYTHONHASHSEED`` when the engine has it set, else ``"vllm-none-hash"``).
Its KV cache events carry the low 64 bits of each digest as an integer (the
default ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``), and so does
:meth:`VllmBlockHasher.chain`. Only plain text prompts hash like this: LoRA
adapters, images, a ``cache_salt`` and prompt embeddings add extra keys that
the gateway does not reproduce (their calls simply find no cached prefix).

Checked against vLLM's own ``hash_block_tokens`` in the tests, and against the
blocks two real engines report (``tests/engine/test_kv_events.py``).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from typing import Any

#: vLLM's seed of the first block's parent when ``PYTHONHASHSEED`` is not set (``DEFAULT_NONE_HASH_SEED``).
DEFAULT_SEED = "vllm-none-hash"
#: The hash algorithms this module reproduces (vLLM's ``--prefix-caching-hash-algo``).
ALGORITHMS = ("sha256",)
_LOW_64 = (1 << 64) - 1


def _sha256_pickle(value: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


class VllmBlockHasher:
    """The block hashes of one engine configuration: its block size, hash algorithm and seed."""

    def __init__(self, block_size: int, *, algorithm: str = "sha256", seed: str | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be >= 1, got {block_size}")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"prefix-caching hash algorithm {algorithm!r} is not reproduced here; "
                             f"expected one of {', '.join(ALGORITHMS)}")
        self.block_size = block_size
        self._root = _sha256_pickle(DEFAULT_SEED if seed is None else seed)

    def digests(self, tokens: Sequence[int], *, start: int = 0, parent: bytes | None = None) -> list[bytes]:
        """The full digests of ``tokens``' full blocks from block ``start`` on, in order (a partial last block
        has none); ``parent`` is block ``start - 1``'s digest (for ``start`` 0: the seed's)."""
        size = self.block_size
        if start and parent is None:
            raise ValueError("a chain that starts after block 0 needs its parent's digest")
        digest = self._root if parent is None else parent
        out: list[bytes] = []
        for begin in range(start * size, len(tokens) - size + 1, size):
            digest = _sha256_pickle((digest, tuple(tokens[begin:begin + size]), None))
            out.append(digest)
        return out

    def chain(self, tokens: Sequence[int]) -> list[int]:
        """The hashes of ``tokens``' full blocks as vLLM's KV events carry them (the digests' low 64 bits)."""
        return [int.from_bytes(digest, "big") & _LOW_64 for digest in self.digests(tokens)]


__all__ = ["ALGORITHMS", "DEFAULT_SEED", "VllmBlockHasher"]
