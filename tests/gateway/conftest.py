"""Gateway tests: a gateway over the two real engines every suite shares (``tests/conftest.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping

import pytest
import pytest_asyncio
import uvloop

from autellix.engine.launch import EngineProcess
from tests.gateway.scripted_server import Answer, ScriptedServer, start_scripted
from tests.live import TOKENIZER, gateway


@pytest.fixture(scope="module")
def gw(two_engines: list[EngineProcess]) -> Iterator[str]:
    with gateway([e.url for e in two_engines], "--tokenizer", TOKENIZER) as base:
        yield base


def pytest_asyncio_loop_factories(config: pytest.Config,
                                  item: pytest.Item) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The call leg's client runs on asyncio's loop and on uvloop's (``autellix gateway`` runs on uvloop)."""
    if item.module is not None and item.module.__name__.endswith("test_engine_calls"):
        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


@pytest_asyncio.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Awaitable[ScriptedServer]]]:
    """Starts ``ScriptedServer``s answering as the test scripts; closes them after it."""
    servers: list[asyncio.Server] = []

    async def start(answer: Answer) -> ScriptedServer:
        return await start_scripted(answer, servers)

    yield start
    for server in servers:
        server.close()
