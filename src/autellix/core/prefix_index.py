"""Which engine holds which KV blocks: an index kept from the engines' KV cache events.

vLLM names every full KV block by a chained hash of its tokens and the block
before it, and with ``--kv-events-config`` publishes the blocks it stores and
removes (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``). The index
keeps, per engine, how many copies of each block hash it holds, so that a
call's prompt, hashed the same way before it is sent (``core.block_hashes``),
can be looked up: the longest run of its blocks from the first that each
engine holds is the prefix that engine would not compute again.

An engine's blocks are a cache, not a promise: between an event and the call
the engine may evict them. The index is a hint for routing, never a reason to
refuse an engine. Nothing here does I/O; the gateway's subscriber and the
simulator's engine models feed it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


class PrefixIndex:
    """Block hashes held per engine, with each engine's block size."""

    def __init__(self) -> None:
        #: Block hash -> engine -> copies held (vLLM may hold a hash twice while two calls computed it at once).
        self._holders: dict[int, dict[str, int]] = {}
        #: Engine -> the hashes it holds (what ``cleared`` and ``forget`` drop).
        self._held: dict[str, set[int]] = {}
        self._block_size: dict[str, int] = {}

    def stored(self, engine: str, hashes: Iterable[int], block_size: int) -> None:
        """``engine`` stored blocks named ``hashes`` of ``block_size`` tokens each."""
        if block_size < 1:
            raise ValueError(f"block size must be >= 1, got {block_size}")
        self._block_size[engine] = block_size
        held = self._held.setdefault(engine, set())
        for block in hashes:
            copies = self._holders.setdefault(block, {})
            copies[engine] = copies.get(engine, 0) + 1
            held.add(block)

    def removed(self, engine: str, hashes: Iterable[int]) -> None:
        """``engine`` evicted blocks named ``hashes`` (one copy each; unknown ones are ignored)."""
        held = self._held.get(engine)
        if held is None:
            return
        for block in hashes:
            copies = self._holders.get(block)
            if copies is None or engine not in copies:
                continue
            if copies[engine] > 1:
                copies[engine] -= 1
                continue
            del copies[engine]
            held.discard(block)
            if not copies:
                del self._holders[block]

    def cleared(self, engine: str) -> None:
        """``engine`` dropped its whole prefix cache (or restarted): it holds nothing now."""
        for block in self._held.pop(engine, ()):
            copies = self._holders.get(block)
            if copies is not None:
                copies.pop(engine, None)
                if not copies:
                    del self._holders[block]
        self._held[engine] = set()

    def forget(self, engine: str) -> None:
        """``engine`` left the pool."""
        self.cleared(engine)
        del self._held[engine]
        self._block_size.pop(engine, None)

    def engines(self) -> list[str]:
        return sorted(self._held)

    def held(self, engine: str) -> frozenset[int]:
        """The block hashes ``engine`` holds (tests, ``/admin``)."""
        return frozenset(self._held.get(engine, ()))

    def block_size(self, engine: str) -> int | None:
        return self._block_size.get(engine)

    def cached_tokens(self, chain: Sequence[int], engines: Iterable[str]) -> dict[str, int]:
        """For each of ``engines`` that holds the first block of ``chain`` (a prompt's block hashes, in
        order), the tokens of the longest run of ``chain`` from its start that it holds."""
        if not chain:
            return {}
        first = self._holders.get(chain[0])
        if not first:
            return {}
        alive = {engine for engine in engines if engine in first}
        blocks = dict.fromkeys(alive, 1)
        for at in range(1, len(chain)):
            if not alive:
                break
            copies = self._holders.get(chain[at])
            if not copies:
                break
            alive = {engine for engine in alive if engine in copies}
            for engine in alive:
                blocks[engine] = at + 1
        return {engine: count * self._block_size[engine] for engine, count in blocks.items()}

    def summary(self) -> Mapping[str, int]:
        """Blocks held per engine."""
        return {engine: len(held) for engine, held in sorted(self._held.items())}


__all__ = ["PrefixIndex"]
