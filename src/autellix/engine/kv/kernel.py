"""Build and load the CUDA gather/scatter in ``csrc/`` (a torch extension).

Where the kernel comes from, in the order :func:`load` tries:

1. a prebuilt extension: the file ``$AUTELLIX_KV_KERNEL`` names, else a module
   ``autellix_kv_swap`` importable from the environment (the CUDA engine image
   compiles one at build time, ``prebuild --install``, for several GPU
   generations, and has no compiler at run time);
2. otherwise a compile at run time (:func:`build`, ``torch.utils.cpp_extension.load``,
   cached under ``~/.cache/torch_extensions``): needs a CUDA build of torch and
   a toolkit.

The swap connector falls back to its torch path when neither works.

* :func:`compile_objects` + :func:`link_module`: compile the kernel with
  ``nvcc`` and the binding with the host compiler against the installed torch's
  headers, link against torch's libraries and a ``libcudart``. With the CPU
  build of torch (CI on a machine with a toolkit) that is the only way:
  ``torch.utils.cpp_extension`` looks for CUDA only when torch was built with
  it, and the CPU wheel's ``c10/cuda`` headers are incomplete (no generated
  ``c10/cuda/impl/cuda_cmake_macros.h``, no ``libc10_cuda.so``). So the kernel
  (``kv_swap.cu``) uses no torch header at all and the binding (``kv_swap.cpp``)
  only torch's CPU-side ones. :func:`prebuild` is the same two steps for a list
  of GPU architectures, linked against the ``libcudart`` torch itself loads.

``python -m autellix.engine.kv.kernel check`` runs the compile check;
``... prebuild --install`` builds, installs and verifies the prebuilt extension
(the image's build stage); ``... build`` compiles and loads it at run time
(CUDA torch); ``... where`` says which one :func:`load` would take.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

NAME = "autellix_kv_swap"
SOURCES = ("kv_swap.cpp", "kv_swap.cu")
#: A prebuilt extension's path; when set, :func:`load` takes that file or fails.
PREBUILT_ENV = "AUTELLIX_KV_KERNEL"
#: The GPU generations the image's prebuilt kernel carries machine code for (TORCH_CUDA_ARCH_LIST syntax):
#: sm_80 runs on every 8.x (A100, A10, A40, L4, L40S), sm_90 on H100/H200, sm_100 on B200/GB200/B300,
#: sm_120 on RTX PRO 6000; PTX of the last lets the driver compile it for later ones.
DEFAULT_ARCH_LIST = "8.0;9.0;10.0;12.0+PTX"
_ARCH = re.compile(r"(\d+)\.(\d)([af]?)(\+PTX)?")


def csrc_dir() -> Path:
    """``$AUTELLIX_CSRC``, else ``csrc/`` of the source checkout this module is in."""
    configured = os.environ.get("AUTELLIX_CSRC")
    path = Path(configured) if configured else Path(__file__).resolve().parents[4] / "csrc"
    if not all((path / name).is_file() for name in SOURCES):
        raise FileNotFoundError(f"KV swap kernel sources {SOURCES} not found in {path} (set AUTELLIX_CSRC)")
    return path


def cuda_home() -> Path | None:
    """The CUDA toolkit: ``$CUDA_HOME``/``$CUDA_PATH``, /usr/local/cuda, or where ``nvcc`` on PATH lives
    (``nvcc`` itself may be a wrapper script elsewhere). For a toolkit from NVIDIA's wheels, set
    ``CUDA_HOME`` to their ``nvidia/cu13`` folder."""
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


def toolkit_lib(home: Path) -> Path:
    """The toolkit's library folder: ``lib64`` in NVIDIA's installers, ``lib`` in its wheels."""
    return home / "lib64" if (home / "lib64").is_dir() else home / "lib"


@dataclass(frozen=True)
class Arch:
    """One entry of a TORCH_CUDA_ARCH_LIST: ``9.0`` -> sm_90; ``9.0a`` -> sm_90a; ``+PTX``: PTX too."""

    major: int
    minor: int
    variant: str = ""
    ptx: bool = False

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}{self.variant}"

    @property
    def compute(self) -> str:
        return f"compute_{self.major}{self.minor}{self.variant}"

    def gencode(self) -> str:
        codes = f"[{self.sm},{self.compute}]" if self.ptx else self.sm
        return f"-gencode=arch={self.compute},code={codes}"


def parse_arch_list(arch_list: str) -> list[Arch]:
    """TORCH_CUDA_ARCH_LIST syntax: entries like ``8.0``, ``9.0a``, ``12.0+PTX``, separated by
    ``;``, ``,`` or spaces."""
    archs = []
    for entry in re.split(r"[;,\s]+", arch_list.strip()):
        if not entry:
            continue
        match = _ARCH.fullmatch(entry)
        if match is None:
            raise ValueError(f"bad CUDA architecture {entry!r} in {arch_list!r} (expected e.g. 8.0, 9.0a, 12.0+PTX)")
        archs.append(Arch(int(match[1]), int(match[2]), match[3], match[4] is not None))
    if not archs:
        raise ValueError("empty CUDA architecture list")
    return archs


def compile_objects(out_dir: Path, nvcc: str | None = None, arch: str = "sm_90",
                    arch_list: str | None = None) -> list[Path]:
    """Compile (no link) both sources against this torch's headers; returns the objects.
    ``arch_list`` (TORCH_CUDA_ARCH_LIST syntax) replaces the single ``arch``."""
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
    targets = [a.gencode() for a in parse_arch_list(arch_list)] if arch_list else [f"-arch={arch}"]
    out_dir.mkdir(parents=True, exist_ok=True)
    src = csrc_dir()
    objects = [out_dir / "kv_swap.cu.o", out_dir / "kv_swap.cpp.o"]
    commands = [
        # the kernel is plain CUDA; the binding needs torch's (CPU-side) headers only
        [nvcc, "-c", str(src / "kv_swap.cu"), "-o", str(objects[0]), *targets, "-O3", "-std=c++17",
         "-Xcompiler", "-fPIC", f"-I{cuda_include}"],
        [os.environ.get("CXX", "c++"), "-c", str(src / "kv_swap.cpp"), "-o", str(objects[1]), "-fPIC", *torch_flags],
    ]
    for command in commands:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"compile failed: {' '.join(command[:4])} ...\n{result.stderr[-4000:]}")
    return objects


def torch_cudart() -> Path | None:
    """The ``libcudart`` a CUDA torch from PyPI loads (NVIDIA's runtime wheel beside it), if any."""
    import torch

    site = Path(torch.__file__).resolve().parents[1]
    found = sorted(site.glob("nvidia/*/lib/libcudart.so.*"))
    return found[-1] if found else None


def link_module(objects: list[Path], out_dir: Path, nvcc: str | None = None, cudart: Path | None = None) -> Path:
    """Link the objects into an importable extension against this torch's libraries and a CUDA
    runtime: ``cudart`` (a ``libcudart.so.N`` file) when given, else the toolkit's. With the CPU
    build of torch it still imports (its checks run; launching needs a GPU): what CI can verify
    without one."""
    import torch

    torch_lib = Path(torch.__file__).parent / "lib"
    if cudart is not None:
        runtime = [f"-L{cudart.parent}", f"-l:{cudart.name}", f"-Wl,-rpath,{cudart.parent}"]
    else:
        nvcc = nvcc or find_nvcc()
        if nvcc is None:
            raise FileNotFoundError("nvcc not found (CUDA_HOME, PATH, /usr/local/cuda/bin)")
        cuda_lib = toolkit_lib(Path(nvcc).parent.parent)
        # NVIDIA's wheels carry only the versioned file (libcudart.so.13), its installers the link too
        name = "cudart" if (cuda_lib / "libcudart.so").exists() else ":" + max(
            (p.name for p in cuda_lib.glob("libcudart.so.*")), default="libcudart.so")
        runtime = [f"-L{cuda_lib}", f"-l{name}", f"-Wl,-rpath,{cuda_lib}"]
    target = out_dir / f"{NAME}{sysconfig.get_config_var('EXT_SUFFIX')}"
    command = [os.environ.get("CXX", "c++"), "-shared", "-o", str(target), *map(str, objects),
               f"-L{torch_lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", *runtime,
               f"-Wl,-rpath,{torch_lib}"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"link failed:\n{result.stderr[-4000:]}")
    return target


def import_module(path: Path) -> ModuleType:
    import torch  # noqa: F401  (the extension needs torch's libraries loaded)

    spec = importlib.util.spec_from_file_location(NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prebuilt() -> ModuleType | None:
    """The prebuilt extension: ``$AUTELLIX_KV_KERNEL``'s file (which must then exist), else an
    importable ``autellix_kv_swap``; None when there is neither."""
    configured = os.environ.get(PREBUILT_ENV)
    if configured:
        path = Path(configured)
        if not path.is_file():
            raise FileNotFoundError(f"{PREBUILT_ENV}={configured}: no such file")
        return import_module(path)
    if importlib.util.find_spec(NAME) is None:
        return None
    import torch  # noqa: F401

    return importlib.import_module(NAME)


def build(verbose: bool = False) -> object:
    """Compile (cached by torch) and import the extension. Needs a CUDA build of
    torch and a toolkit, not a GPU (set ``TORCH_CUDA_ARCH_LIST`` where there is none)."""
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
    """The extension, for a process that will launch it (needs a GPU): the prebuilt one when
    there is one, else compiled now."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available to torch: the KV swap kernel needs a GPU")
    module = prebuilt()
    if module is not None:
        log.info("KV swap kernel: prebuilt %s", module.__file__)
        return module
    module = build(verbose)
    log.info("KV swap kernel: compiled at run time (%s)", getattr(module, "__file__", NAME))
    return module


def find_cuobjdump() -> str | None:
    """``cuobjdump``: the toolkit's, on PATH, or the one Triton's wheel carries."""
    home = cuda_home()
    if home and (home / "bin" / "cuobjdump").is_file():
        return str(home / "bin" / "cuobjdump")
    if shutil.which("cuobjdump"):
        return shutil.which("cuobjdump")
    spec = importlib.util.find_spec("triton")
    if spec and spec.origin:
        bundled = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if bundled.is_file():
            return str(bundled)
    return None


def embedded_code(path: Path, cuobjdump: str) -> tuple[list[str], list[str]]:
    """The GPU machine code (``sm_XY``) and PTX (``compute_XY``... as ``sm_XY``) in an extension,
    as ``cuobjdump --list-elf`` / ``--list-ptx`` name them."""
    def listed(flag: str) -> list[str]:
        out = subprocess.run([cuobjdump, flag, str(path)], capture_output=True, text=True)
        if out.returncode != 0 and "does not contain" not in out.stderr + out.stdout:
            raise RuntimeError(f"{cuobjdump} {flag} failed: {out.stderr.strip()}")
        found = set(re.findall(r"\.(sm_\d+[af]?)\.(?:cubin|ptx)", out.stdout))
        return sorted(found, key=lambda sm: (int(re.sub(r"\D", "", sm)), sm))

    return listed("--list-elf"), listed("--list-ptx")


def binding_refuses_host_tensors(module: object) -> bool:
    """The binding runs (its checks refuse host tensors before any device is touched): what can be
    verified of a loaded extension without a GPU."""
    import torch

    ids, rows = torch.zeros(1, dtype=torch.int64), torch.zeros(1, 2, 1, 4)
    for fn in (module.gather_kv_blocks, module.scatter_kv_blocks):  # type: ignore[attr-defined]
        try:
            fn(torch.zeros(2, dtype=torch.int64), ids, rows, 4, 16, 0)
        except RuntimeError as error:
            if "CUDA tensor" not in str(error):
                raise
        else:
            return False
    return True


def prebuild(out_dir: Path, arch_list: str = DEFAULT_ARCH_LIST, nvcc: str | None = None,
             cuobjdump: str | None = None) -> dict[str, object]:
    """Compile the extension for ``arch_list`` into ``out_dir``, linked against torch's own
    ``libcudart``, then check it: it imports, the binding runs, and every architecture asked for
    has machine code in it (and PTX where ``+PTX`` asked for it). Returns what was checked."""
    archs = parse_arch_list(arch_list)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="autellix-kv-kernel-") as scratch:
        objects = compile_objects(Path(scratch), nvcc=nvcc, arch_list=arch_list)
        path = link_module(objects, out_dir, nvcc=nvcc, cudart=torch_cudart())
    report: dict[str, object] = {"path": str(path), "bytes": path.stat().st_size, "arch_list": arch_list}
    module = import_module(path)
    report["imports"] = True
    report["binding_runs"] = binding_refuses_host_tensors(module)
    cuobjdump = cuobjdump or find_cuobjdump()
    if cuobjdump is None:
        raise FileNotFoundError("cuobjdump not found: cannot list the machine code in the extension")
    elf, ptx = embedded_code(path, cuobjdump)
    report["elf"], report["ptx"], report["cuobjdump"] = elf, ptx, cuobjdump
    missing = [a.sm for a in archs if a.sm not in elf] + [a.compute for a in archs if a.ptx and a.sm not in ptx]
    if missing or not report["binding_runs"]:
        raise RuntimeError(f"prebuilt kernel incomplete: missing {missing}, binding runs: {report['binding_runs']}")
    return report


def where() -> str:
    """Which kernel :func:`load` would take, without loading it: for logs and the image's check."""
    configured = os.environ.get(PREBUILT_ENV)
    if configured:
        return f"prebuilt {configured} (${PREBUILT_ENV})"
    spec = importlib.util.find_spec(NAME)
    if spec is not None:
        return f"prebuilt {spec.origin}"
    return "none prebuilt: compiled at run time where torch has CUDA and a toolkit is installed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autellix.engine.kv.kernel",
                                     description="Build, check and locate the KV swap kernel (csrc/).")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="CI: nvcc + c++ against this torch's headers, link, import")
    check.add_argument("out", nargs="?", type=Path, default=Path("build/csrc"))
    sub.add_parser("build", help="CUDA torch + toolkit: torch.utils.cpp_extension.load (cached), then import")
    pre = sub.add_parser("prebuild", help="compile for several GPU generations, link against torch's "
                                          "libcudart, import, list its machine code")
    pre.add_argument("--arch-list", default=os.environ.get("TORCH_CUDA_ARCH_LIST") or DEFAULT_ARCH_LIST,
                     help=f"TORCH_CUDA_ARCH_LIST syntax (default: that variable, else {DEFAULT_ARCH_LIST!r})")
    dest = pre.add_mutually_exclusive_group(required=True)
    dest.add_argument("--out", type=Path, help="folder for the extension")
    dest.add_argument("--install", action="store_true",
                      help="into this interpreter's site-packages, importable as " + NAME)
    sub.add_parser("where", help="which kernel load() would take")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "check":
        objects = compile_objects(args.out)
        for obj in objects:
            print(f"compiled {obj} ({obj.stat().st_size} bytes)")
        module = import_module(link_module(objects, args.out))
        print(f"linked and imported {module}")
    elif args.command == "build":
        module = build(verbose=True)
        print(f"built and loaded {module}")
    elif args.command == "prebuild":
        out = Path(sysconfig.get_paths()["platlib"]) if args.install else args.out
        report = prebuild(out, args.arch_list)
        print(f"{report['path']} ({report['bytes']} bytes), built for {report['arch_list']!r}")
        print(f"imports: yes; binding runs (refuses host tensors): {'yes' if report['binding_runs'] else 'no'}")
        print(f"machine code (cuobjdump --list-elf): {' '.join(report['elf'])}"  # type: ignore[arg-type]
              f" [{report['cuobjdump']}]")
        print(f"PTX (cuobjdump --list-ptx): {' '.join(report['ptx']) or 'none'}")  # type: ignore[arg-type]
        if args.install:
            print(f"load() takes: {where()}")
    else:
        print(where())
    return 0


if __name__ == "__main__":
    sys.exit(main())
