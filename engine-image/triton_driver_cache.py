"""In the CUDA engine image's build stage: put Triton's CUDA driver helper, compiled, into Triton's cache.

    /opt/autellix/bin/python triton_driver_cache.py --cache DIR

Triton compiles one C file of its own (``backends/nvidia/driver.c``, its ``cuda_utils`` module) with a
C compiler the first time a process uses the GPU through it, and vLLM does on every start (its Triton
kernels, torch.compile's). The image's final stage has no C compiler, so that compile is done here, in
the build stage, through Triton's own ``compile_module_from_src``: it stores the module in the cache
under a key made of the source and the platform, so the engine finds it there and compiles nothing.
It links ``libcuda.so.1``, the driver, which a GPU node's container runtime mounts; here it links
against a stub of that name with empty functions, so loading it in the build stage fails, as
expected. Checked afterwards, through Triton's own lookup with its compile
step replaced by a failure: an engine's first use finds the module in the cache; and it links
``libcuda.so.1`` with nothing else unresolved. Standard library and Triton only.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType


def stub_libcuda(folder: Path, driver_source: str) -> Path:
    """A shared library named ``libcuda.so.1`` defining every ``cu*`` name ``driver.c`` mentions, as
    empty functions: enough for the linker to record the dependency (a linker that drops unused
    libraries would drop an empty stub), not to run."""
    names = sorted(set(re.findall(r"\b(cu[A-Z]\w*)\b", driver_source)))
    source = folder / "stub.c"
    source.write_text("".join(f"void {name}(void) {{}}\n" for name in names))
    stub = folder / "libcuda.so.1"
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub),
                    str(source)], check=True)
    return stub


def cache_hit(source: str, driver: ModuleType) -> str | None:
    """Where Triton finds cuda_utils when the engine starts (the driver in its real place, no compiler),
    found by Triton's own lookup: its build and load steps replaced, the path it would load, or None
    when it would have to compile."""
    from triton.runtime import build

    class Compiles(Exception):
        pass

    def no_compiler(*args: object, **kwargs: object) -> str:
        raise Compiles

    saved = build._build, build._load_module_from_path
    build._build, build._load_module_from_path = no_compiler, lambda name, path: path
    try:
        return build.compile_module_from_src(src=source, name="cuda_utils",
                                             library_dirs=[driver.libdevice_dir, "/usr/lib/x86_64-linux-gnu"],
                                             include_dirs=driver.include_dirs, libraries=driver.libraries)
    except Compiles:
        return None
    finally:
        build._build, build._load_module_from_path = saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="the TRITON_CACHE_DIR the engine runs with")
    args = parser.parse_args(argv)
    os.environ["TRITON_CACHE_DIR"] = str(args.cache)
    import triton.backends.nvidia

    source = (Path(triton.backends.nvidia.__file__).parent / "driver.c").read_text()
    with tempfile.TemporaryDirectory(prefix="libcuda-stub-") as scratch:
        os.environ["TRITON_LIBCUDA_PATH"] = str(stub_libcuda(Path(scratch), source).parent)
        from triton.backends.nvidia import driver
        from triton.runtime.build import compile_module_from_src

        try:  # the arguments CudaUtils passes
            compile_module_from_src(src=source, name="cuda_utils", library_dirs=driver.library_dirs(),
                                    include_dirs=driver.include_dirs, libraries=driver.libraries)
        except ImportError as error:  # stored before it is loaded; the stub is gone by then
            print(f"cuda_utils compiled; loading it without a driver failed, as expected ({error})")
    cached = cache_hit(source, driver)
    if cached is None:
        print(f"Triton would compile cuda_utils again: it is not in {args.cache} under the key it looks up",
              file=sys.stderr)
        return 1
    linked = {line.split()[0]: line.strip() for line in subprocess.run(
        ["ldd", cached], capture_output=True, text=True, check=True).stdout.splitlines() if "=>" in line}
    unresolved = [name for name, line in linked.items() if "not found" in line]
    print(f"Triton's cuda_utils cached at {cached}; links {' '.join(sorted(linked))}; "
          f"unresolved here: {' '.join(unresolved) or 'none'}")
    if "libcuda.so.1" not in linked or set(unresolved) - {"libcuda.so.1"}:
        print("expected it to link libcuda.so.1 (the driver, mounted at run time) and nothing unresolved beside it",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
