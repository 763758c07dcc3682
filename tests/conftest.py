"""Fixtures shared by the tests that run real engines."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from autellix.engine.launch import EngineProcess, stop_engine, wait_ready
from tests.live import engines, start_test_engine


@pytest.fixture(scope="session")
def engine_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-logs")


@pytest.fixture(scope="session")
def two_engines(engine_logs: Path) -> Iterator[list[EngineProcess]]:
    """Two tiny-model engines with Autellix's scheduler, shared by every test that asks (gateway, picker, mesh)."""
    with engines(2, engine_logs) as started:
        yield started


@pytest.fixture(scope="session")
def engine_cache(engine_logs: Path) -> Iterator[Callable[..., EngineProcess]]:
    """Engines started on first use and shared by every test that asks for the
    same settings: each start costs most of a minute on this CPU."""
    started: dict[str, EngineProcess] = {}

    def get(**options: object) -> EngineProcess:
        key = repr(sorted(options.items()))
        engine = started.get(key)
        if engine is None or not engine.alive():
            engine = start_test_engine(engine_logs, **options)
            started[key] = engine
            wait_ready([engine], timeout=400)
        return engine

    try:
        yield get
    finally:
        for engine in started.values():
            stop_engine(engine)
