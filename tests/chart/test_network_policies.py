"""Who may reach what under the chart's NetworkPolicies: the rendered policies evaluated (network_policy.py)
over the pods the chart renders and the pods the operator makes (engines, pickers, AgentProgram Jobs), plus
pods that are no part of the release: a stranger elsewhere, a neighbour in the release's namespace,
impostors carrying the operator's labels outside the served namespaces, tenants, Prometheus and a
Gateway's proxies (the peers of test_chart's value sets)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from autellix.kube.manifests import PickerSettings, engine_deployment, engine_endpoint_picker, program_job
from autellix.kube.spec import parse_engine, parse_program
from tests.chart import test_chart as chart
from tests.chart.network_policy import Network, Pod, selects
from tests.chart.test_chart import NAMESPACE, container

helm = chart.helm
render = chart.render
Render = Callable[[str], list[dict[str, Any]]]

ADMIN_PORT = 9000
#: Namespaces outside the release and their labels (the API server adds kubernetes.io/metadata.name).
NAMESPACE_LABELS = {"apps-a": {"team": "a"}, "elsewhere": {}, "monitoring": {}, "envoy-gateway-system": {}}
ENGINE_SPEC = parse_engine({"model": {"name": "m", "source": {"hub": "org/m"}}, "resources": {"gpus": 1}})


def served_namespaces(docs: list[dict[str, Any]]) -> list[str]:
    return [a.split("=", 1)[1] for a in container(docs, "operator")["args"] if a.startswith("--namespace=")]


def cluster(docs: list[dict[str, Any]]) -> tuple[Network, dict[str, Pod]]:
    """The policies, and the pods by role: the release's own (by component), ``engine@NS``,
    ``picker@NS`` and ``program@NS`` in each namespace the operator serves, and the outsiders."""
    pods: dict[str, Pod] = {}
    for doc in docs:
        if doc["kind"] == "Deployment":
            component = doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
            pods[component] = Pod.of(doc["metadata"]["name"], doc["metadata"]["namespace"], doc["spec"]["template"])
    served = served_namespaces(docs) if "operator" in pods else []
    pickers = "--epp" in container(docs, "operator")["args"] if served else False
    picker = PickerSettings(image="autellix-gateway")
    program = parse_program({"image": "python:3.12-slim", "model": "m"})
    for namespace in served:
        engine = engine_deployment("llama", namespace, "uid", ENGINE_SPEC)["spec"]["template"]
        pods[f"engine@{namespace}"] = Pod.of("llama", namespace, engine)
        if pickers:
            made = engine_endpoint_picker("llama", namespace, "uid", ENGINE_SPEC, picker)["spec"]["template"]
            pods[f"picker@{namespace}"] = Pod.of("llama-epp", namespace, made)
        job = program_job("react", namespace, "uid", program, gateway="http://gw", session_id="s")
        pods[f"program@{namespace}"] = Pod.of("react", namespace, job["spec"]["template"])
    if served:
        # the operator's labels, outside the namespaces it serves: anyone may put them on a pod there
        if pickers:
            pods["impostor-picker"] = Pod("fake-epp", "elsewhere", pods[f"picker@{served[0]}"].labels)
        pods["impostor-program"] = Pod("fake-job", "elsewhere", pods[f"program@{served[0]}"].labels)
    pods["stranger"] = Pod("stranger", "elsewhere", {"app": "web"})
    pods["neighbour"] = Pod("neighbour", NAMESPACE, {"app": "web"})
    pods["tenant"] = Pod("tenant", "apps-a", {"app": "agent"})
    pods["prometheus"] = Pod("prometheus-0", "monitoring", {"app.kubernetes.io/name": "prometheus"})
    pods["proxy"] = Pod("envoy-gw", "envoy-gateway-system", {"app.kubernetes.io/component": "proxy"})
    return Network(docs, NAMESPACE_LABELS), pods


def endpoint(pods: dict[str, Pod]) -> Pod:
    """The OpenAI endpoint's pods: Envoy with the mesh, else the gateway."""
    return pods.get("envoy", pods["gateway"])


