"""A real socket server that reads each request whole and answers as a test scripts it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Answer = Callable[[asyncio.StreamWriter, bytes], Awaitable[bool]]  # False: stop serving the connection


class ScriptedServer:
    """Reads each request whole and answers it with ``answer``; counts what it saw."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.disconnects = 0
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.disconnects += 1
                    return
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                if not await self.answer(writer, request):
                    return
        finally:
            writer.close()


async def start_scripted(answer: Answer, servers: list[asyncio.Server]) -> ScriptedServer:
    """A ``ScriptedServer`` listening on a free port of 127.0.0.1 (its asyncio server added to ``servers``)."""
    scripted = ScriptedServer(answer)
    server = await asyncio.start_server(scripted.handle, "127.0.0.1", 0)
    servers.append(server)
    scripted.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
    return scripted
