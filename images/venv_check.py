"""Inside an image's build stage: fail unless the installed environment runs (and, asked, write its lock).

    /opt/autellix/bin/python /src/venv_check.py [--lock FILE] PACKAGE...

The environment runs when ``autellix --help`` does (every command module imports) and when every
module of each PACKAGE imports (the code the image runs, with its extras' dependencies). The lock
is ``pip freeze`` without the project itself (the Dockerfiles write it in their dependencies' stage,
images/build.py copies it back to images/locks/). Standard library only; run by the environment's
own Python.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path


def import_all(package: str) -> int:
    """Import ``package`` and every module below it; how many there were."""
    modules = [m.name for m in pkgutil.walk_packages(importlib.import_module(package).__path__, package + ".")]
    for name in modules:
        importlib.import_module(name)
    return len(modules) + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lock", type=Path, help="where pip freeze's output goes (default: not written)")
    parser.add_argument("packages", nargs="+", help="packages whose every module must import")
    args = parser.parse_args(argv)
    subprocess.run([sys.executable, "-m", "autellix", "--help"], check=True, stdout=subprocess.DEVNULL)
    for package in args.packages:
        print(f"{package}: {import_all(package)} modules import")
    if args.lock is not None:
        frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude", "autellix"], check=True,
                                capture_output=True, text=True).stdout
        args.lock.write_text(frozen)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
