"""Scheduling policies, one per file, behind the ``Policy`` interface."""

from __future__ import annotations

from autellix.core.config import POLICIES, ConfigError
from autellix.core.policies.atlas import ATLAS
from autellix.core.policies.base import Policy
from autellix.core.policies.fcfs import FCFS
from autellix.core.policies.mlfq import MLFQ
from autellix.core.policies.plas import PLAS

_BY_NAME: dict[str, type] = {"atlas": ATLAS, "plas": PLAS, "mlfq": MLFQ, "fcfs": FCFS}
assert tuple(_BY_NAME) == POLICIES


def policy_by_name(name: str) -> Policy:
    try:
        return _BY_NAME[name]()
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; expected one of {', '.join(POLICIES)}") from None


__all__ = ["ATLAS", "FCFS", "MLFQ", "PLAS", "Policy", "policy_by_name"]
