"""Run each built image and check that it serves, then record sizes, build times and what each check saw.

    python3 images/smoke.py [--builder podman|docker] [--registry R] [--version V] [--only engine,gateway,operator]

* engine: the tiny model on the CPU (random weights, ``--load-format dummy``, nothing from a hub):
  ``/health`` 200, the scheduler plugin's ``/autellix/v1/info``, one chat completion 200;
* gateway: ``/health`` 200, then a chat completion through it to the engine container;
* operator: a real control plane (``../shared/kubernetes/control-plane up``, or ``--kubeconfig``), the
  CRDs and the operator's Lease applied with kubectl; the container, on the host's network with a
  kubeconfig mounted, must take the Lease and turn an AutellixEngine into its Deployment.

Every container runs as the image's own user (10001) on the host's network with free ports; each
image is also checked for having no C compiler. The results replace the table between the markers in
docs/images.md. Containers are removed at the end, their logs kept in images/out/. Needs root (podman)
or docker, and kubectl (``$AUTELLIX_KUBECTL`` or on PATH) for the operator; minutes, so never in CI.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tool import ROOT, Tool, read_record

DOC = ROOT / "docs" / "images.md"
BEGIN, END = "<!-- smoke results: images/smoke.py writes this table -->", "<!-- end of smoke results -->"
OUT = ROOT / "images" / "out"
CONTROL_PLANE = ROOT.parent / "shared" / "kubernetes" / "control-plane"
NAMESPACE, LEASE, OPERATOR_POD = "default", "autellix-operator", "autellix-smoke-operator"
IMAGES = ("engine", "gateway", "operator")
COMPILERS = ("cc", "gcc", "c++", "g++", "clang", "nvcc")


class SmokeFailed(RuntimeError):
    """One image's check did not see what it should (the message says what it saw instead)."""


@dataclass
class Result:
    image: str
    tag: str
    saw: list[str] = field(default_factory=list)
    failure: str | None = None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def http(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> tuple[int, Any]:
    """Status and parsed JSON (or text) of one request; a refused connection is status 0."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def wait_for(check: Callable[[], Any], timeout: float, what: str, alive: Callable[[], bool]) -> float:
    """Seconds until ``check()`` is truthy; fails on timeout or as soon as the container is gone."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        if not alive():
            raise SmokeFailed(f"the container exited while waiting for {what}")
        time.sleep(1)
    raise SmokeFailed(f"no {what} within {timeout:.0f} s")


class Containers:
    """Containers started by this run: detached, host network, the sandbox-safe limits; logs kept, then removed."""

    def __init__(self, tool: Tool) -> None:
        self.tool, self.names = tool, []

    def start(self, name: str, tag: str, args: list[str], options: list[str] = ()) -> None:
        subprocess.run(self.tool.command("rm", "-f", name), capture_output=True)
        self.names.append(name)
        self.tool.run(self.tool.command("run", "-d", "--name", name, "--network", "host", *self.tool.limits(),
                                        *options, tag, *args), capture_output=True)

    def alive(self, name: str) -> bool:
        done = subprocess.run(self.tool.command("inspect", "--format", "{{.State.Running}}", name),
                              capture_output=True, text=True)
        return done.stdout.strip() == "true"

    def logs(self, name: str) -> str:
        done = subprocess.run(self.tool.command("logs", name), capture_output=True, text=True)
        return done.stdout + done.stderr

    def remove_all(self) -> None:
        OUT.mkdir(parents=True, exist_ok=True)
        for name in self.names:
            (OUT / f"{name}.log").write_text(self.logs(name))
            subprocess.run(self.tool.command("rm", "-f", name), capture_output=True)


def image_facts(tool: Tool, tag: str) -> list[str]:
    """The image's user, and that it holds no compiler."""
    user = subprocess.run(tool.command("image", "inspect", "--format", "{{.Config.User}}", tag),
                          capture_output=True, text=True, check=True).stdout.strip()
    if not user.isdigit() or user == "0":
        raise SmokeFailed(f"runs as {user!r}, not a numeric non-root user")
    found = subprocess.run(tool.command("run", "--rm", *tool.limits(), "--entrypoint", "sh", tag, "-c",
                                        "command -v " + " ".join(COMPILERS) + " || true"),
                           capture_output=True, text=True, check=True).stdout.split()
    if found:
        raise SmokeFailed(f"compilers in the final stage: {', '.join(found)}")
    return [f"USER {user}; no {'/'.join(COMPILERS)} in the image"]


def chat(base_url: str, model: str) -> tuple[int, Any]:
    return http("POST", f"{base_url}/v1/chat/completions",
                {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "Say hi."}]})


