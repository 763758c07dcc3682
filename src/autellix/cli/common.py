"""What every command group of the CLI shares: errors, output formats, comma lists."""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import typer


class OutputFormat(enum.StrEnum):
    table = "table"
    json = "json"


def one_of(names: Iterable[str]) -> str:
    """A registry's names for help text: "a, b or c" (registered once, never typed here)."""
    listed = list(names)
    return ", ".join(listed[:-1]) + " or " + listed[-1] if len(listed) > 1 else "".join(listed)


def fail(message: str) -> typer.Exit:
    """``error: message`` on stderr; raise the returned exit (code 2, as for a bad option)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def comma_list(text: str) -> list[str]:
    """A comma-separated option's items, stripped, empty ones dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def numbers(text: str | None, kind: Callable[[str], Any] = float) -> list[Any] | None:
    """A comma-separated option as numbers (None when not given)."""
    if not text:
        return None
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise fail(f"expected comma-separated numbers, got {text!r}") from None


def write_json(report: dict[str, Any], out: Path, name: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(report, indent=2, default=str))
    return path


def progress(line: str) -> None:
    """A command's progress lines go to stderr (stdout is its result)."""
    typer.echo(line, err=True)
