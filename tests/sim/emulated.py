"""Emulated engines served in the test's own event loop, on free ports, until the block ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import aiohttp

from autellix.child_processes import free_ports
from autellix.sim.emulator import EmulatedEngine, serve


@contextlib.asynccontextmanager
async def serving(engines: Sequence[EmulatedEngine], ports: Sequence[int] | None = None) -> AsyncIterator[list[str]]:
    """Serve ``engines`` (on ``ports``, else free ones); yields their base URLs once each answers ``/health``."""
    ports = list(ports or free_ports(len(engines)))
    task = asyncio.create_task(serve(engines, "127.0.0.1", ports))
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    async with aiohttp.ClientSession() as s:
        for url in urls:
            for _ in range(100):
                with contextlib.suppress(aiohttp.ClientError):
                    async with s.get(url + "/health") as r:
                        if r.status == 200:
                            break
                await asyncio.sleep(0.05)
    try:
        yield urls
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