def smoke_engine(containers: Containers, tag: str, port: int) -> list[str]:
    name, url = "autellix-smoke-engine", f"http://127.0.0.1:{port}"
    # vLLM's processes share memory through /dev/shm (the operator gives engine pods an emptyDir for it).
    containers.start(name, tag, ["--port", str(port)], ["--shm-size", "1g"])
    seconds = wait_for(lambda: http("GET", f"{url}/health", timeout=5)[0] == 200, 900, "/health 200",
                       lambda: containers.alive(name))
    status, info = http("GET", f"{url}/autellix/v1/info")
    if status != 200:
        raise SmokeFailed(f"/autellix/v1/info answered {status}: the scheduler plugin is not live")
    _, models = http("GET", f"{url}/v1/models")
    model = models["data"][0]["id"]
    status, answer = chat(url, model)
    if status != 200:
        raise SmokeFailed(f"chat completion answered {status}: {answer}")
    plugin = "Using custom scheduler class autellix.engine.scheduler.AutellixScheduler" in containers.logs(name)
    return [f"/health 200 after {seconds:.0f} s (tiny model, --load-format dummy, --enforce-eager)",
            f"/autellix/v1/info 200 (scheduler {info['scheduler']}, policy {info['config']['policy']}, "
            f"beta {info['config']['beta']})",
            f"the log {'names' if plugin else 'does not name'} AutellixScheduler as vLLM's scheduler class",
            f"chat completion on `{model}` 200, {answer['usage']['completion_tokens']} tokens"]


def smoke_gateway(containers: Containers, tag: str, port: int, engine_port: int | None) -> list[str]:
    name, url = "autellix-smoke-gateway", f"http://127.0.0.1:{port}"
    # Without an engine container, a port nothing listens on: the gateway still serves /health.
    engines = ["--engine", f"http://127.0.0.1:{engine_port or 9}"]
    containers.start(name, tag, ["--host", "127.0.0.1", "--port", str(port), *engines])
    seconds = wait_for(lambda: http("GET", f"{url}/health", timeout=5)[0] == 200, 120, "/health 200",
                       lambda: containers.alive(name))
    saw = [f"/health 200 after {seconds:.0f} s"]
    if engine_port is None:
        return [*saw, "no engine container to call through (engine not smoke-run)"]
    wait_for(lambda: http("GET", f"{url}/ready", timeout=5)[0] == 200, 60, "/ready 200 (engine healthy)",
             lambda: containers.alive(name))
    _, models = http("GET", f"{url}/v1/models")
    model = models["data"][0]["id"]
    status, answer = chat(url, model)
    if status != 200:
        raise SmokeFailed(f"chat completion through the gateway answered {status}: {answer}")
    return [*saw, f"chat completion through it to the engine container 200, "
                  f"{answer['usage']['completion_tokens']} tokens"]


