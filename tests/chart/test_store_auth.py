"""The chart's program store asks for a password: a generated Secret (or yours), the Valkey started with
``--requirepass`` from it, the gateways' (and the pickers') store URL carrying it by the kubelet's ``$(VAR)``
expansion, no manifest holding it; the rendered server and URL tried on a real ``valkey-server`` and a real
gateway process, whose output and answers never show the password."""

from __future__ import annotations

import base64
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import test_chart as chart
from tests.chart.test_chart import NAMESPACE, RELEASE, container, one

helm = chart.helm
render = chart.render
Render = Callable[[str], list[dict[str, Any]]]
SECRET = f"{RELEASE}-autellix-store-password"
STORE_HOST = f"{RELEASE}-autellix-store.{NAMESPACE}.svc:6379"
#: What a password may hold to go into a URL as it is (RFC 3986 unreserved characters).
URL_SAFE = re.compile(r"^[A-Za-z0-9._~-]+$")


def secrets(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, str]]:
    """(namespace, name) -> decoded data of every rendered Secret."""
    return {(d["metadata"]["namespace"], d["metadata"]["name"]): {k: base64.b64decode(v).decode()
                                                                  for k, v in d["data"].items()}
            for d in docs if d["kind"] == "Secret"}


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion (of container args, and of an env value by the variables before it)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)


def resolve_env(entries: list[dict[str, Any]], data: dict[tuple[str, str], dict[str, str]],
                namespace: str = NAMESPACE) -> dict[str, str]:
    """A container's environment as the kubelet gives it: in order, each value expanded by the ones before."""
    env: dict[str, str] = {}
    for entry in entries:
        if "value" in entry:
            env[entry["name"]] = expand(entry["value"], env)
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = data[(namespace, ref["name"])][ref["key"]]
    return env


def test_the_charts_store_asks_for_a_generated_password(render: Render) -> None:
    docs = render("defaults")
    data = secrets(docs)
    secret = one(docs, "Secret", "-store-password")
    assert (secret["metadata"]["namespace"], secret["metadata"]["name"]) == (NAMESPACE, SECRET)
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    password = data[(NAMESPACE, SECRET)]["password"]
    assert list(data[(NAMESPACE, SECRET)]) == ["password"] and len(password) >= 32 and URL_SAFE.match(password)
    # the server: --requirepass $(VAR), VAR from the Secret
    valkey = container(docs, "store")
    assert valkey["command"] == ["valkey-server"]
    args = valkey["args"]
    reference = args[args.index("--requirepass") + 1]
    variable = re.fullmatch(r"\$\(([A-Z_]+)\)", reference)
    assert variable, reference
    [entry] = [e for e in valkey["env"] if e["name"] == variable[1]]
    assert entry["valueFrom"] == {"secretKeyRef": {"name": SECRET, "key": "password"}}
    assert expand(reference, resolve_env(valkey["env"], data)) == password
    # probes that need no password: a TCP connect, not a PING
    for probe in ("readinessProbe", "livenessProbe"):
        assert valkey[probe]["tcpSocket"] == {"port": "redis"}
    # the gateways: the password first, then the URL built from it
    gateway_env = container(docs, "gateway")["env"]
    names = [e["name"] for e in gateway_env]
    assert names.index("AUTELLIX_STORE_PASSWORD") < names.index("AUTELLIX_STORE")
    assert gateway_env[names.index("AUTELLIX_STORE_PASSWORD")]["valueFrom"] == {
        "secretKeyRef": {"name": SECRET, "key": "password"}}
    assert gateway_env[names.index("AUTELLIX_STORE")]["value"] == \
        f"redis://:$(AUTELLIX_STORE_PASSWORD)@{STORE_HOST}/0"
    url = urllib.parse.urlsplit(resolve_env(gateway_env, data)["AUTELLIX_STORE"])
    assert (url.password, url.hostname, url.port, url.path) == (password, STORE_HOST.split(":")[0], 6379, "/0")
    # no manifest but the Secret holds it
    others = [d for d in docs if (d["kind"], d["metadata"]["name"]) != ("Secret", SECRET)]
    assert password not in yaml.safe_dump_all(others)


