"""The CRDs: valid Kubernetes objects, structural schemas, the examples accepted, bad specs refused.

The API server validates custom resources with the CRD's OpenAPI v3.0 schema
(booleans for exclusiveMinimum, as JSON Schema draft 4) and then its CEL rules
(x-kubernetes-validations). The schema is checked here with jsonschema; the CEL
rules with cel-python when it is installed (the dev extra), else skipped.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from autellix.kube.spec import SpecError, parse_engine, parse_program
from autellix_lab.crd_schema import regenerate
from tests.kube.conftest import CRDS, ROOT, load_crd
from tests.kube.test_manifests import PLACED, VERSIONS

EXAMPLES = sorted((ROOT / "crds" / "examples").glob("*.yaml"))


def schema_of(kind: str) -> dict[str, Any]:
    return load_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def errors(kind: str, obj: dict[str, Any]) -> list[jsonschema.ValidationError]:
    return list(jsonschema.Draft4Validator(schema_of(kind)).iter_errors(obj))


@pytest.mark.parametrize("path", CRDS, ids=lambda p: p.name)
def test_crds_are_valid_kubernetes_objects(path: Path) -> None:
    crd = yaml.safe_load(path.read_text())
    for version in VERSIONS:
        kubernetes_validate.validate(crd, version, strict=True)
    versions = crd["spec"]["versions"]
    assert [v["name"] for v in versions] == ["v1alpha1"] and crd["spec"]["group"] == "autellix.ai"
    assert "status" in versions[0]["subresources"]
    assert versions[0]["additionalPrinterColumns"]


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("kind", ["AutellixEngine", "AgentProgram"])
def test_schemas_are_structural(kind: str) -> None:
    """Every node has a type (or is int-or-string / free-form); an int-or-string's anyOf is exactly the one
    pattern the API server accepts as structural (a type in any other anyOf branch makes the CRD invalid)."""
    for path, node in _nodes(schema_of(kind)):
        assert "type" in node or node.get("x-kubernetes-int-or-string") or \
            node.get("x-kubernetes-preserve-unknown-fields"), f"{kind}{path}: no type"
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string"), f"{kind}{path}"
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], f"{kind}{path}: {node['anyOf']}"


def unknown_fields(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Fields of ``value`` its structural schema does not know: what the API server drops, or refuses
    under strict field validation (kubectl's default since 1.27)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(value, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                found += unknown_fields(props[key], item, f"{path}.{key}")
            elif props is None and isinstance(extra, dict):
                found += unknown_fields(extra, item, f"{path}.{key}")
            elif props is not None:
                found.append(f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += unknown_fields(schema["items"], item, f"{path}[{index}]")
    return found


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_match_their_crd_and_the_operator_accepts_them(path: Path) -> None:
    for obj in yaml.safe_load_all(path.read_text()):
        if obj["apiVersion"] != "autellix.ai/v1alpha1":
            continue  # the autoscaler examples' HPA and ScaledObject: tests/kube/test_external_autoscalers.py
        assert not errors(obj["kind"], obj), [e.message for e in errors(obj["kind"], obj)]
        assert not unknown_fields(schema_of(obj["kind"]), obj)
        (parse_engine if obj["kind"] == "AutellixEngine" else parse_program)(obj["spec"])


def test_generated_schemas_are_current() -> None:
    """The placement fields' schemas are Kubernetes' own (autellix_lab.crd_schema); regenerating changes nothing."""
    text = (ROOT / "crds" / "autellixengine.yaml").read_text()
    assert regenerate(text) == text, "stale: run python -m autellix_lab.crd_schema"


def test_schema_knows_every_placement_field_and_nothing_else() -> None:
    obj = engine(**{k: v for k, v in PLACED.items() if k != "model"})
    obj["spec"]["model"] = PLACED["model"]
    assert not errors("AutellixEngine", obj), [e.message for e in errors("AutellixEngine", obj)]
    assert not unknown_fields(schema_of("AutellixEngine"), obj)
    typo = copy.deepcopy(obj)
    typo["spec"]["nodeSelecter"] = {"gpu": "a100"}
    typo["spec"]["tolerations"][0]["efect"] = "NoSchedule"
    typo["spec"]["affinity"]["nodeAffinity"]["requiredDuringScheduling"] = {}
    assert unknown_fields(schema_of("AutellixEngine"), typo) == [
        ".spec.tolerations[0].efect", ".spec.affinity.nodeAffinity.requiredDuringScheduling", ".spec.nodeSelecter"]


def engine(**spec: Any) -> dict[str, Any]:
    base = {"model": {"name": "m", "source": {"hub": "org/model"}}}
    return {"apiVersion": "autellix.ai/v1alpha1", "kind": "AutellixEngine", "metadata": {"name": "e"},
            "spec": {**base, **spec}}


BAD_ENGINES = [
    ("negative replicas", engine(replicas=-1), "spec.replicas", "-1 is less than the minimum of 0"),
    ("unknown policy", engine(scheduler={"policy": "sjf"}), "spec.scheduler.policy",
     "'sjf' is not one of ['atlas', 'plas', 'mlfq', 'fcfs']"),
    ("two sources", engine(model={"name": "m", "source": {"hub": "a/b", "path": "/m"}}), "spec.model.source",
     "has too many properties"),
    ("no model", {"apiVersion": "autellix.ai/v1alpha1", "kind": "AutellixEngine", "spec": {}}, "spec",
     "'model' is a required property"),
    ("quantum not a number", engine(scheduler={"quanta": [64, "fast"]}), "spec.scheduler.quanta.1",
     "'fast' does not match '^inf$'"),
    ("zero quantum", engine(scheduler={"quanta": [0, "inf"]}), "spec.scheduler.quanta.0",
     "0 is less than the minimum of 1"),
    ("beta as a word", engine(scheduler={"beta": "high"}), "spec.scheduler.beta", "'high' does not match"),
    ("zero target load", engine(autoscaling={"targetLoad": 0}), "spec.autoscaling.targetLoad",
     "less than or equal to the minimum of 0"),
    ("gpus as text", engine(resources={"gpus": "one"}), "spec.resources.gpus", "'one' is not of type 'integer'"),
    ("toleration seconds as text", engine(tolerations=[{"key": "k", "tolerationSeconds": "soon"}]),
     "spec.tolerations.0.tolerationSeconds", "'soon' is not of type 'integer'"),
    ("node selector value a number", engine(nodeSelector={"gpu": 1}), "spec.nodeSelector.gpu",
     "1 is not of type 'string'"),
    ("relative hostPath cache", engine(model={"name": "m", "source": {"hub": "a/b"},
                                              "cache": {"hostPath": {"path": "cache"}}}),
     "spec.model.cache.hostPath.path", "does not match '^/'"),
    ("negative boundary", engine(scheduler={"boundaries": [-1]}), "spec.scheduler.boundaries.0",
     "less than or equal to the minimum of 0"),
]


@pytest.mark.parametrize(("obj", "where", "message"), [c[1:] for c in BAD_ENGINES], ids=[c[0] for c in BAD_ENGINES])
def test_bad_engine_specs_are_refused_by_the_schema(obj: dict[str, Any], where: str, message: str) -> None:
    found = errors("AutellixEngine", obj)
    assert found, "accepted"
    assert any(".".join(map(str, e.absolute_path)) == where and message in e.message for e in found), \
        [(list(e.absolute_path), e.message) for e in found]


def test_bad_program_specs_are_refused_by_the_schema() -> None:
    good = {"apiVersion": "autellix.ai/v1alpha1", "kind": "AgentProgram", "spec": {"image": "a"}}
    assert not errors("AgentProgram", good)
    for spec, message in [({}, "'image' is a required property"),
                          ({"image": "a", "gateway": "ftp://x"}, "does not match '^https?://'"),
                          ({"image": "a", "timeoutSeconds": 0}, "0 is less than the minimum of 1"),
                          ({"image": "a", "backoffLimit": 11}, "11 is greater than the maximum of 10"),
                          ({"image": "a", "ttlSecondsAfterFinished": -1}, "-1 is less than the minimum of 0"),
                          ({"image": "a", "resources": {"requests": {"cpu": [1]}}}, "is not valid under any")]:
        found = errors("AgentProgram", {**good, "spec": spec})
        assert any(message in e.message for e in found), [e.message for e in found]


def _rules(kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, node in _nodes(schema_of(kind)):
        for rule in node.get("x-kubernetes-validations", []):
            yield path, rule


CEL_CASES = [  # (kind, path of the node, value that passes, value that fails)
    ("AutellixEngine", ".spec.model.source", {"pvc": {"claimName": "c"}}, {"path": "/m", "hub": "a/b"}),
    ("AutellixEngine", ".spec.model.source", {"image": {"reference": "r"}}, {"image": {"reference": "r"},
                                                                              "hub": "a/b"}),
    ("AutellixEngine", ".spec.model", {"name": "m", "source": {"hub": "a/b"}, "revision": "abc"},
     {"name": "m", "source": {"path": "/m"}, "revision": "abc"}),
    ("AutellixEngine", ".spec.model", {"name": "m", "source": {"hub": "a/b"}, "cache": {"offline": True}},
     {"name": "m", "source": {"path": "/m"}, "cache": {"pvc": {"claimName": "c"}}}),
    ("AutellixEngine", ".spec.model.cache", {"pvc": {"claimName": "c"}},
     {"pvc": {"claimName": "c"}, "hostPath": {"path": "/c"}}),
    ("AutellixEngine", ".spec.scheduler", {"boundaries": [1, 2], "quanta": [8, 16, "inf"]},
     {"boundaries": [1, 2], "quanta": [8, 16]}),
    ("AutellixEngine", ".spec.autoscaling", {"minReplicas": 1, "maxReplicas": 2}, {"minReplicas": 3, "maxReplicas": 2}),
]


@pytest.mark.parametrize(("kind", "where", "good", "bad"), CEL_CASES, ids=[f"{c[1]}-{i}" for i, c in
                                                                          enumerate(CEL_CASES)])
def test_cel_rules_refuse_with_their_message(kind: str, where: str, good: Any, bad: Any) -> None:
    celpy = pytest.importorskip("celpy", reason="cel-python (dev extra) evaluates the CRDs' CEL rules")
    rules = [r for p, r in _rules(kind) if p == where]
    env = celpy.Environment()
    programs = [(env.program(env.compile(rule["rule"])), rule) for rule in rules]
    assert all(program.evaluate({"self": celpy.json_to_cel(good)}) for program, _ in programs)
    (_, rule), = [(p, r) for p, r in programs if not p.evaluate({"self": celpy.json_to_cel(bad)})]
    assert where.rsplit(".", 1)[1] in rule["message"]
    # The operator refuses the same spec (an old API server without CEL) with the same meaning.
    spec = copy.deepcopy(engine()["spec"])
    *parents, leaf = where.removeprefix(".spec.").split(".")
    node = spec
    for step in parents:
        node = node[step]
    node[leaf] = bad
    with pytest.raises(SpecError) as info:
        parse_engine(spec)
    field = rule["message"].split(":", 1)[0]
    assert str(info.value).startswith(f"spec.{field}"), (str(info.value), rule["message"])
