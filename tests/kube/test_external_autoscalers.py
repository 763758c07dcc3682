"""The HPA and KEDA examples (crds/examples/autoscaler-*.yaml): valid, aimed at an example engine through
its scale subresource, and recognised by the operator, which then stands down."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from autellix.kube import GROUP
from autellix.kube.autoscaler import external_autoscalers
from autellix.kube.spec import parse_engine
from tests.kube.conftest import ROOT, load_crd
from tests.kube.test_manifests import VERSIONS

EXAMPLES = ROOT / "crds" / "examples"


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


def target_engine(target: dict[str, Any]) -> dict[str, Any]:
    """The example AutellixEngine a scaleTargetRef names; its built-in autoscaler is off."""
    assert (target["apiVersion"], target["kind"]) == ("autellix.ai/v1alpha1", "AutellixEngine")
    engines = [obj for p in EXAMPLES.glob("engine-*.yaml") for obj in yaml.safe_load_all(p.read_text())
               if obj and obj.get("kind") == "AutellixEngine"]
    (engine,) = [e for e in engines if e["metadata"]["name"] == target["name"]]
    assert not parse_engine(engine["spec"]).autoscaling.enabled
    return engine


@pytest.mark.parametrize("version", VERSIONS)
def test_hpa_example_is_valid_and_targets_an_engine(version: str) -> None:
    hpa = example("autoscaler-hpa.yaml")
    kubernetes_validate.validate(hpa, version, strict=True)
    engine = target_engine(hpa["spec"]["scaleTargetRef"])
    assert hpa["spec"]["metrics"][0]["type"] == "External"
    assert external_autoscalers([hpa], engine["metadata"]["name"], GROUP) == [hpa["metadata"]["name"]]
    # the HPA needs the scale subresource's selector (status.selector) to count the engine's pods
    scale = load_crd("AutellixEngine")["spec"]["versions"][0]["subresources"]["scale"]
    assert scale == {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                     "labelSelectorPath": ".status.selector"}


def test_keda_example_targets_an_engine() -> None:
    """No schema for KEDA's kind here: its fields, and that the HPA KEDA makes of it is recognised."""
    scaled = example("autoscaler-keda.yaml")
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert set(scaled["spec"]) <= {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "cooldownPeriod",
                                   "pollingInterval", "triggers", "advanced"}
    engine = target_engine(scaled["spec"]["scaleTargetRef"])
    assert scaled["spec"]["triggers"][0]["type"] == "prometheus"
    made_by_keda = {"metadata": {"name": f"keda-hpa-{scaled['metadata']['name']}"},
                    "spec": {"scaleTargetRef": scaled["spec"]["scaleTargetRef"]}}
    assert external_autoscalers([made_by_keda], engine["metadata"]["name"], GROUP) == ["keda-hpa-qwen-7b"]
    other = {"metadata": {"name": "web"}, "spec": {"scaleTargetRef": {"apiVersion": "apps/v1",
                                                                      "kind": "Deployment", "name": "qwen-7b"}}}
    assert external_autoscalers([other], "qwen-7b", GROUP) == []
