"""Kubernetes NetworkPolicy semantics (networking.k8s.io/v1), evaluated over manifests: who may reach whom.

The clusters the tests run on do not enforce NetworkPolicies, so the chart's policies are checked here,
against the pods the chart and the operator make. What is modelled, as the API documents it:

* a pod is isolated for ingress (egress) when a policy in its namespace selects it (``spec.podSelector``;
  ``{}`` selects every pod) and has ``Ingress`` (``Egress``) in ``policyTypes``; ``policyTypes`` left out
  means ``Ingress``, plus ``Egress`` when the policy has ``egress`` rules. A pod no policy isolates takes
  (sends) everything;
* an isolated pod takes a connection when some rule of some policy selecting it admits both the peer and
  the port; policies add up, never subtract;
* a rule with no ``from`` (``to``), or an empty one, admits every peer; with no ``ports``, every port;
* a peer with only ``podSelector`` means pods of the policy's own namespace; with only
  ``namespaceSelector``, every pod of the matching namespaces; with both, the matching pods in the matching
  namespaces. Namespaces carry ``kubernetes.io/metadata.name`` (set by the API server) and their own labels;
* selectors: ``matchLabels`` and ``matchExpressions`` (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``), ANDed;
* ports: a number, a named container port of the destination pod, ``endPort`` ranges; protocol TCP unless
  said otherwise.

Not modelled: ``ipBlock`` peers (never match a pod here) and traffic from nodes (kubelet probes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Pod:
    """A pod as the policies see it: where it runs, its labels, its named ports."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    ports: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, name: str, namespace: str, template: Mapping[str, Any]) -> Pod:
        """The pod a Deployment's or Job's pod template makes."""
        ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"]
                 for p in c.get("ports", []) if "name" in p}
        return cls(name, namespace, dict(template["metadata"].get("labels", {})), ports)


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector: every matchLabels pair and every matchExpressions requirement."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for requirement in selector.get("matchExpressions") or []:
        key, op, values = requirement["key"], requirement["operator"], requirement.get("values") or []
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            raise ValueError(f"unknown selector operator {op!r}")
        if not ok:
            return False
    return True


def policy_types(policy: Mapping[str, Any]) -> list[str]:
    spec = policy["spec"]
    if spec.get("policyTypes"):
        return list(spec["policyTypes"])
    return ["Ingress", *(["Egress"] if "egress" in spec else [])]


class Network:
    """NetworkPolicies of a cluster and the labels of its namespaces."""

    def __init__(self, manifests: Iterable[Mapping[str, Any]],
                 namespace_labels: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.policies = [m for m in manifests if m.get("kind") == "NetworkPolicy"]
        self.namespace_labels = namespace_labels or {}

    def labels_of_namespace(self, namespace: str) -> dict[str, str]:
        return {**self.namespace_labels.get(namespace, {}), NAME_LABEL: namespace}

    def peer_admits(self, peer: Mapping[str, Any], policy_namespace: str, pod: Pod) -> bool:
        if "ipBlock" in peer:
            return False
        if "namespaceSelector" in peer:
            in_namespaces = selects(peer["namespaceSelector"], self.labels_of_namespace(pod.namespace))
        else:
            in_namespaces = pod.namespace == policy_namespace
        return in_namespaces and ("podSelector" not in peer or selects(peer["podSelector"], pod.labels))

    @staticmethod
    def port_admits(ports: list[Mapping[str, Any]] | None, destination: Pod, port: int, protocol: str) -> bool:
        if not ports:
            return True
        for entry in ports:
            if entry.get("protocol", "TCP") != protocol:
                continue
            if "port" not in entry:
                return True
            first = entry["port"] if isinstance(entry["port"], int) else destination.ports.get(entry["port"])
            if first is not None and first <= port <= entry.get("endPort", first):
                return True
        return False

    def _admitted(self, subject: Pod, direction: str, other: Pod, destination: Pod, port: int,
                  protocol: str) -> bool:
        """Whether ``subject``'s policies of one direction let the connection through (``other``: the peer)."""
        rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
        isolating = [p for p in self.policies if p["metadata"].get("namespace") == subject.namespace
                     and direction in policy_types(p) and selects(p["spec"].get("podSelector") or {}, subject.labels)]
        if not isolating:
            return True
        return any((not rule.get(peers_key) or any(self.peer_admits(peer, subject.namespace, other)
                                                   for peer in rule[peers_key]))
                   and self.port_admits(rule.get("ports"), destination, port, protocol)
                   for policy in isolating for rule in policy["spec"].get(rules_key) or [])

    def allows(self, source: Pod, destination: Pod, port: int, protocol: str = "TCP") -> bool:
        """A connection from ``source`` to ``destination``'s ``port``: its egress, then the destination's ingress."""
        return (self._admitted(source, "Egress", destination, destination, port, protocol)
                and self._admitted(destination, "Ingress", source, destination, port, protocol))

    def selecting(self, pod: Pod) -> list[str]:
        """The names of the policies that isolate ``pod`` for ingress."""
        return [p["metadata"]["name"] for p in self.policies if p["metadata"].get("namespace") == pod.namespace
                and "Ingress" in policy_types(p) and selects(p["spec"].get("podSelector") or {}, pod.labels)]