def test_with_the_picker_the_password_is_copied_into_every_served_namespace(render: Render) -> None:
    docs = render("epp")
    data = secrets(docs)
    copies = {ns: values for (ns, name), values in data.items() if name == SECRET}
    assert set(copies) == {NAMESPACE, "team-a"}
    assert copies[NAMESPACE] == copies["team-a"] and list(copies["team-a"]) == ["password"]
    args = container(docs, "operator")["args"]
    assert f"--epp-store-password-secret={SECRET}" in args
    assert f"--epp-store-url=redis://{STORE_HOST}/0" in args  # the address only: the pickers add the password
    assert copies[NAMESPACE]["password"] not in yaml.safe_dump(one(docs, "Deployment", "-operator"))
    # the picker the operator makes with those flags, in a served namespace: its URL carries that namespace's copy
    from autellix.kube.manifests import PickerSettings, engine_endpoint_picker
    from autellix.kube.spec import parse_engine

    flags = dict(a.removeprefix("--").split("=", 1) for a in args if a.startswith("--epp-store"))
    picker = PickerSettings(image="autellix-gateway", store_url=flags["epp-store-url"],
                            store_password_secret=flags["epp-store-password-secret"])
    engine = parse_engine({"model": {"name": "m", "source": {"hub": "org/m"}}})
    made = engine_endpoint_picker("llama", "team-a", "uid", engine, picker)
    env = resolve_env(made["spec"]["template"]["spec"]["containers"][0]["env"], data, namespace="team-a")
    url = urllib.parse.urlsplit(env["AUTELLIX_STORE"])
    assert (url.password, f"{url.hostname}:{url.port}") == (copies["team-a"]["password"], STORE_HOST)
    assert copies["team-a"]["password"] not in yaml.safe_dump(made)
    # without the picker, the password stays in the release's namespace
    assert {ns for (ns, name) in secrets(render("autoscaling")) if name == SECRET} == {NAMESPACE}


def test_a_store_password_secret_of_ones_own(render: Render) -> None:
    """auth.storePassword.existingSecret: nothing generated; the server, the gateways and the pickers read yours
    (created by you in the release's namespace and the served ones)."""
    docs = render("epp-open")
    assert not [name for (_, name) in secrets(docs) if name.endswith("-store-password")]
    ref = {"secretKeyRef": {"name": "store-pass", "key": "password"}}
    assert [e["valueFrom"] for e in container(docs, "store")["env"]] == [ref]
    assert {"name": "AUTELLIX_STORE_PASSWORD", "valueFrom": ref} in container(docs, "gateway")["env"]
    assert "--epp-store-password-secret=store-pass" in container(docs, "operator")["args"]


@pytest.mark.parametrize("value_set", ["mesh-external-store", "single-gateway"])
def test_no_password_of_the_charts_without_its_store(render: Render, value_set: str) -> None:
    docs = render(value_set)
    assert not [name for (_, name) in secrets(docs) if name.endswith("-store-password")]
    assert "AUTELLIX_STORE_PASSWORD" not in {e["name"] for e in container(docs, "gateway")["env"]}
    assert not [a for a in container(docs, "operator")["args"] if a.startswith("--epp-store")]


