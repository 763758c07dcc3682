"""Envoy's ADS stream after a failure goes out on a new connection, not the one it failed on.

Seen on a real node: an Envoy pod started while kube-proxy had not yet programmed the operator's xDS
Service dialled its ClusterIP, the packets left the node, and whatever answered there (an HTTP/2 server
with no xDS: 404, which Envoy reads as gRPC's UNIMPLEMENTED) kept that one connection. Envoy retried its
stream on it for as long as the test looked, and never got a listener, though the control plane was up. A
relay here plays that network: its first connection reaches a gRPC server without the ADS service, every
later one the control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpclib.server import Server

from autellix.mesh.control_plane import ThreadedControlPlane
from autellix.mesh.envoy import start_envoy, wait_envoy_ready
from autellix.mesh.resources import MeshSettings


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class FirstConnectionElsewhere:
    """A TCP relay on its own loop and thread: connection 1 goes to a gRPC server that serves nothing,
    the rest to ``target``."""

    def __init__(self, target: int) -> None:
        self.target, self.port = target, free_port()
        self.connections = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        port = self.empty_port if self.connections == 1 else self.target
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))

    async def _start(self) -> None:
        self.empty = Server([])  # HTTP/2 and gRPC, no service: every call is UNIMPLEMENTED
        self.empty_port = free_port()
        await self.empty.start("127.0.0.1", self.empty_port)
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        self.server.close()
        self.empty.close()

    def __enter__(self) -> FirstConnectionElsewhere:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


SETTINGS = MeshSettings(listen_port=free_port())


@pytest.fixture
def control_plane() -> Iterator[ThreadedControlPlane]:
    with ThreadedControlPlane(SETTINGS) as plane:
        yield plane


def test_a_failed_ads_stream_is_retried_on_a_new_connection(control_plane: ThreadedControlPlane,
                                                             tmp_path: Path) -> None:
    with FirstConnectionElsewhere(control_plane.port) as relay:
        envoy = start_envoy("127.0.0.1", relay.port, listen_port=SETTINGS.listen_port, workdir=tmp_path / "envoy")
        try:
            wait_envoy_ready(envoy, timeout=45)  # Envoy's ADS retry backoff: a few seconds a try
        finally:
            envoy.stop()
    assert relay.connections >= 2
