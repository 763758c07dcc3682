"""The gateway trims glibc's heap on a timer (``autellix.gateway.heap``): the free pages that
asyncio's shrunk socket read buffers strand inside the heap go back to the system.

Each case runs in a fresh interpreter (the heap is process-wide): the allocation pattern of an
asyncio server (a socket read into a 256 KiB buffer shrunk to what came, that data alive for a
while among other blocks over 512 bytes), after one large block was freed, which is what raises
glibc's dynamic mmap threshold; then most of it is freed, and an aiohttp app runs for a moment,
with the gateway's trim installed or not. The resident set is read from ``/proc/self/statm``."""

from __future__ import annotations

import asyncio
import ctypes
import os
import subprocess
import sys

import pytest
from aiohttp import web

from autellix.gateway.heap import HEAP_TRIM_EVERY_S, heap_trim_every, install_heap_trim

PATTERN = """
import asyncio, os, random, socket, sys
from aiohttp import web
from autellix.gateway.heap import install_heap_trim

def rss() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

reader, writer = socket.socketpair()
rng = random.Random(1)
block = bytearray(300_000)
del block  # a mapped block freed: glibc raises a dynamic threshold past it
live = []
for _ in range(20_000):
    writer.send(b"x" * rng.randint(100, 3000))
    live.append(reader.recv(262144))  # what asyncio's transports do for every read
    live.append(bytearray(rng.randint(600, 4000)))
    while len(live) > 400:
        live.pop(rng.randrange(len(live)))
del live[20:]  # the load is over: a few blocks stay alive, scattered through the heap

async def run_app() -> int:
    app = web.Application()
    if sys.argv[1] == "trim":
        assert install_heap_trim(app, every=0.05)
    runner = web.AppRunner(app)
    await runner.setup()
    before = rss()
    await asyncio.sleep(0.4)
    after = rss()
    await runner.cleanup()
    return before - after

print(asyncio.run(run_app()))
"""


def _glibc() -> bool:
    return hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


def _released_bytes(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES",
                                                            "MALLOC_TRIM_THRESHOLD_")}
    done = subprocess.run([sys.executable, "-c", PATTERN, mode], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _glibc(), reason="glibc's allocator")
def test_the_timer_gives_stranded_heap_pages_back() -> None:
    # without the trim, the pages stay resident: the check below means something
    assert _released_bytes("none") < 1024 * 1024
    assert _released_bytes("trim") > 4 * 1024 * 1024


@pytest.mark.asyncio
async def test_the_trim_stops_with_the_app() -> None:
    app = web.Application()
    if not install_heap_trim(app, every=0.01):
        pytest.skip("not glibc")
    runner = web.AppRunner(app)
    await runner.setup()
    await asyncio.sleep(0.05)  # a few trims
    assert any(task.get_name() == "heap-trim" for task in asyncio.all_tasks())
    await runner.cleanup()
    assert not any(task.get_name() == "heap-trim" for task in asyncio.all_tasks())
    assert not install_heap_trim(web.Application(), every=0)


def test_the_interval_comes_from_the_environment() -> None:
    assert heap_trim_every({}) == HEAP_TRIM_EVERY_S
    assert heap_trim_every({"AUTELLIX_HEAP_TRIM_S": "5"}) == 5.0
    assert heap_trim_every({"AUTELLIX_HEAP_TRIM_S": "0"}) == 0.0
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(ValueError, match="AUTELLIX_HEAP_TRIM_S"):
            heap_trim_every({"AUTELLIX_HEAP_TRIM_S": bad})


def test_the_gateway_refuses_a_bad_interval_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from autellix.cli import app

    monkeypatch.setenv("AUTELLIX_HEAP_TRIM_S", "soon")
    done = CliRunner().invoke(app, ["gateway", "--engine", "http://127.0.0.1:9", "--port", "0"])
    assert done.exit_code == 2 and "AUTELLIX_HEAP_TRIM_S must be a number of seconds" in done.output
