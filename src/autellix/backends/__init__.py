"""Engine backends, registered once: ``BACKENDS`` names every one the CLI, the
CRD and the chart accept (a test keeps them in step)."""

from __future__ import annotations

from collections.abc import Callable

from autellix.backends.base import CallOutcome, EngineBackend, EngineLoad
from autellix.backends.scrape import parse_metrics
from autellix.backends.vllm import VllmBackend

BACKENDS: dict[str, Callable[[], EngineBackend]] = {"vllm": VllmBackend}
DEFAULT_BACKEND = "vllm"


def backend_by_name(name: str) -> EngineBackend:
    try:
        return BACKENDS[name]()
    except KeyError:
        raise ValueError(f"unknown engine backend {name!r}; expected one of {', '.join(BACKENDS)}") from None


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "CallOutcome", "EngineBackend", "EngineLoad", "VllmBackend",
           "backend_by_name", "parse_metrics"]
