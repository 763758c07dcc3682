"""Build and load the CUDA gather/scatter in ``csrc/`` (a torch extension).

* :func:`build` / :func:`load`: where torch has CUDA and a toolkit is
  installed (the engine image), compile with ``torch.utils.cpp_extension.load``
  (cached under ``~/.cache/torch_extensions``) and import; the swap connector
  then uses it instead of the torch path.
* :func:`compile_objects` + :func:`link_module`: compile the kernel with
  ``nvcc`` and the binding with the host compiler against the installed torch's
  headers, link against torch's libraries and the toolkit's ``libcudart``:
  what CI does on a machine with a CUDA toolkit but the CPU build of torch.
  ``torch.utils.cpp_extension`` cannot do that there: it looks for CUDA only
  when torch was built with it, and the CPU wheel's ``c10/cuda`` headers are
  incomplete (no generated ``c10/cuda/impl/cuda_cmake_macros.h``, no
  ``libc10_cuda.so``). So the kernel (``kv_swap.cu``) uses no torch header at
  all and the binding (``kv_swap.cpp``) only torch's CPU-side ones.

``python -m autellix.engine.kv_kernel check`` runs the compile check;
``python -m autellix.engine.kv_kernel build`` builds and loads it (CUDA torch).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

NAME = "autellix_kv_swap"
SOURCES = ("kv_swap.cpp", "kv_swap.cu")


def csrc_dir() -> Path:
    """``$AUTELLIX_CSRC``, else ``csrc/`` of the source checkout this module is in."""
    configured = os.environ.get("AUTELLIX_CSRC")
    path = Path(configured) if configured else Path(__file__).resolve().parents[3] / "csrc"
    if not all((path / name).is_file() for name in SOURCES):
        raise FileNotFoundError(f"KV swap kernel sources {SOURCES} not found in {path} (set AUTELLIX_CSRC)")
    return path


def cuda_home() -> Path | None:
    """The CUDA toolkit: ``$CUDA_HOME``/``$CUDA_PATH``, /usr/local/cuda, or where ``nvcc`` on PATH lives
    (``nvcc`` itself may be a wrapper script elsewhere)."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(str(Path(on_path).resolve().parent.parent))
    for candidate in candidates:
        if candidate and (Path(candidate) / "bin" / "nvcc").is_file():
            return Path(candidate)
    return None


def find_nvcc() -> str | None:
    home = cuda_home()
    return str(home / "bin" / "nvcc") if home else None


def build(verbose: bool = False) -> object:
    """Compile (cached by torch) and import the extension. Needs a CUDA build of
    torch and a toolkit, not a GPU (an image build: set ``TORCH_CUDA_ARCH_LIST``)."""
    import torch

    if torch.version.cuda is None:
        raise RuntimeError("this torch is built without CUDA: the KV swap kernel needs a CUDA build of torch")
    if find_nvcc() is None:
        raise FileNotFoundError("nvcc not found (CUDA_HOME, PATH, /usr/local/cuda/bin)")
    from torch.utils.cpp_extension import load as load_extension

    src = csrc_dir()
    return load_extension(name=NAME, sources=[str(src / s) for s in SOURCES], extra_cflags=["-O3"],
                          extra_cuda_cflags=["-O3"], verbose=verbose)


def load(verbose: bool = False) -> object:
    """The extension, for a process that will launch it (needs a GPU)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available to torch: the KV swap kernel needs a GPU")
    return build(verbose)


def compile_objects(out_dir: Path, nvcc: str | None = None, arch: str = "sm_90") -> list[Path]:
    """Compile (no link) both sources against this torch's headers; returns the objects."""
    from torch.utils.cpp_extension import include_paths

    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (CUDA_HOME, PATH, /usr/local/cuda/bin)")
    cuda_include = Path(nvcc).parent.parent / "include"
    includes = [*include_paths(), sysconfig.get_paths()["include"]]
    import torch

    defines = [f"-DTORCH_EXTENSION_NAME={NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    torch_flags = [*(f"-I{p}" for p in includes), *defines, "-std=c++20", "-O3"]
    out_dir.mkdir(parents=True, exist_ok=True)
    src = csrc_dir()
    objects = [out_dir / "kv_swap.cu.o", out_dir / "kv_swap.cpp.o"]
    commands = [
        # the kernel is plain CUDA; the binding needs torch's (CPU-side) headers only
        [nvcc, "-c", str(src / "kv_swap.cu"), "-o", str(objects[0]), f"-arch={arch}", "-O3", "-std=c++17",
         "-Xcompiler", "-fPIC", f"-I{cuda_include}"],
        [os.environ.get("CXX", "c++"), "-c", str(src / "kv_swap.cpp"), "-o", str(objects[1]), "-fPIC", *torch_flags],
    ]
    for command in commands:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"compile failed: {' '.join(command[:4])} ...\n{result.stderr[-4000:]}")
    return objects


def link_module(objects: list[Path], out_dir: Path, nvcc: str | None = None) -> Path:
    """Link the objects into an importable extension against this torch's libraries
    and the toolkit's CUDA runtime. With the CPU build of torch it still imports
    (its checks run; launching needs a GPU): what CI can verify without one."""
    import torch

    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (CUDA_HOME, PATH, /usr/local/cuda/bin)")
    torch_lib = Path(torch.__file__).parent / "lib"
    cuda_lib = Path(nvcc).parent.parent / "lib64"
    target = out_dir / f"{NAME}{sysconfig.get_config_var('EXT_SUFFIX')}"
    command = [os.environ.get("CXX", "c++"), "-shared", "-o", str(target), *map(str, objects),
               f"-L{torch_lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", f"-L{cuda_lib}", "-lcudart",
               f"-Wl,-rpath,{torch_lib}", f"-Wl,-rpath,{cuda_lib}"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"link failed:\n{result.stderr[-4000:]}")
    return target


def import_module(path: Path) -> object:
    import importlib.util

    import torch  # noqa: F401  (the extension needs torch's libraries loaded)

    spec = importlib.util.spec_from_file_location(NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["check"]:
        out = Path(args[1]) if len(args) > 1 else Path("build/csrc")
        objects = compile_objects(out)
        for obj in objects:
            print(f"compiled {obj} ({obj.stat().st_size} bytes)")
        module = import_module(link_module(objects, out))
        print(f"linked and imported {module}")
        return 0
    if args[:1] == ["build"]:
        module = build(verbose=True)
        print(f"built and loaded {module}")
        return 0
    print("usage: python -m autellix.engine.kv_kernel check [OUT_DIR] | build", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
