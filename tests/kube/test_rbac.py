"""The operator's RBAC (autellix_lab.operator_rights, which the chart renders) against what its code does in the
emulated cluster: every request the operators made in this session's tests was granted, and every grant
was used, or is named below with the reason no emulated test reaches it.

Runs after the operator tests (file order); alone, or with them deselected, it is skipped.
"""

from __future__ import annotations

import pytest

from autellix_lab.operator_rights import OPERATOR_RULES, granted
from tests.kube.conftest import ACCESS_FROM, OPERATOR_ACCESS

#: Modules whose operators together exercise every code path that calls the API.
SCENARIOS = {"test_engine_operator", "test_program_operator", "test_autoscaling", "test_leader_election",
             "test_gateway_membership"}
#: Grants the emulated tests do not reach, and why the code needs them all the same.
NOT_REACHED = {
    ("patch", "inference.networking.k8s.io", "inferencepools"): "drift repair of an InferencePool someone edited",
}


@pytest.fixture
def observed() -> set[tuple[str, str, str]]:
    if not SCENARIOS <= ACCESS_FROM:
        pytest.skip(f"needs the operator scenarios of {sorted(SCENARIOS - ACCESS_FROM)} run first in this session")
    return {(verb, group, resource) for verb, group, resource, _ in OPERATOR_ACCESS}


def test_every_request_of_the_operator_is_granted(observed: set[tuple[str, str, str]]) -> None:
    assert not observed - granted(), sorted(observed - granted())


def test_no_grant_goes_unused(observed: set[tuple[str, str, str]]) -> None:
    unused = granted() - observed
    assert unused == set(NOT_REACHED), sorted(unused ^ set(NOT_REACHED))


def test_cluster_wide_grants_are_only_what_a_namespaced_role_cannot_give() -> None:
    cluster = [(r.group, r.resources) for r in OPERATOR_RULES if r.scope == "cluster"]
    assert cluster == [("apiextensions.k8s.io", ("customresourcedefinitions",))]
    assert all("delete" not in r.verbs and "*" not in r.verbs for r in OPERATOR_RULES)
    assert not any("secrets" in r.resources for r in OPERATOR_RULES)
