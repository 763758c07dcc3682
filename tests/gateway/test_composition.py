"""The composition root: one typed gateway from its configuration, its store's metrics in its registry, and
its queues laid out by its policy."""

from __future__ import annotations

import pytest

from autellix.control.store.base import MemoryStore
from autellix.core import POLICIES, SchedulerConfig, policy_by_name
from autellix.gateway.compose import build_gateway
from autellix.gateway.config import GatewayConfig
from autellix.gateway.parts import Gateway

ENGINES = ["http://127.0.0.1:9"]


def test_a_gateway_without_a_store_url_keeps_its_state_in_memory_and_exports_the_store_metrics_it_has() -> None:
    gateway = build_gateway(GatewayConfig(engines=ENGINES))
    assert isinstance(gateway, Gateway) and isinstance(gateway.store, MemoryStore)
    assert gateway.store in gateway.services  # started first, stopped last: its last write behind
    registry = gateway.metrics.registry
    assert registry.get_sample_value("autellix_takeover_checks_total", {"outcome": "repaired"}) == 0.0
    assert registry.get_sample_value("autellix_store_up") is None  # no shared store to be out of reach


def test_a_store_url_that_is_not_a_store_is_refused_with_its_password_hidden() -> None:
    with pytest.raises(ValueError, match=r"expected a redis:// URL, got 'http://:\*\*\*@store/'"):
        build_gateway(GatewayConfig(engines=ENGINES, store_url="http://:secret@store/"))
    assert "secret" not in repr(GatewayConfig(store_url="redis://:secret@store:6379/0"))


@pytest.mark.parametrize("name", POLICIES)
def test_the_controller_queues_as_its_policy_lays_the_queues_out(name: str) -> None:
    """FCFS runs one queue and classic MLFQ demotes by quanta of its own: the policy's layout, not the
    configuration's raw one. Calls of either enter Q1 whatever the layout (their level sent to the engines)."""
    config = SchedulerConfig(policy=name)
    controller = build_gateway(GatewayConfig(engines=ENGINES, scheduler=config)).controller
    assert controller.queues == policy_by_name(name).queues(config)
    if name == "fcfs":
        assert controller.queues.num_queues == 1
    if not policy_by_name(name).places_by_priority:
        assert controller.queues.level_for(0.0) == 0


def test_a_gateway_on_a_shared_store_registers_its_health_once() -> None:
    pytest.importorskip("redis")
    from autellix.control.store.shared import SharedStore

    # nothing is reached before the gateway starts: a URL nobody listens on will do
    gateway = build_gateway(GatewayConfig(engines=ENGINES, store_url="redis://127.0.0.1:1/0"))
    assert isinstance(gateway.store, SharedStore)
    registry = gateway.metrics.registry
    assert registry.get_sample_value("autellix_store_up") == 1.0
    assert registry.get_sample_value("autellix_store_errors_total", {"op": "check"}) == 0.0
    assert registry.get_sample_value("autellix_takeover_checks_total", {"outcome": "confirmed"}) == 0.0