@contextmanager
def control_plane(kubeconfig: Path | None) -> Iterator[Path]:
    """The given kubeconfig, or a control plane brought up (and down again) in a scratch folder."""
    if kubeconfig is not None:
        yield kubeconfig
        return
    if not CONTROL_PLANE.is_file():
        raise SmokeFailed(f"no control plane at {CONTROL_PLANE} (pass --kubeconfig)")
    with tempfile.TemporaryDirectory(prefix="autellix-smoke-cp-", dir="/var/tmp") as folder:
        done = subprocess.run([str(CONTROL_PLANE), "up", folder], capture_output=True, text=True, timeout=300)
        try:
            found = re.search(r"KUBECONFIG=(\S+)", done.stdout)
            if done.returncode != 0 or not found:
                raise SmokeFailed(f"control-plane up failed: {done.stdout[-500:]}{done.stderr[-500:]}")
            yield Path(found.group(1))
        finally:
            subprocess.run([str(CONTROL_PLANE), "down", folder], capture_output=True, timeout=120)


def smoke_operator(containers: Containers, tag: str, kubectl: str, kubeconfig: Path | None) -> list[str]:
    name = "autellix-smoke-operator"
    with control_plane(kubeconfig) as admin, tempfile.TemporaryDirectory(prefix="autellix-smoke-kube-") as mount:
        def k(*args: str, stdin: str | None = None) -> str:
            done = subprocess.run([kubectl, "--kubeconfig", str(admin), *args], input=stdin, capture_output=True,
                                  text=True, timeout=120)
            if done.returncode != 0:
                raise SmokeFailed(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
            return done.stdout

        version = json.loads(k("version", "-o", "json"))["serverVersion"]["gitVersion"]
        k("apply", "-f", str(ROOT / "crds" / "autellixengine.yaml"), "-f", str(ROOT / "crds" / "agentprogram.yaml"))
        k("wait", "--for", "condition=established", "--timeout=60s", "crd/autellixengines.autellix.ai",
          "crd/agentprograms.autellix.ai")
        # The chart makes the Lease; the operator only takes and renews it.
        k("apply", "-f", "-", stdin=json.dumps({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                                  "metadata": {"name": LEASE, "namespace": NAMESPACE}}))
        # One file the container's user can read, certificates inlined (the admin one names files by path).
        config = Path(mount) / "config"
        config.write_text(k("config", "view", "--raw", "--flatten", "--minify"))
        Path(mount).chmod(0o755)
        config.chmod(0o644)
        containers.start(name, tag, ["--gateway-url", "http://127.0.0.1:9", "--leader-lease", f"{NAMESPACE}/{LEASE}"],
                         ["-v", f"{mount}:/kube:ro", "-e", "KUBECONFIG=/kube/config", "-e", f"POD_NAME={OPERATOR_POD}"])

        def holder() -> bool:
            return k("get", "lease", LEASE, "-n", NAMESPACE, "-o", "jsonpath={.spec.holderIdentity}") == OPERATOR_POD

        seconds = wait_for(holder, 120, f"Lease {NAMESPACE}/{LEASE} held by {OPERATOR_POD}",
                           lambda: containers.alive(name))
        engine = {"apiVersion": "autellix.ai/v1alpha1", "kind": "AutellixEngine",
                  "metadata": {"name": "smoke", "namespace": NAMESPACE},
                  "spec": {"model": {"name": "tiny", "source": {"hub": "example/tiny"}}}}
        k("apply", "-f", "-", stdin=json.dumps(engine))

        def deployment() -> str:
            done = subprocess.run([kubectl, "--kubeconfig", str(admin), "get", "deployment", "smoke", "-n",
                                   NAMESPACE, "-o", "jsonpath={.spec.template.spec.containers[0].image}"],
                                  capture_output=True, text=True, timeout=60)
            return done.stdout if done.returncode == 0 else ""

        made = wait_for(deployment, 120, "the AutellixEngine's Deployment", lambda: containers.alive(name))
        log = containers.logs(name)
        held = next((line[line.index("leader election"):] for line in log.splitlines() if "holds Lease" in line),
                    "(no such log line)")
        return [f"control plane {version}; Lease {NAMESPACE}/{LEASE} held by {OPERATOR_POD} after {seconds:.0f} s",
                f"its log: `{held}`",
                f"AutellixEngine `smoke` -> Deployment `smoke` running `{deployment()}`, "
                f"{made:.1f} s after it was applied"]


def megabytes(size: int) -> str:
    return f"{size / 1e6:,.0f} MB"


def table(tool: Tool, results: list[Result]) -> str:
    """A row per image (size, build time, pass or fail), then what each check saw."""
    builds = read_record()
    rows = ["| image | size | build | smoke run |", "|---|---|---|---|"]
    for result in results:
        build = builds.get(result.tag)
        took = f"{build['seconds']:.0f} s{'' if build.get('from_nothing') else ' (cached layers allowed)'}" \
            if build else "not recorded"
        size = megabytes(tool.image_size(result.tag)) if tool.has_image(result.tag) else "not built"
        rows.append(f"| `{result.tag}` | {size} | {took} | {'FAILED' if result.failure else 'passed'} |")
    seen = [f"* {result.image}: " + "; ".join(result.saw + ([f"**FAILED**: {result.failure}"] if result.failure
                                                           else [])) for result in results]
    return "\n".join(rows) + "\n\nWhat each check saw:\n\n" + "\n".join(seen)


def record(tool: Tool, results: list[Result], command: str) -> None:
    """Replace the table between the markers of docs/images.md."""
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    body = (f"\nRecorded {datetime.date.today().isoformat()} by `{command}` with {tool.name}; sizes as "
            f"`{tool.name} image inspect` reports them; build times (wall) of the last `make images`, "
            f"from nothing (`IMAGE_BUILD_FLAGS=--no-cache`) unless marked.\n\n{table(tool, results)}\n")
    DOC.write_text(text[:start] + body + text[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builder", default="podman", help="podman (default) or docker")
    parser.add_argument("--registry", default="ghcr.io/autellix")
    parser.add_argument("--version", default="0.1.0")
    parser.add_argument("--only", default=",".join(IMAGES), help="images to smoke-run (default: all three)")
    parser.add_argument("--kubeconfig", type=Path, help="a running cluster (default: bring up ../shared's)")
    parser.add_argument("--kubectl", default=os.environ.get("AUTELLIX_KUBECTL") or shutil.which("kubectl"))
    parser.add_argument("--no-record", action="store_true", help=f"leave {DOC.relative_to(ROOT)} as it is")
    args = parser.parse_args(argv)
    tool = Tool(args.builder)
    only = [name for name in IMAGES if name in args.only.split(",")]
    results = [Result(name, f"{args.registry}/autellix-{name}:{args.version}") for name in only]
    containers = Containers(tool)
    engine_port: int | None = None
    try:
        for result in results:
            try:
                result.saw += image_facts(tool, result.tag)
                if result.image == "engine":
                    port = free_port()
                    result.saw += smoke_engine(containers, result.tag, port)
                    engine_port = port
                elif result.image == "gateway":
                    result.saw += smoke_gateway(containers, result.tag, free_port(), engine_port)
                else:
                    if not args.kubectl:
                        raise SmokeFailed("no kubectl (on PATH or $AUTELLIX_KUBECTL)")
                    result.saw += smoke_operator(containers, result.tag, args.kubectl, args.kubeconfig)
            except (SmokeFailed, subprocess.SubprocessError, SystemExit, KeyError, IndexError, TypeError) as error:
                result.failure = str(error) or type(error).__name__
            print(f"{result.tag}: {'FAILED: ' + result.failure if result.failure else 'ok'}", flush=True)
            for line in result.saw:
                print(f"  {line}", flush=True)
    finally:
        containers.remove_all()
    if not args.no_record:
        with suppress(ValueError):  # a page without the markers is left alone
            record(tool, results, "python3 images/smoke.py" + (f" --only {args.only}" if args.only != ",".join(
                IMAGES) else ""))
    return 1 if any(result.failure for result in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
