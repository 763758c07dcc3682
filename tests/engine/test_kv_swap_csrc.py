"""The CUDA gather/scatter in csrc/: it compiles, links and imports wherever a
CUDA toolkit is installed (CI, with the CPU build of torch), and on a GPU it
matches the torch reference bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autellix.engine.kv import kernel as kv_kernel
from autellix.engine.kv.swap import KVBlockMover, block_views, gather_blocks, scatter_blocks

needs_toolkit = pytest.mark.skipif(kv_kernel.find_nvcc() is None, reason="no CUDA toolkit (nvcc)")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@needs_toolkit
def test_sources_compile_link_and_import(tmp_path: Path) -> None:
    objects = kv_kernel.compile_objects(tmp_path)
    module = kv_kernel.import_module(kv_kernel.link_module(objects, tmp_path))
    ids = torch.zeros(1, dtype=torch.int64)
    rows = torch.zeros(1, 2, 1, 4)
    # the binding's own checks run before anything touches a device
    with pytest.raises(RuntimeError, match="CUDA tensor"):
        module.gather_kv_blocks(torch.zeros(2, dtype=torch.int64), ids, rows, 4, 16, 0)  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="CUDA tensor"):
        module.scatter_kv_blocks(torch.zeros(2, dtype=torch.int64), ids, rows, 4, 16, 0)  # type: ignore[attr-defined]


@needs_gpu
@pytest.mark.parametrize("shape, dtype", [((64, 2, 128, 64), torch.bfloat16), ((2, 40, 16, 8, 128), torch.float16),
                                          ((33, 3, 5), torch.float32), ((17, 7), torch.uint8)])
def test_kernel_matches_the_torch_reference(shape: tuple, dtype: torch.dtype) -> None:
    kernel = kv_kernel.load()
    num_blocks = shape[0] if shape[0] > 2 else shape[1]
    g = torch.Generator().manual_seed(0)
    caches = [torch.randint(0, 255, shape, generator=g, dtype=torch.uint8).view(dtype).cuda()
              if dtype == torch.uint8 else torch.randn(shape, generator=g).to(dtype).cuda() for _ in range(3)]
    views = block_views(caches, num_blocks)
    ids = torch.randperm(num_blocks, generator=g)[: num_blocks // 2]
    mover = KVBlockMover.create(caches, num_blocks, host_rows=num_blocks, kernel=kernel)
    assert mover.kernel is not None and mover.host.is_pinned()
    expected = gather_blocks(views, ids.cuda()).cpu()
    rows = list(range(3, 3 + ids.numel()))
    mover.save(ids.tolist(), rows)
    torch.cuda.synchronize()
    assert torch.equal(mover.host[3:3 + ids.numel()].view(torch.uint8), expected.view(torch.uint8))
    # back into other blocks
    targets = torch.randperm(num_blocks, generator=g)[: ids.numel()]
    reference = [c.clone() for c in caches]
    scatter_blocks(block_views(reference, num_blocks), targets.cuda(), expected.cuda())
    mover.load(rows, targets.tolist())
    torch.cuda.synchronize()
    for got, want in zip(caches, reference, strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    counters = mover.collect()
    assert counters["out"].transfers == counters["in"].transfers == 1
