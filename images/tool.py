"""The container tool behind `make images`: podman (default) or docker, as argument lists, and where records go.

Both take the same `build`, `import`, `create`, `cp`, `run`, `image inspect` arguments; podman
runs as root with its default overlay storage. Every command goes through :func:`run`, which
prints it first, so a `--dry-run` shows exactly what a build or a smoke run would do.
"""

from __future__ import annotations

import json
import resource
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The Debian base every image builds FROM (images/base.py makes it; nothing is pulled).
BASE_IMAGE = "localhost/autellix-base:bookworm"
#: Build times, written by images/build.py and read by images/smoke.py (ignored by git).
BUILD_RECORD = ROOT / "images" / "out" / "builds.json"
TOOLS = ("podman", "docker")


@dataclass(frozen=True)
class Tool:
    """One container tool's command lines; ``dry_run`` prints them without running anything."""

    name: str = "podman"
    dry_run: bool = False

    def __post_init__(self) -> None:
        if self.name not in TOOLS:
            raise SystemExit(f"--builder: expected one of {', '.join(TOOLS)}, got {self.name!r}")

    def command(self, *args: str) -> list[str]:
        """``podman ARGS`` with the runtime that works in a sandbox, or ``docker ARGS``."""
        if self.name == "podman" and shutil.which("runc"):
            # Debian 12's crun (1.8) refuses hosts with cgroup v1 and v2 mounted side by side; runc runs there.
            return ["podman", "--runtime", "runc", *args]
        return [self.name, *args]

    def limits(self) -> list[str]:
        """Process limits for a container that a host without CAP_SYS_RESOURCE (a sandbox) can grant:
        podman asks for more than the caller has and fails. The caller's open-file limit, and at most
        8,192 processes (podman starts the runtime under conmon, itself held to 32,768 here)."""
        if self.name != "podman":
            return []
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
        nproc = [min(limit, 8192) if limit != resource.RLIM_INFINITY else 8192
                 for limit in resource.getrlimit(resource.RLIMIT_NPROC)]
        return [f"--ulimit=nofile={nofile[0]}:{nofile[1]}", f"--ulimit=nproc={nproc[0]}:{nproc[1]}"]

    def build(self, dockerfile: Path, tag: str, *, build_args: dict[str, str],
              contexts: dict[str, Path], secrets: dict[str, Path], no_cache: bool = False) -> list[str]:
        # RUN steps use the host's network (pip reaches PyPI; no bridge or firewall needed) and, with podman,
        # chroot isolation: no OCI runtime, no cgroups, no raised limits, so it builds in a sandbox too.
        isolation = ["--isolation", "chroot"] if self.name == "podman" else []
        cmd = self.command("build", "--network", "host", *isolation, "-f", str(dockerfile), "-t", tag)
        cmd += [f"--build-arg={key}={value}" for key, value in build_args.items()]
        cmd += [f"--build-context={key}={path}" for key, path in contexts.items()]
        cmd += [f"--secret=id={key},src={path}" for key, path in secrets.items()]
        cmd += ["--no-cache"] if no_cache else []
        return [*cmd, str(ROOT)]

    def import_rootfs(self, tarball: Path, tag: str, changes: list[str]) -> list[str]:
        return self.command("import", *(f"--change={change}" for change in changes), str(tarball), tag)

    def has_image(self, tag: str) -> bool:
        done = subprocess.run(self.command("image", "inspect", tag), capture_output=True, text=True)
        return done.returncode == 0

    def image_size(self, tag: str) -> int:
        """Bytes of the image's layers, as the tool reports them."""
        out = subprocess.run(self.command("image", "inspect", "--format", "{{.Size}}", tag),
                             capture_output=True, text=True, check=True).stdout
        return int(out.strip())

    def copy_out(self, tag: str, path: str, dest: Path) -> None:
        """Copy one file out of an image without running it (create, cp, rm). The file is replaced whole
        (copied beside it, then renamed): a reader at the same moment (the test suite beside an image build)
        sees the old file or the new one."""
        name = f"autellix-copy-{dest.stem}"
        partial = dest.with_name(dest.name + ".partial")
        self.run(self.command("create", "--name", name, tag))
        try:
            self.run(self.command("cp", f"{name}:{path}", str(partial)))
            if not self.dry_run:
                partial.replace(dest)
        finally:
            self.run(self.command("rm", name), capture_output=True)
            partial.unlink(missing_ok=True)

    def run(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return run(cmd, dry_run=self.dry_run, **kwargs)


def run(cmd: list[str], *, dry_run: bool = False, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Print ``cmd`` (a shell-quoted line), then run it unless ``dry_run``; a failure exits."""
    print("+ " + shlex.join(cmd), file=sys.stderr, flush=True)
    if dry_run:
        return subprocess.CompletedProcess(cmd, 0, "", "")
    done = subprocess.run(cmd, text=True, **kwargs)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {shlex.join(cmd)}")
    return done


def read_record() -> dict[str, dict[str, Any]]:
    return json.loads(BUILD_RECORD.read_text()) if BUILD_RECORD.is_file() else {}


def write_record(record: dict[str, dict[str, Any]]) -> None:
    BUILD_RECORD.parent.mkdir(parents=True, exist_ok=True)
    partial = BUILD_RECORD.with_name(BUILD_RECORD.name + ".partial")
    partial.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    partial.replace(BUILD_RECORD)  # whole: several builds may record at once