# ---- the evaluator itself: what it says on policies whose answer is known ---------------------------------
def test_the_evaluator_follows_the_networkpolicy_semantics() -> None:
    web = Pod("web", "a", {"app": "web"}, {"http": 8080})
    db = Pod("db", "a", {"app": "db", "tier": "data"}, {"sql": 5432})
    other = Pod("x", "b", {"app": "web"})

    def policy(spec: dict[str, Any], namespace: str = "a") -> dict[str, Any]:
        return {"kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": namespace}, "spec": spec}

    assert Network([]).allows(web, db, 5432)  # no policy: everything
    deny_all = policy({"podSelector": {}, "policyTypes": ["Ingress"]})
    assert not Network([deny_all]).allows(web, db, 5432) and Network([deny_all]).selecting(db) == ["p"]
    same_namespace = policy({"podSelector": {"matchLabels": {"app": "db"}},
                             "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                                          "ports": [{"port": "sql"}]}]})
    network = Network([same_namespace])
    assert network.allows(web, db, 5432) and not network.allows(web, db, 5433)  # a named port
    assert not network.allows(other, db, 5432)  # podSelector alone: the policy's namespace only
    assert network.allows(db, web, 8080)  # web is selected by no policy
    both = policy({"podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["data"]}]},
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"env": "prod"}},
                                          "podSelector": {"matchLabels": {"app": "web"}}}]}]})
    labelled = Network([both], {"b": {"env": "prod"}})
    assert labelled.allows(other, db, 1) and not labelled.allows(web, db, 1)  # both selectors: AND
    either = policy({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"env": "prod"}}},
                                                              {"podSelector": {"matchLabels": {"app": "web"}}}]}]})
    assert Network([either], {"b": {"env": "prod"}}).allows(web, db, 1)  # two peers: OR
    open_rule = policy({"podSelector": {}, "ingress": [{"ports": [{"port": 5000, "endPort": 5500}]}]})
    assert Network([open_rule]).allows(other, db, 5432) and not Network([open_rule]).allows(other, db, 6000)
    assert not Network([open_rule]).allows(other, db, 5432, "UDP")
    # policies add up: one more that admits web opens nothing it did not name
    assert Network([deny_all, same_namespace]).allows(web, db, 5432)
    assert not Network([deny_all, same_namespace]).allows(other, db, 5432)
    egress = policy({"podSelector": {"matchLabels": {"app": "web"}}, "egress": [{"ports": [{"port": 53}]}]})
    assert policy_types_of(egress) == ["Ingress", "Egress"]
    assert not Network([egress]).allows(web, db, 5432) and Network([egress]).allows(web, db, 53)
    assert selects({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, web.labels)
    assert not selects({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}, web.labels)


def policy_types_of(policy: dict[str, Any]) -> list[str]:
    from tests.chart.network_policy import policy_types
    return policy_types(policy)


# ---- the OpenAI endpoint ------------------------------------------------------------------------------------
@pytest.mark.parametrize("value_set", ["mesh", "epp", "single-gateway-tenants"])
def test_tenants_from_limits_every_way_to_the_api(render: Render, value_set: str) -> None:
    """With networkPolicy.tenantsFrom, only those peers, the AgentProgram Jobs of the served namespaces and
    the operator reach the endpoint, and no way around it leads to the gateways: Envoy is limited as the
    gateway's tenant port is."""
    network, pods = cluster(render(value_set))
    gateway, front = pods["gateway"], endpoint(pods)
    for listening in ("envoy", "gateway", "operator", "store"):
        if listening in pods:
            assert network.selecting(pods[listening]), f"no policy selects the {listening} pods"
    for target in [front] if front is gateway else [front, gateway]:
        assert network.allows(pods["tenant"], target, 8000), target.name
        assert network.allows(pods["operator"], target, 8000), target.name
        for namespace in served_namespaces(render(value_set)):
            assert network.allows(pods[f"program@{namespace}"], target, 8000), (namespace, target.name)
        for outsider in ("stranger", "neighbour", "impostor-program", "proxy"):
            if outsider in pods:
                assert not network.allows(pods[outsider], target, 8000), (outsider, target.name)
    if "envoy" in pods:
        assert network.allows(pods["envoy"], gateway, 8000)  # Envoy in front of the gateways
    assert network.allows(pods["operator"], gateway, ADMIN_PORT)
    for who in ("tenant", "stranger", "envoy", f"program@{NAMESPACE}"):
        if who in pods:
            assert not network.allows(pods[who], gateway, ADMIN_PORT), who


@pytest.mark.parametrize("value_set", ["defaults", "epp-open", "single-gateway"])
def test_without_tenants_from_anyone_reaches_the_api_and_nothing_else(render: Render, value_set: str) -> None:
    network, pods = cluster(render(value_set))
    stranger = pods["stranger"]
    assert network.allows(stranger, endpoint(pods), 8000) and network.allows(stranger, pods["gateway"], 8000)
    assert not network.allows(stranger, pods["gateway"], ADMIN_PORT)
    assert network.allows(pods["operator"], pods["gateway"], ADMIN_PORT)
    for private, port in (("store", 6379), ("operator", 18000), (f"engine@{NAMESPACE}", 8000)):
        if private in pods:
            assert not network.allows(stranger, pods[private], port), private
            assert not network.allows(pods["neighbour"], pods[private], port), private
    if "envoy" in pods:
        assert network.allows(pods["envoy"], pods["operator"], 18000)  # xDS, from Envoy only
        assert not network.allows(pods["gateway"], pods["operator"], 18000)


# ---- the program store --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value_set", ["defaults", "mesh", "epp", "epp-open"])
def test_only_the_releases_gateways_and_served_pickers_reach_the_store(render: Render, value_set: str) -> None:
    docs = render(value_set)
    network, pods = cluster(docs)
    store = pods["store"]
    assert network.allows(pods["gateway"], store, 6379)
    pickers = [name for name in pods if name.startswith("picker@")]
    for picker in pickers:
        assert network.allows(pods[picker], store, 6379), picker
    assert bool(pickers) == (value_set.startswith("epp"))
    others = [name for name in pods if name not in ("gateway", "store") and not name.startswith("picker@")]
    assert {"stranger", "neighbour", "envoy", "operator", "tenant", "proxy"} <= set(others)
    for other in others:
        assert not network.allows(pods[other], store, 6379), other


# ---- the pickers and the engines ------------------------------------------------------------------------------
@pytest.mark.parametrize("value_set", ["epp", "epp-open"])
def test_the_gateways_proxies_reach_pickers_and_engines_and_pickers_their_engines(render: Render,
                                                                                  value_set: str) -> None:
    docs = render(value_set)
    network, pods = cluster(docs)
    served = served_namespaces(docs)
    assert len(served) > 1
    for namespace in served:
        picker, engine = pods[f"picker@{namespace}"], pods[f"engine@{namespace}"]
        assert network.allows(pods["proxy"], picker, 9002) and network.allows(pods["proxy"], engine, 8000)
        assert network.allows(pods["gateway"], engine, 8000)
        assert network.allows(picker, engine, 8000), "the picker probes its engines' /health and /metrics"
        for outsider in ("stranger", "neighbour", "tenant", "impostor-picker", f"program@{namespace}"):
            assert not network.allows(pods[outsider], picker, 9002), (outsider, namespace)
            assert not network.allows(pods[outsider], engine, 8000), (outsider, namespace)


def test_metrics_from_names_the_scrapers_of_pickers_engines_and_gateways(render: Render) -> None:
    """networkPolicy.metricsFrom: Prometheus scrapes the pickers' 9090, the engines' and the gateway's /metrics
    (the gateway's port being limited by tenantsFrom); nobody else reaches the pickers' metrics."""
    docs = render("epp")
    network, pods = cluster(docs)
    prometheus = pods["prometheus"]
    assert network.allows(prometheus, pods["gateway"], 8000)
    for namespace in served_namespaces(docs):
        assert network.allows(prometheus, pods[f"picker@{namespace}"], 9090)
        assert network.allows(prometheus, pods[f"engine@{namespace}"], 8000)
        assert not network.allows(pods["stranger"], pods[f"picker@{namespace}"], 9090)
        assert not network.allows(prometheus, pods[f"picker@{namespace}"], 9002)  # not the ext_proc port
    assert not network.allows(prometheus, pods["store"], 6379)
    assert not network.allows(prometheus, pods["gateway"], ADMIN_PORT)


def test_without_metrics_from_the_pickers_metrics_are_open_and_the_engines_closed(render: Render) -> None:
    """[] = anyone on the pickers' metrics port (it serves only /metrics, /health, /ready), as the template says;
    the engines' port takes calls too, so an empty metricsFrom adds nobody there."""
    docs = render("epp-open")
    network, pods = cluster(docs)
    for namespace in served_namespaces(docs):
        assert network.allows(pods["stranger"], pods[f"picker@{namespace}"], 9090)
        assert network.allows(pods["prometheus"], pods[f"picker@{namespace}"], 9090)
        assert not network.allows(pods["prometheus"], pods[f"engine@{namespace}"], 8000)
