"""Policies, balancers and engine backends are registered once; the CLI's help,
the CRD's enums and the chart's values schema must list the same names.

Reads the files and the CLI's option definitions only (nothing is started)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer.main
import yaml

from autellix.backends import BACKENDS
from autellix.cli import app
from autellix.core.balancers import balancer_from_config
from autellix.core.config import BALANCERS, POLICIES, SchedulerConfig
from autellix.core.policies import policy_by_name

ROOT = Path(__file__).resolve().parents[1]
REGISTRIES = {"policy": tuple(POLICIES), "balancer": tuple(BALANCERS), "backend": tuple(BACKENDS)}


def enums(tree: Any, path: str = "") -> Iterator[tuple[str, list[Any]]]:
    """(path, enum) for every ``enum`` in a JSON-schema-like tree."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key == "enum" and isinstance(value, list):
                yield path, value
            else:
                yield from enums(value, f"{path}/{key}")
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from enums(value, f"{path}/{i}")


def named(tree: Any, field: str) -> list[list[Any]]:
    """The enums of every property called ``field``."""
    return [values for path, values in enums(tree) if path.endswith(f"/properties/{field}")]


def cli_options(field: str) -> list[tuple[str, str]]:
    """(command, help) of every ``--<field>`` option of the CLI."""
    found = []

    def walk(command: Any, name: str) -> None:  # typer ships its own click: duck-typed
        for param in command.params:
            if f"--{field}" in getattr(param, "opts", ()):
                found.append((name, getattr(param, "help", None) or ""))
        for sub_name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{name} {sub_name}")

    walk(typer.main.get_command(app), "autellix")
    return found


def test_every_policy_name_builds_its_policy() -> None:
    assert [policy_by_name(n).name for n in POLICIES] == list(POLICIES)


def test_every_balancer_name_builds_its_balancer() -> None:
    built = [balancer_from_config(SchedulerConfig().with_overrides(balancer=n)) for n in BALANCERS]
    assert [b.name for b in built] == list(BALANCERS)


def test_the_crds_list_the_registered_names() -> None:
    crds = [doc for path in sorted((ROOT / "crds").glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())
            if doc]
    seen = {field: named(crds, field) for field in REGISTRIES}
    assert seen["policy"], "the AutellixEngine CRD no longer has a policy enum"
    for field, lists in seen.items():
        for values in lists:
            assert tuple(values) == REGISTRIES[field], (field, values)


def test_the_chart_values_schema_lists_the_registered_names() -> None:
    schema = json.loads((ROOT / "charts" / "autellix" / "values.schema.json").read_text())
    seen = {field: named(schema, field) for field in REGISTRIES}
    assert seen["policy"] and seen["balancer"], "the chart's schema no longer has the scheduler enums"
    for field, lists in seen.items():
        for values in lists:
            assert tuple(values) == REGISTRIES[field], (field, values)


def test_the_cli_help_lists_the_registered_names() -> None:
    for field, names in REGISTRIES.items():
        options = cli_options(field)
        assert options, f"no --{field} option in the CLI"
        for command, help_text in options:  # `sim` takes an alias besides (algorithm2) and says so
            listed = [n for n in names if n in help_text]
            assert listed == list(names), (command, field, help_text)
    gateway = dict(cli_options("backend"))
    assert "autellix gateway" in gateway
