"""What the operator may do in the Kubernetes API: every verb its code (and kopf for it) uses, and no other.

The chart's operator roles (charts/autellix/templates/operator-rbac.yaml) grant
exactly these rules; ``tests/chart`` compares the two, ``tests/kube`` holds them
to the requests the operators make in the emulated cluster (a request not
granted here, or a rule here no request needed, fails), and ``tests/cluster``
reads them back from a real API server (``kubectl auth can-i --list`` as the
operator's service account). Whatever writes (workloads, pods, status) is
granted by a Role in each namespace the operator serves, never cluster-wide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: Where a rule is granted: ``served`` by a Role in each namespace the operator serves (the release's and
#: ``operator.namespaces``), ``cluster`` cluster-wide (reading only), ``release`` in the release's namespace.
Scope = Literal["served", "cluster", "release"]


@dataclass(frozen=True)
class Rule:
    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    scope: Scope
    why: str
    #: Granted on the one object of its kind the chart makes (``resourceNames``), not on the kind.
    chart_object: bool = False


OPERATOR_RULES: tuple[Rule, ...] = (
    Rule("autellix.ai", ("autellixengines",), ("get", "list", "watch", "patch"), "served",
         "kopf watches engines and keeps its progress in annotations; a child's event reads its engine; "
         "the autoscaler patches spec.replicas"),
    Rule("autellix.ai", ("agentprograms",), ("list", "watch", "patch"), "served",
         "kopf watches programs, keeps its progress in annotations and drops the finalizer older versions "
         "set; the programs' pass lists them"),
    Rule("autellix.ai", ("autellixengines/status", "agentprograms/status"), ("patch",), "served",
         "status: replicas, selector, load, conditions; the session's numbers"),
    Rule("autellix.ai", ("autellixengines/finalizers", "agentprograms/finalizers"), ("update",), "served",
         "children carry blockOwnerDeletion owner references, which the API server allows only to those "
         "who may update the owner's finalizers"),
    Rule("apps", ("deployments",), ("get", "list", "watch", "create", "patch"), "served",
         "an engine's Deployment: applied, watched for drift"),
    Rule("", ("services",), ("get", "list", "watch", "create", "patch"), "served",
         "an engine's Service (what the gateway discovers): applied, watched for drift"),
    Rule("policy", ("poddisruptionbudgets",), ("get", "list", "watch", "create", "patch"), "served",
         "an engine's PodDisruptionBudget: applied, watched for drift"),
    Rule("inference.networking.k8s.io", ("inferencepools",), ("get", "create", "patch"), "served",
         "an engine's InferencePool, with --inference-pool"),
    Rule("batch", ("jobs",), ("get", "create"), "served",
         "a program's Job: created once, read for its outcome (garbage collection deletes it)"),
    Rule("", ("pods",), ("patch",), "served",
         "the autoscaler's pod-deletion-cost annotation on the engine it drained"),
    Rule("discovery.k8s.io", ("endpointslices",), ("list",), "served",
         "which pod is behind which engine URL (the gateway's own view)"),
    Rule("autoscaling", ("horizontalpodautoscalers",), ("list",), "served",
         "an HPA (or KEDA's) targeting an engine: the built-in autoscaler stands down"),
    Rule("", ("events",), ("create",), "served",
         "Events on the engines and programs (kubectl describe): what the operator did and why it failed"),
    Rule("apiextensions.k8s.io", ("customresourcedefinitions",), ("list", "watch"), "cluster",
         "kopf notices its resources' CRDs appearing and going (serving the whole cluster); with "
         "--inference-pool, the InferencePool CRD's arrival"),
    Rule("coordination.k8s.io", ("leases",), ("get", "update"), "release",
         "leader election between the operator's replicas, on the Lease the chart makes (and removes on "
         "uninstall); the operator cannot make another", chart_object=True),
    Rule("discovery.k8s.io", ("endpointslices",), ("list", "watch"), "release",
         "the xDS control plane (--xds-port): the gateway pods behind the gateway Service, for Envoy"),
)


def granted(rules: tuple[Rule, ...] = OPERATOR_RULES) -> set[tuple[str, str, str]]:
    """(verb, group, resource) of every rule."""
    return {(verb, rule.group, resource) for rule in rules for resource in rule.resources for verb in rule.verbs}
