"""The helm binary for the chart tests (fetched on first use, see helm_binary.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.helm_binary import HelmUnavailable, find_helm


@pytest.fixture(scope="session")
def helm_path() -> Path:
    try:
        return find_helm()
    except HelmUnavailable as exc:
        pytest.skip(f"no helm binary: {exc}")
