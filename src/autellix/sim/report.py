"""Simulator results for people (a rich table) and programs (JSON)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

COLUMNS = (
    ("total_wait", "total wait"),
    ("makespan", "makespan"),
    ("mean_token_latency", "mean tok. lat."),
    ("p95_token_latency", "P95 tok. lat."),
    ("p99_token_latency", "P99 tok. lat."),
)


def to_json(results: Mapping[str, Mapping[str, Any]]) -> str:
    def plain(v: Any) -> Any:
        return None if isinstance(v, float) and math.isnan(v) else v

    return json.dumps({k: {m: plain(v) for m, v in r.items()} for k, r in results.items()}, indent=2)


def print_table(results: Mapping[str, Mapping[str, Any]], title: str, console: Console | None = None) -> None:
    table = Table(title=title)
    table.add_column("policy")
    for _, label in COLUMNS:
        table.add_column(label, justify="right")
    for policy, row in results.items():
        table.add_row(policy, *(f"{row[key]:.3f}".rstrip("0").rstrip(".") for key, _ in COLUMNS))
    (console or Console()).print(table)
