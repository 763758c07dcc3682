"""experiments/kv_kernel_gpu_check.py without a GPU: its arguments, its cases, and its comparisons run
against a pointer-level model of the kernel on host memory (the same addressing as csrc/kv_swap.cu),
which must pass every case, while a model that corrupts one bit or one neighbouring block must fail.
The script itself, on a GPU, is docs/kv-swap.md's one command."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from autellix.engine.kv.swap import block_views, gather_blocks, scatter_blocks

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "kv_kernel_gpu_check.py"


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kv_kernel_gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_arguments(check: ModuleType) -> None:
    args = check.parse_args([])
    assert (args.build, args.blocks, args.moved, args.layers, args.out) == ("prebuild", 4096, 1024, 32, None)
    assert args.arch_list == "8.0;9.0;10.0;12.0+PTX"  # the image's
    quick = check.parse_args(["--quick", "--build", "jit", "--out", "r.json"])
    assert (quick.build, quick.blocks, quick.moved, quick.out) == ("jit", 256, 128, Path("r.json"))
    for bad in (["--build", "nvrtc"], ["--moved", "0"], ["--blocks", "10", "--moved", "11"], ["--repeat", "0"],
                ["--arch-list", "sm_90"]):
        with pytest.raises(SystemExit):
            check.parse_args(bad)


def test_the_cases_cover_every_access_width(check: ModuleType) -> None:
    """The kernel picks 16-, 8-, 4-, 2- or 1-byte accesses from the segment size and the base addresses."""
    widths = set()
    for case in check.CASES:
        views = block_views(check.case_caches(case, torch.Generator().manual_seed(0), "cpu"), case.num_blocks)
        segment = views[0].shape[2] * views[0].element_size()
        bits = segment | check.base_alignment(views)  # the rows torch allocates are 16-byte aligned
        widths.add(next(w for w in (16, 8, 4, 2, 1) if bits % w == 0))
    assert widths == {16, 8, 4, 2, 1}
    assert any(case.moved == 0 for case in check.CASES)
    assert {torch.bfloat16, torch.float16, torch.float32, torch.uint8} <= {case.dtype for case in check.CASES}


def test_a_faithful_kernel_model_passes_every_case(check: ModuleType) -> None:
    for seed, case in enumerate(check.CASES):
        result = check.check_case(check.HostKernelModel(), case, "cpu", seed)
        assert result.gather and result.scatter and result.ok, case.name
        assert result.mover is None  # the mover takes a kernel only for a CUDA cache


def test_one_wrong_bit_or_block_is_caught(check: ModuleType) -> None:
    for seed, case in enumerate(check.CASES):
        result = check.check_case(check.HostKernelModel(corrupt=True), case, "cpu", seed)
        if case.moved:
            assert not result.gather and not result.scatter and not result.ok, case.name
        else:
            assert result.ok  # nothing moved, nothing to corrupt


def test_the_bit_comparison_sees_nan_payloads(check: ModuleType) -> None:
    a = torch.tensor([float("nan")], dtype=torch.float32)
    b = a.clone()
    b.view(torch.int32)[0] ^= 1  # another NaN: equal as numbers would say nothing
    assert check.same_bits(a, a.clone()) and not check.same_bits(a, b)
    shifted = check.random_bits((3, 4), torch.float32, torch.Generator().manual_seed(0), "cpu", offset_bytes=4)
    assert shifted.data_ptr() % 8 == 4 and shifted.is_contiguous()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_says_so(check: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert check.main(["--quick"]) == 2
    assert "needs a GPU" in capsys.readouterr().err


def test_a_failed_prebuild_falls_back_to_the_run_time_compile(check: ModuleType, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """One device run should not be lost to one build route: the error is kept, the other route taken."""
    def broken(*args: object, **kwargs: object) -> dict[str, object]:
        raise RuntimeError("compile failed: nvcc ...")

    jit = object()
    monkeypatch.setattr(check.kv_kernel, "prebuild", broken)
    monkeypatch.setattr(check.kv_kernel, "build", lambda verbose=False: jit)
    kernel, report = check.build_kernel(check.parse_args([]), tmp_path)
    assert kernel is jit and report["build"] == "jit"
    assert report["prebuild_error"] == "RuntimeError: compile failed: nvcc ..."
    kernel, report = check.build_kernel(check.parse_args(["--build", "jit"]), tmp_path)
    assert kernel is jit and "prebuild_error" not in report


def test_the_timed_torch_copies_are_the_reference(check: ModuleType) -> None:
    """The bandwidth baseline times the reference's own copies, without its checks."""
    g = torch.Generator().manual_seed(3)
    caches = [torch.randn((2, 12, 4, 2, 8), generator=g).to(torch.bfloat16) for _ in range(3)]
    views = block_views(caches, 12)
    ids = torch.tensor([7, 0, 11, 3])
    rows = torch.empty((4, 3, 2, 64), dtype=torch.bfloat16)
    check.torch_gather(views, ids, rows)
    assert check.same_bits(rows, gather_blocks(views, ids))
    reference = [c.clone() for c in caches]
    scatter_blocks(block_views(reference, 12), torch.tensor([1, 2, 5, 9]), rows)
    check.torch_scatter(views, torch.tensor([1, 2, 5, 9]), rows)
    assert all(check.same_bits(a, b) for a, b in zip(caches, reference, strict=True))
