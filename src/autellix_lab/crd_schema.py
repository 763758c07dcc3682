"""Structural CRD schemas of Kubernetes' own pod types, generated (a development tool).

An AutellixEngine's placement fields (affinity, tolerations, ...) are Kubernetes
types. Their schemas in the CRD are generated from the Kubernetes OpenAPI
definitions that kubernetes-validate ships, so the API server checks them as
strictly as a Deployment's own (an unknown or misspelt field is refused with
``kubectl apply``'s strict field validation, not silently pruned).
Descriptions are left out to keep the CRD small.

``python -m autellix_lab.crd_schema`` rewrites the generated blocks of
``crds/autellixengine.yaml``: after a ``# generated: Affinity`` (or
``[Toleration]``, a list) comment inside a field, up to ``# end generated``;
``tests/kube/test_crds.py`` fails when they are stale.
"""

from __future__ import annotations

import json
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

import yaml

#: The oldest Kubernetes the chart supports: its fields are what every supported cluster knows.
KUBERNETES = "1.29.0"
PREFIX = "io.k8s.api.core.v1."
#: Kubernetes' scalar wrapper types and what they are in a structural schema.
INT_OR_STRING = ("io.k8s.apimachinery.pkg.util.intstr.IntOrString", "io.k8s.apimachinery.pkg.api.resource.Quantity")
#: Keywords a structural schema keeps (the rest: descriptions, x-kubernetes-patch-*, $schema, ...).
KEPT = ("type", "format", "enum", "required", "minimum", "maximum", "minItems", "maxItems", "pattern")
MARKER = re.compile(r"^(?P<indent> *)# generated: (?P<type>\S+)$")


@cache
def definitions(version: str = KUBERNETES) -> dict[str, Any]:
    import kubernetes_validate  # a development dependency: the operator image never runs this

    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{version}-local-strict"
    return json.loads((root / "_definitions.json").read_text())["$defs"]


def structural(node: dict[str, Any], version: str = KUBERNETES) -> dict[str, Any]:
    """``node`` (a JSON schema of kubernetes-validate) as a structural OpenAPI v3 schema, references resolved."""
    ref = node.get("$ref")
    if ref is not None:
        name = ref.rsplit("/", 1)[1]
        if name in INT_OR_STRING:
            return {"x-kubernetes-int-or-string": True}
        return structural(definitions(version)[name], version)
    if "oneOf" in node or "anyOf" in node:  # Kubernetes' int-or-string spelt out
        return {"x-kubernetes-int-or-string": True}
    out: dict[str, Any] = {k: node[k] for k in KEPT if k in node}
    if isinstance(out.get("type"), list):  # ["string", "null"]: optional, which a CRD says by leaving it out
        out["type"] = next(t for t in out["type"] if t != "null")
    if "properties" in node:
        out["properties"] = {k: structural(v, version) for k, v in sorted(node["properties"].items())}
        out.setdefault("type", "object")
    if isinstance(node.get("items"), dict):
        out["items"] = structural(node["items"], version)
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = structural(node["additionalProperties"], version)
    return out


def of_type(spelling: str, version: str = KUBERNETES) -> dict[str, Any]:
    """``Affinity`` -> the structural schema of io.k8s.api.core.v1.Affinity; ``[Toleration]`` -> a list of them."""
    if spelling.startswith("[") and spelling.endswith("]"):
        return {"type": "array", "items": of_type(spelling[1:-1], version)}
    return structural(definitions(version)[PREFIX + spelling], version)


def regenerate(text: str) -> str:
    """``text`` (a CRD's YAML) with every generated block rebuilt from its marker line."""
    lines, out, index = text.splitlines(), [], 0
    while index < len(lines):
        line = lines[index]
        out.append(line)
        index += 1
        marker = MARKER.match(line)
        if marker is None:
            continue
        indent = marker["indent"]
        while index < len(lines) and lines[index].strip() != "# end generated":
            index += 1  # the old block
        block = yaml.safe_dump(of_type(marker["type"]), sort_keys=False, width=120)
        out.extend(indent + row for row in block.splitlines())
        out.append(indent + "# end generated")
        index += 1
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else Path(__file__).resolve().parents[2] / "crds" / "autellixengine.yaml"
    path.write_text(regenerate(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
