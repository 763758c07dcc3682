"""Prometheus text from an engine's ``/metrics``, parsed once for everyone
(the gateway's engine pool, the preStop drain, benchmarks)."""

from __future__ import annotations

from collections.abc import Collection


def parse_metrics(text: str, names: Collection[str] | None = None) -> dict[str, float]:
    """Sum every sample by name over its labels (one model per engine); with
    ``names``, only the samples of those names (the other lines are never parsed:
    a vLLM scrape runs to hundreds of lines)."""
    from prometheus_client.parser import text_string_to_metric_families  # loaded on first use: the CLI stays quick

    if names is not None:
        text = "\n".join(line for line in text.splitlines() if _sample_name(line) in names)
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def sample_labels(text: str, name: str) -> dict[str, str] | None:
    """The labels of the first sample named ``name`` (an info metric's values), or None."""
    from prometheus_client.parser import text_string_to_metric_families

    lines = "\n".join(line for line in text.splitlines() if _sample_name(line) == name)
    for family in text_string_to_metric_families(lines):
        for sample in family.samples:
            return dict(sample.labels)
    return None


def _sample_name(line: str) -> str:
    """The metric name a text-format line samples ('' for comments)."""
    return "" if line.startswith("#") else line.split("{", 1)[0].split(" ", 1)[0]
