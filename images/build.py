"""Build one image from its Dockerfile on the bootstrapped Debian base, time it, and write its lock.

    python3 images/build.py [--builder podman|docker] [--relock] [--wheels DIR] DOCKERFILE TAG

The build installs exactly the packages of ``images/locks/<image>.txt``, then the project with
that file as pip's ``--constraint``; afterwards the image's own ``pip freeze`` is copied back over
the file, so the lock always says what the last build installed (``--relock``: build without the lock, e.g. after a
dependency in pyproject.toml changed). A Dockerfile that copies from the ``wheels`` build context
(the engine's) gets one: a folder with this machine's torch CPU wheel (``--wheels``, default
/opt/wheels) when it has one, else an empty folder, and the build then takes torch from PyTorch's
CPU index. pip in the build trusts the host's CA bundle (a build secret, in no layer). The build's
wall time goes to images/out/builds.json for images/smoke.py's table (``--no-cache``: from nothing).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path

from tool import BASE_IMAGE, ROOT, Tool, read_record, write_record

LOCKS = ROOT / "images" / "locks"
UNPINNED = LOCKS / "unpinned.txt"
TORCH_WHEEL = "torch-2.13.0+cpu-*.whl"


def lock_path(dockerfile: Path) -> Path:
    """``images/locks/<name>.txt``, the name being the Dockerfile's folder (``engine-image`` -> ``engine``),
    then its suffix if it has one (``engine-image/Dockerfile.cuda`` -> ``engine-cuda``)."""
    name = dockerfile.resolve().parent.name.removesuffix("-image")
    suffix = dockerfile.name.removeprefix("Dockerfile").lstrip(".")
    return LOCKS / (f"{name}-{suffix}.txt" if suffix else f"{name}.txt")


def wheel_context(wheels: Path, scratch: Path) -> tuple[Path, dict[str, str]]:
    """The ``wheels`` build context and the build arguments that go with it."""
    found = sorted(wheels.glob(TORCH_WHEEL)) if wheels.is_dir() else []
    context = scratch / "wheels"
    context.mkdir()
    if not found:
        return context, {}  # the Dockerfile's default TORCH_INDEX: PyTorch's CPU index
    try:
        os.link(found[-1], context / found[-1].name)
    except OSError:  # another file system
        shutil.copy2(found[-1], context / found[-1].name)
    return context, {"TORCH_INDEX": ""}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dockerfile", type=Path, help="e.g. gateway/Dockerfile")
    parser.add_argument("tag", help="e.g. ghcr.io/autellix/autellix-gateway:0.1.0")
    parser.add_argument("--builder", default="podman", help="podman (default) or docker")
    parser.add_argument("--relock", action="store_true", help="build without the lock and write it anew")
    parser.add_argument("--wheels", type=Path, default=Path("/opt/wheels"),
                        help=f"folder searched for {TORCH_WHEEL} (default /opt/wheels)")
    parser.add_argument("--ca-bundle", type=Path, default=Path("/etc/ssl/certs/ca-certificates.crt"),
                        help="CA certificates pip trusts in the build (default: the host's, Debian's path)")
    parser.add_argument("--no-cache", action="store_true", help="reuse no cached layer (a build from nothing)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run none")
    args = parser.parse_args(argv)
    tool = Tool(args.builder, dry_run=args.dry_run)
    dockerfile = (ROOT / args.dockerfile).resolve()
    if not dockerfile.is_file():
        raise SystemExit(f"no Dockerfile at {dockerfile}")
    if not args.dry_run and not tool.has_image(BASE_IMAGE):
        raise SystemExit(f"no {BASE_IMAGE}: run `python3 images/base.py` first (make images does)")
    lock = lock_path(dockerfile)
    pinned = lock.is_file() and not args.relock
    build_args = {"LOCK": str((lock if pinned else UNPINNED).relative_to(ROOT))}
    with tempfile.TemporaryDirectory(prefix="autellix-build-", dir="/var/tmp") as scratch:
        contexts = {}
        if "--from=wheels" in dockerfile.read_text():
            contexts["wheels"], torch_args = wheel_context(args.wheels, Path(scratch))
            build_args |= torch_args
        cmd = tool.build(dockerfile, args.tag, build_args=build_args, contexts=contexts,
                         secrets={"ca-bundle": args.ca_bundle}, no_cache=args.no_cache)
        started = time.monotonic()
        tool.run(cmd)
        seconds = time.monotonic() - started
    tool.copy_out(args.tag, "/opt/autellix/requirements.lock", lock)
    if args.dry_run:
        return 0
    record = read_record()
    record[args.tag] = {"dockerfile": str(dockerfile.relative_to(ROOT)), "seconds": round(seconds, 1),
                        "date": datetime.date.today().isoformat(), "builder": args.builder,
                        "pinned": pinned, "from_nothing": args.no_cache, "command": shlex.join(cmd)}
    write_record(record)
    print(f"{args.tag}: built in {seconds:.0f} s ({'pinned by' if pinned else 'relocked into'} {lock.name})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
