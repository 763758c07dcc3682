"""Where the KV swap kernel comes from (autellix.engine.kv.kernel): a prebuilt extension first
($AUTELLIX_KV_KERNEL, else an importable ``autellix_kv_swap``), a compile at run time only without
one; and the prebuild the CUDA engine image runs: GPU architecture lists, machine code per
architecture, the import. The GPU-side comparison is experiments/kv_kernel_gpu_check.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from autellix.engine.kv import kernel as kv_kernel

needs_toolkit = pytest.mark.skipif(kv_kernel.find_nvcc() is None or kv_kernel.find_cuobjdump() is None,
                                   reason="no CUDA toolkit (nvcc, cuobjdump)")


def test_arch_lists_read_like_torch_cuda_arch_list() -> None:
    archs = kv_kernel.parse_arch_list(kv_kernel.DEFAULT_ARCH_LIST)
    assert [a.sm for a in archs] == ["sm_80", "sm_90", "sm_100", "sm_120"]
    assert [a.ptx for a in archs] == [False, False, False, True]
    assert archs[0].gencode() == "-gencode=arch=compute_80,code=sm_80"
    assert archs[-1].gencode() == "-gencode=arch=compute_120,code=[sm_120,compute_120]"
    assert [a.sm for a in kv_kernel.parse_arch_list(" 8.0, 9.0a 10.0f ")] == ["sm_80", "sm_90a", "sm_100f"]
    for bad in ("", "sm_90", "9", "9.0+ptx", "9.10"):
        with pytest.raises(ValueError):
            kv_kernel.parse_arch_list(bad)


def test_no_prebuilt_kernel_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kv_kernel.PREBUILT_ENV, raising=False)
    if kv_kernel.prebuilt() is not None:
        pytest.skip("this environment has a prebuilt autellix_kv_swap installed")
    assert kv_kernel.where().startswith("none prebuilt")


def test_an_importable_module_is_the_prebuilt_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a stand-in with the extension's name, importable as the image's site-packages makes the real one
    (tmp_path / f"{kv_kernel.NAME}.py").write_text("def gather_kv_blocks(*a): pass\n")
    monkeypatch.delenv(kv_kernel.PREBUILT_ENV, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, kv_kernel.NAME, raising=False)
    module = kv_kernel.prebuilt()
    assert module is not None and module.__file__ == str(tmp_path / f"{kv_kernel.NAME}.py")
    assert kv_kernel.where() == f"prebuilt {tmp_path / f'{kv_kernel.NAME}.py'}"


def test_the_environment_variable_names_the_file_or_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nowhere.so"
    monkeypatch.setenv(kv_kernel.PREBUILT_ENV, str(missing))
    with pytest.raises(FileNotFoundError, match="AUTELLIX_KV_KERNEL"):
        kv_kernel.prebuilt()
    assert kv_kernel.where() == f"prebuilt {missing} ($AUTELLIX_KV_KERNEL)"
    stand_in = tmp_path / "kernel.py"
    stand_in.write_text("WHO = 'stand-in'\n")
    monkeypatch.setenv(kv_kernel.PREBUILT_ENV, str(stand_in))
    assert kv_kernel.prebuilt().WHO == "stand-in"  # type: ignore[union-attr]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_loading_needs_a_gpu_even_with_a_prebuilt_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kernel.py").write_text("")
    monkeypatch.setenv(kv_kernel.PREBUILT_ENV, str(tmp_path / "kernel.py"))
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        kv_kernel.load()


def test_prebuild_wants_one_destination() -> None:
    with pytest.raises(SystemExit):
        kv_kernel.main(["prebuild", "--arch-list", "9.0"])
    with pytest.raises(SystemExit):
        kv_kernel.main(["prebuild", "--install", "--out", "x"])


@needs_toolkit
def test_prebuild_carries_machine_code_for_every_architecture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """What the image's build stage runs, for two architectures (each one costs nvcc time)."""
    assert kv_kernel.main(["prebuild", "--out", str(tmp_path), "--arch-list", "8.0;9.0+PTX"]) == 0
    out = capsys.readouterr().out
    assert "machine code (cuobjdump --list-elf): sm_80 sm_90" in out and "PTX (cuobjdump --list-ptx): sm_90" in out
    assert "imports: yes; binding runs (refuses host tensors): yes" in out
    [built] = tmp_path.glob(f"{kv_kernel.NAME}*.so")
    assert not (tmp_path / "objects").exists()  # the objects stay in a scratch folder
    monkeypatch.setenv(kv_kernel.PREBUILT_ENV, str(built))
    assert kv_kernel.binding_refuses_host_tensors(kv_kernel.prebuilt())