# ---- the rendered server and URL, for real ------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status), answer.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, repr(exc)


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def rendered_store(render: Render, tmp_path: Path) -> Iterator[tuple[str, int, dict[str, str]]]:
    """The chart's Valkey command and arguments (expanded as the kubelet does) run by a real valkey-server on a
    loopback port; yields the password, the port and the gateway's environment."""
    from autellix.mesh.local import StoreServerMissing, store_server_binary

    try:
        binary = store_server_binary()
    except StoreServerMissing as exc:
        pytest.skip(str(exc))
    docs = render("defaults")
    data = secrets(docs)
    valkey = container(docs, "store")
    args = [expand(a, resolve_env(valkey["env"], data)) for a in valkey["args"]]
    port = free_port()
    args[args.index("--port") + 1] = str(port)
    args[args.index("--dir") + 1] = str(tmp_path)  # the pod's /data volume
    log = (tmp_path / "valkey.log").open("wb")
    server = subprocess.Popen([binary, *args, "--bind", "127.0.0.1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, 10, "valkey-server to listen")
        yield data[(NAMESPACE, SECRET)]["password"], port, resolve_env(container(docs, "gateway")["env"], data)
    finally:
        server.terminate()
        server.wait(10)
        log.close()


def test_the_rendered_server_takes_the_rendered_url_and_refuses_anyone_without_it(
        rendered_store: tuple[str, int, dict[str, str]]) -> None:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    password, port, env = rendered_store
    url = env["AUTELLIX_STORE"].replace(STORE_HOST, f"127.0.0.1:{port}")
    with redis.Redis.from_url(url) as client:
        assert client.ping()
    once = Retry(NoBackoff(), 0)  # an authentication error is not retried
    with redis.Redis(host="127.0.0.1", port=port, retry=once) as anonymous, pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    with redis.Redis(host="127.0.0.1", port=port, password=password[::-1], retry=once) as wrong, \
            pytest.raises(redis.AuthenticationError):
        wrong.ping()


def test_the_gateway_never_shows_the_store_password(rendered_store: tuple[str, int, dict[str, str]],
                                                    tmp_path: Path) -> None:
    """A real gateway on the rendered URL: it uses the store, then loses it; neither its log nor its answers
    (tenants' and admin routes, metrics) show the password. A URL it refuses is named without it."""
    password, port, env = rendered_store
    url = env["AUTELLIX_STORE"].replace(STORE_HOST, f"127.0.0.1:{port}")
    http, admin = free_port(), free_port()
    log_path = tmp_path / "gateway.log"
    command = [sys.executable, "-m", "autellix", "gateway", "--host", "127.0.0.1", "--port", str(http),
               "--admin-port", str(admin), "--engine", "http://127.0.0.1:9"]
    with log_path.open("wb") as log:
        gateway = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "AUTELLIX_STORE": url, "HOME": str(tmp_path)})
    answers: list[str] = []
    try:
        base, admin_base = f"http://127.0.0.1:{http}", f"http://127.0.0.1:{admin}"
        wait_for(lambda: gateway.poll() is not None or "autellix_store_up 1.0" in get(f"{base}/metrics")[1], 60,
                 "the gateway to use the store")
        assert gateway.poll() is None, log_path.read_text()[-3000:]
        for route in (f"{base}/health", f"{base}/ready", f"{base}/metrics", f"{admin_base}/admin/engines",
                      f"{admin_base}/admin/calls", f"{admin_base}/admin/admission"):
            answers.append(get(route)[1])
        # the store goes away: the gateway logs it and serves on
        import redis

        with redis.Redis.from_url(url) as client:
            client.shutdown(nosave=True)
        wait_for(lambda: "autellix_store_up 0.0" in get(f"{base}/metrics")[1], 30, "the gateway to see it go")
        answers.append(get(f"{base}/metrics")[1])
    finally:
        gateway.terminate()
        gateway.wait(30)
    output = log_path.read_text(errors="replace")
    assert "out of reach" in output, output[-2000:]  # the log speaks of the store ...
    assert password not in output  # ... without its password
    assert not [a for a in answers if password in a]
    # a URL the gateway refuses: named in the error, its password not
    refused = subprocess.run(
        [*command, "--store", f"http://:{password}@store.example:6379/0"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": str(tmp_path)})
    assert refused.returncode != 0
    assert "redis://" in refused.stderr + refused.stdout and "store.example" in refused.stderr + refused.stdout
    assert password not in refused.stderr + refused.stdout
