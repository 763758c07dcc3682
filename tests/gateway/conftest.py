"""Gateway tests: a gateway over the two real engines every suite shares (``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from autellix.engine.launch import EngineProcess
from tests.live import TOKENIZER, gateway


@pytest.fixture(scope="module")
def gw(two_engines: list[EngineProcess]) -> Iterator[str]:
    with gateway([e.url for e in two_engines], "--tokenizer", TOKENIZER) as base:
        yield base
