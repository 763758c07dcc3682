"""The seam between Autellix and an engine: ``EngineBackend``.

Everything engine-specific sits behind it: how a call is annotated with its
program's priority and fields, which metrics give an engine's load, where a
call's model time comes from, how usage is read from an answer, and when an
engine is drained. The request controller, the engine pool and the preStop
drain only talk to this interface; vLLM is one implementation
(``autellix.backends.vllm``), and another engine is one more module
(``docs/backends.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from autellix.protocol import CallRecord, SchedulingFields


@dataclass
class CallOutcome:
    """What one call's answer said, as far as the gateway reads it."""

    status: int
    completion_tokens: int = 0
    prompt_tokens: int = 0
    #: A stream was cut after bytes reached the client (an error event was sent).
    broken: bool = False
    #: The engine's own timing of the call's execution, when its answer carries one.
    engine_seconds: float | None = None
    #: The call's exact model time, when whoever ran it knows it (the simulator);
    #: None: the controller asks the engine's record, then falls back.
    model_time: float | None = None
    #: The engine's record of the call, when its answer carried it
    #: (``autellix.protocol.RECORD_HEADER``); None: the controller asks for it.
    record: CallRecord | None = None


@dataclass(frozen=True)
class EngineLoad:
    running: float
    waiting: float


class EngineBackend(Protocol):
    #: The name in configuration (``--backend``), the CRD and the chart.
    name: str
    #: The only samples of the engine's ``/metrics`` the pool parses (the rest is skipped).
    pool_metrics: frozenset[str]

    def annotate(self, body: Mapping[str, Any], fields: SchedulingFields, *, stream: bool) -> dict[str, Any]:
        """The request body the engine gets: the client's, plus the program's
        priority and fields; on streams, asks for the usage chunk."""
        ...

    def read_usage(self, answer: Mapping[str, Any], outcome: CallOutcome) -> None:
        """Fill ``outcome`` from a Chat or Completions answer (whole, or a stream's usage chunk): token counts
        and what ``read_timing`` reads."""
        ...

    def read_timing(self, answer: Mapping[str, Any], outcome: CallOutcome) -> None:
        """Fill ``outcome.engine_seconds`` from what the engine adds to an answer of any API, if anything."""
        ...

    def load(self, metrics: Mapping[str, float]) -> EngineLoad:
        """Running and waiting calls from a parsed scrape."""
        ...

    def price_counters(self, metrics: Mapping[str, float]) -> tuple[float, float] | None:
        """(model seconds, generated tokens) totals for pricing a token; None if absent."""
        ...

    def kv_blocks(self, metrics_text: str) -> tuple[int, int] | None:
        """(KV blocks in all, tokens per block) from a scrape's text; None: the engine does not say."""
        ...

    def kv_usage(self, metrics: Mapping[str, float]) -> float | None:
        """The share of KV blocks held by calls (0 to 1), from a parsed scrape; None: not said."""
        ...

    def drain_ready(self, metrics: Mapping[str, float]) -> bool:
        """True when the engine holds no call: its pod may stop."""
        ...

    def info_path(self) -> str | None:
        """Where the engine says it runs Autellix's scheduler (None: never)."""
        ...

    def record_path(self, call_id: str) -> str | None:
        """Where a finished call's record is read (None: no records)."""
        ...

    def program_path(self, program_id: str) -> str | None:
        """Where the engine's tally of a program's service is read (``autellix.protocol.ProgramService``;
        None: the engine keeps none). A replica taking a program over checks the store against it."""
        ...

    def model_time(self, record: CallRecord | None, outcome: CallOutcome,
                   seconds_per_token: float) -> tuple[float, str]:
        """A finished call's model execution time and its source (a metrics label)."""
        ...
