"""Gateway tests: two real engines shared by the module's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from autellix.engine.launch import EngineProcess
from tests.live import TOKENIZER, engines, gateway


@pytest.fixture(scope="session")
def two_engines(engine_logs: Path) -> Iterator[list[EngineProcess]]:
    with engines(2, engine_logs) as started:
        yield started


@pytest.fixture(scope="module")
def gw(two_engines: list[EngineProcess]) -> Iterator[str]:
    with gateway([e.url for e in two_engines], "--tokenizer", TOKENIZER) as base:
        yield base
