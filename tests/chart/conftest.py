"""The helm binary for the chart tests (fetched on first use, see kube_binaries.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.kube_binaries import BinaryUnavailable, find_helm


@pytest.fixture(scope="session")
def helm_path() -> Path:
    try:
        return find_helm()
    except BinaryUnavailable as exc:
        pytest.skip(f"no helm binary: {exc}")
