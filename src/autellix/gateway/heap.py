"""Give the heap's free pages back to the system on a timer (glibc only).

asyncio reads a socket into a new 256 KiB buffer and shrinks it to what came. glibc maps blocks
over its mmap threshold (128 KiB at start) but raises the threshold past any mapped block that is
freed, so soon every read buffer is cut from the heap, and its shrunk remainder, alive while its
data is, pins the pages around it. Under the soak (``experiments/soak.py``) the heap's free memory grew
about 1 MiB a minute with what it held in use flat, and the gateway's RSS with it.

Fixing the threshold (``mallopt``) keeps read buffers mapped, but then every read maps and unmaps
256 KiB: about 130 µs of CPU per call, measured. ``malloc_trim(0)`` every 30 s instead releases the
free pages inside the heap (``madvise``) at a cost of a fraction of a millisecond per trim."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
from collections.abc import AsyncIterator, Callable, Mapping

from aiohttp import web

#: Seconds between two trims; ``$AUTELLIX_HEAP_TRIM_S`` (0: never) overrides it in ``serve``.
HEAP_TRIM_EVERY_S = 30.0


def heap_trim_every(environ: Mapping[str, str]) -> float:
    """Seconds between trims: ``$AUTELLIX_HEAP_TRIM_S`` or the default; 0 turns trimming off."""
    raw = environ.get("AUTELLIX_HEAP_TRIM_S", "")
    if not raw.strip():
        return HEAP_TRIM_EVERY_S
    try:
        every = float(raw)
    except ValueError:
        every = -1.0
    if not every >= 0:  # also NaN
        raise ValueError(f"AUTELLIX_HEAP_TRIM_S must be a number of seconds >= 0 (0: never), not {raw!r}")
    return every


def glibc_malloc_trim() -> Callable[[], int] | None:
    """``malloc_trim(0)`` of this process's C library, or None where that is not glibc."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "malloc_trim"):
        return None  # musl and others: their allocator, their rules
    return lambda: int(libc.malloc_trim(0))


def install_heap_trim(app: web.Application, every: float = HEAP_TRIM_EVERY_S) -> bool:
    """Trim the heap every ``every`` seconds while ``app`` runs; False when there is nothing to do
    (``every`` <= 0, or not glibc)."""
    trim = glibc_malloc_trim()
    if trim is None or every <= 0:
        return False

    async def trim_forever() -> None:
        while True:
            await asyncio.sleep(every)
            trim()

    async def trimming(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(trim_forever(), name="heap-trim")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(trimming)
    return True
