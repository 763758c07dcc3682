"""The KV swap kernel on a GPU: bit for bit against the torch reference, and its copy bandwidth.

    PYTHONPATH=src python3 experiments/kv_kernel_gpu_check.py --out $OUT/kv_kernel_gpu_check.json

One script for a machine with a GPU, a CUDA build of torch, nvcc and a host compiler, and nothing else:
no vLLM, no network, no package to install (it imports only torch and ``autellix.engine.kv.kernel`` /
``.swap``, which import only torch). Minutes at most: the build is most of it.

1. **Build** the kernel the way the CUDA engine image does (``--build prebuild``, the default:
   ``kv_kernel.prebuild`` for the image's architecture list, linked against torch's libcudart, import,
   ``cuobjdump``), or through ``torch.utils.cpp_extension`` (``--build jit``, what an engine without a
   prebuilt kernel does; also what a failed prebuild falls back to, its error in the report).
2. **Bit for bit** (every case, on bytes: NaN payloads and all): the kernel's gather against
   ``swap.gather_blocks`` (``index_select``), its scatter against ``scatter_blocks``
   (``index_copy_``), whole caches compared so untouched blocks are checked too, and
   ``KVBlockMover.save``/``load`` through pinned host rows (non-contiguous rows, a staging buffer small
   enough to take several pieces). Cases: FlashAttention's layout ``(2, blocks, 16, 8, 128)`` and the
   block-first one, bf16, fp16, fp32 and bytes (vLLM keeps an fp8 KV cache as uint8); 16-, 8-, 4-, 2-
   and 1-byte accesses (segment sizes and a base address 4 bytes off alignment); repeated ids in a
   gather; an empty batch.
3. **Bandwidth** on a Llama-3.1-8B-sized cache (32 layers, ``(2, blocks, 16, 8, 128)`` bf16, 2 MiB per
   block of every layer), random block ids: the kernel's gather and scatter against the torch reference's
   copies (``index_select`` / ``index_copy_`` per layer and K/V) and against one plain ``copy_`` of the
   same bytes on the device (the ceiling); the mover's save and load to pinned host memory against one
   plain copy of the same bytes over the link. GB/s = bytes copied / median time of ``--repeat`` runs
   (CUDA events).

Prints a table, writes everything to ``--out`` (JSON), exits 1 if any case differs, 2 without CUDA.
The device-independent parts (arguments, the cases, the comparisons against a pointer-level model of
the kernel on host memory) are tested in tests/engine/test_kv_kernel_gpu_check.py.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from autellix.engine.kv import kernel as kv_kernel
from autellix.engine.kv.swap import KVBlockMover, block_views, gather_blocks, scatter_blocks

BUILDS = ("prebuild", "jit")


@dataclass(frozen=True)
class Case:
    """One correctness case: ``layers`` KV tensors of ``shape`` (the block dimension first or second),
    ``moved`` blocks, the cache ``offset_bytes`` past an aligned address."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    layers: int
    moved: int
    offset_bytes: int = 0

    @property
    def num_blocks(self) -> int:
        return self.shape[0] if self.shape[0] > 2 else self.shape[1]


CASES = (
    Case("flash bf16 (16-byte accesses)", (2, 64, 16, 8, 128), torch.bfloat16, 4, 24),
    Case("block-first fp16", (64, 2, 16, 8, 128), torch.float16, 3, 31),
    Case("flash fp8 KV (vLLM keeps it as uint8)", (2, 48, 16, 1, 64), torch.uint8, 2, 17),
    Case("fp32, 8-byte segments", (40, 2), torch.float32, 3, 13),
    Case("fp32, base 4 bytes off (4-byte accesses)", (33, 3, 4), torch.float32, 2, 11, offset_bytes=4),
    Case("fp16, 2-byte segments", (29, 1), torch.float16, 2, 9),
    Case("bytes, 17-byte segments (1-byte accesses)", (23, 17), torch.uint8, 3, 7),
    Case("one block, one layer", (5, 2, 16, 1, 8), torch.bfloat16, 1, 1),
    Case("empty batch", (2, 8, 16, 2, 32), torch.bfloat16, 2, 0),
)


@dataclass
class CaseResult:
    name: str
    gather: bool
    scatter: bool
    mover: bool | None
    transfers: int | None = None
    pieces: int | None = None

    @property
    def ok(self) -> bool:
        return self.gather and self.scatter and self.mover is not False


@dataclass
class Bandwidth:
    what: str
    bytes: int
    seconds: float
    baseline: str
    baseline_seconds: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9

    @property
    def baseline_gbps(self) -> float:
        return self.bytes / self.baseline_seconds / 1e9


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", choices=BUILDS, default="prebuild",
                        help="prebuild: as the CUDA engine image does (default); jit: torch.utils.cpp_extension")
    parser.add_argument("--arch-list", default=kv_kernel.DEFAULT_ARCH_LIST,
                        help=f"for --build prebuild (default: the image's, {kv_kernel.DEFAULT_ARCH_LIST!r})")
    parser.add_argument("--blocks", type=int, default=4096, help="KV blocks per layer in the bandwidth cache")
    parser.add_argument("--moved", type=int, default=1024, help="blocks moved per bandwidth run (2 MiB each)")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="a small bandwidth cache (256 blocks, 128 moved)")
    parser.add_argument("--out", type=Path, help="JSON report")
    args = parser.parse_args(argv)
    if args.quick:
        args.blocks, args.moved = 256, 128
    if not 0 < args.moved <= args.blocks:
        parser.error(f"--moved must be in 1..--blocks ({args.blocks}), got {args.moved}")
    if args.layers < 1 or args.repeat < 1:
        parser.error("--layers and --repeat must be positive")
    if args.build == "prebuild":
        try:
            kv_kernel.parse_arch_list(args.arch_list)
        except ValueError as error:
            parser.error(str(error))
    return args


# ---- data ------------------------------------------------------------------------------------
def random_bits(shape: Sequence[int], dtype: torch.dtype, generator: torch.Generator, device: str,
                offset_bytes: int = 0) -> torch.Tensor:
    """A contiguous tensor of random bit patterns (NaNs and all) whose first byte sits
    ``offset_bytes`` past the allocation's start."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = 1
    for size in shape:
        count *= size
    raw = torch.randint(0, 256, (count * itemsize + offset_bytes,), generator=generator, dtype=torch.uint8)
    raw = raw.to(device)
    return raw[offset_bytes:].view(dtype).view(tuple(shape))


def case_caches(case: Case, generator: torch.Generator, device: str) -> list[torch.Tensor]:
    return [random_bits(case.shape, case.dtype, generator, device, case.offset_bytes) for _ in range(case.layers)]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


def base_alignment(views: Sequence[torch.Tensor]) -> int:
    bits = 16
    for v in views:
        bits |= v.data_ptr()
    return bits & -bits


def stream_handle(device: str) -> int:
    return torch.cuda.current_stream().cuda_stream if device == "cuda" else 0


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ---- bit for bit -----------------------------------------------------------------------------
def check_case(kernel: Any, case: Case, device: str, seed: int = 0) -> CaseResult:
    """The kernel against the torch reference on one case (on ``device``; ``kernel`` takes the
    binding's arguments)."""
    g = torch.Generator().manual_seed(seed)
    caches = case_caches(case, g, device)
    views = block_views(caches, case.num_blocks)
    ptrs = torch.tensor([v.data_ptr() for v in views], dtype=torch.int64, device=device)
    nb, align, stream = case.num_blocks, base_alignment(views), stream_handle(device)
    # a gather may repeat ids; a scatter may not
    ids = torch.randint(0, nb, (case.moved,), generator=g)
    if case.moved > 2:
        ids[1] = ids[0]
    expected = gather_blocks(views, ids.to(device))
    rows = torch.empty_like(expected)
    rows.view(torch.uint8).fill_(0xA5)  # whatever the kernel leaves unwritten shows
    kernel.gather_kv_blocks(ptrs, ids.to(device), rows, nb, align, stream)
    synchronize(device)
    gather_ok = same_bits(rows, expected)

    targets = torch.randperm(nb, generator=g)[: case.moved]
    incoming = random_bits(tuple(expected.shape), case.dtype, g, device)
    reference = [c.clone() for c in caches]
    scatter_blocks(block_views(reference, nb), targets.to(device), incoming)
    kernel.scatter_kv_blocks(ptrs, targets.to(device), incoming, nb, align, stream)
    synchronize(device)
    scatter_ok = all(same_bits(got, want) for got, want in zip(caches, reference, strict=True))

    if device != "cuda":  # the mover takes the kernel only for a CUDA cache
        return CaseResult(case.name, gather_ok, scatter_ok, None)
    return check_mover(kernel, case, caches, g, CaseResult(case.name, gather_ok, scatter_ok, None))


def check_mover(kernel: Any, case: Case, caches: list[torch.Tensor], g: torch.Generator,
                result: CaseResult) -> CaseResult:
    """``KVBlockMover`` with the kernel: save to non-contiguous pinned host rows, load into other
    blocks, through a staging buffer of a few rows (so a batch goes in pieces)."""
    nb = case.num_blocks
    row_bytes = caches[0].numel() // nb * case.layers * caches[0].element_size()
    staging_rows = 3
    mover = KVBlockMover.create(caches, nb, host_rows=2 * case.moved + 4, kernel=kernel,
                                staging_bytes=staging_rows * row_bytes)
    if mover.kernel is None or (case.moved and not mover.host.is_pinned()):
        raise RuntimeError("the mover did not take the kernel or pinned host memory")
    views = block_views(caches, nb)
    ids = torch.randperm(nb, generator=g)[: case.moved]
    rows = [r for r in range(2 * case.moved + 4) if r % 2 == 0][: case.moved]  # every other row: runs of 1
    expected = gather_blocks(views, ids.cuda()).cpu()
    mover.save(ids.tolist(), rows)
    torch.cuda.synchronize()
    saved_ok = all(same_bits(mover.host[r], expected[i]) for i, r in enumerate(rows))
    targets = torch.randperm(nb, generator=g)[: case.moved]
    reference = [c.clone() for c in caches]
    scatter_blocks(block_views(reference, nb), targets.cuda(), expected.cuda())
    mover.load(rows, targets.tolist())
    torch.cuda.synchronize()
    loaded_ok = all(same_bits(got, want) for got, want in zip(caches, reference, strict=True))
    counters = mover.collect()
    result.mover = saved_ok and loaded_ok
    result.transfers = counters["out"].transfers
    result.pieces = -(-case.moved // staging_rows)
    return result


# ---- a pointer-level model of the kernel on host memory (what the tests run it against) -------
class HostKernelModel:
    """``csrc/kv_swap.cu``'s addressing on host memory, from raw pointers: segment (i, l, o) is
    ``segment_bytes`` at ``layer_ptrs[l] + (o * num_blocks + block_ids[i]) * segment_bytes``, row
    ``rows + ((i * layers + l) * outer + o) * segment_bytes``. ``corrupt``: each gather flips one bit, each
    scatter also writes its first row into the next block."""

    def __init__(self, corrupt: bool = False) -> None:
        self.corrupt = corrupt

    @staticmethod
    def _segments(layer_ptrs: torch.Tensor, block_ids: torch.Tensor, rows: torch.Tensor,
                  num_blocks: int) -> list[tuple[int, int, int]]:
        n, layers, outer, _ = rows.shape
        seg = rows.shape[3] * rows.element_size()
        out = []
        for i in range(n):
            for layer in range(layers):
                for o in range(outer):
                    cache = int(layer_ptrs[layer]) + (o * num_blocks + int(block_ids[i])) * seg
                    row = rows.data_ptr() + ((i * layers + layer) * outer + o) * seg
                    out.append((cache, row, seg))
        return out

    def gather_kv_blocks(self, layer_ptrs: torch.Tensor, block_ids: torch.Tensor, rows: torch.Tensor,
                         num_blocks: int, base_alignment: int, stream: int) -> None:
        for cache, row, seg in self._segments(layer_ptrs, block_ids, rows, num_blocks):
            ctypes.memmove(row, cache, seg)
        if self.corrupt and rows.numel():
            flat = rows.view(torch.uint8).view(-1)
            flat[-1] ^= 1

    def scatter_kv_blocks(self, layer_ptrs: torch.Tensor, block_ids: torch.Tensor, rows: torch.Tensor,
                          num_blocks: int, base_alignment: int, stream: int) -> None:
        for cache, row, seg in self._segments(layer_ptrs, block_ids, rows, num_blocks):
            ctypes.memmove(cache, row, seg)
        if self.corrupt and rows.numel():
            neighbour = torch.tensor([(int(block_ids[0]) + 1) % num_blocks])
            for cache, row, seg in self._segments(layer_ptrs, neighbour, rows[:1], num_blocks):
                ctypes.memmove(cache, row, seg)


# ---- bandwidth -------------------------------------------------------------------------------
def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``fn()`` on the current stream (CUDA events), after two warm-ups."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def torch_gather(views: list[torch.Tensor], ids: torch.Tensor, rows: torch.Tensor) -> None:
    """``gather_blocks``' copies without its id checks (which read the ids back to the host)."""
    for layer, v in enumerate(views):
        for o in range(v.shape[0]):
            torch.index_select(v[o], 0, ids, out=rows[:, layer, o])


def torch_scatter(views: list[torch.Tensor], ids: torch.Tensor, rows: torch.Tensor) -> None:
    """``scatter_blocks``' copies without its checks."""
    for layer, v in enumerate(views):
        for o in range(v.shape[0]):
            v[o].index_copy_(0, ids, rows[:, layer, o])


def device_rates(kernel: Any, views: list[torch.Tensor], ids: torch.Tensor, repeat: int) -> list[Bandwidth]:
    """The kernel's gather and scatter between the cache and device rows, the torch reference's, and one
    plain device copy of the same bytes."""
    blocks = views[0].shape[1]
    ptrs = torch.tensor([v.data_ptr() for v in views], dtype=torch.int64, device="cuda")
    align, stream = base_alignment(views), torch.cuda.current_stream().cuda_stream
    rows = gather_blocks(views, ids)
    nbytes = rows.numel() * rows.element_size()
    flat_src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    flat_dst = torch.empty_like(flat_src)
    device_copy = timed(lambda: flat_dst.copy_(flat_src), repeat)
    reference = timed(lambda: torch_gather(views, ids, rows), repeat)
    kernel_gather = timed(lambda: kernel.gather_kv_blocks(ptrs, ids, rows, blocks, align, stream), repeat)
    gather = Bandwidth("kernel gather (cache -> device rows)", nbytes, kernel_gather, "one device copy_",
                       device_copy, {"torch_reference_gbps": nbytes / reference / 1e9})
    reference = timed(lambda: torch_scatter(views, ids, rows), repeat)
    kernel_scatter = timed(lambda: kernel.scatter_kv_blocks(ptrs, ids, rows, blocks, align, stream), repeat)
    scatter = Bandwidth("kernel scatter (device rows -> cache)", nbytes, kernel_scatter, "one device copy_",
                        device_copy, {"torch_reference_gbps": nbytes / reference / 1e9})
    return [gather, scatter]


def link_rates(nbytes: int, repeat: int) -> tuple[float, float]:
    """Seconds of one plain copy of ``nbytes`` to pinned host memory, and back."""
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    return (timed(lambda: host.copy_(device, non_blocking=True), repeat),
            timed(lambda: device.copy_(host, non_blocking=True), repeat))


def mover_rates(kernel: Any, caches: list[torch.Tensor], ids: torch.Tensor, repeat: int) -> list[Bandwidth]:
    """``KVBlockMover.save``/``load`` (the swap connector's calls: kernel, staging buffer, pinned host
    rows) against one plain copy of the same bytes over the link."""
    blocks, moved = caches[0].shape[1], ids.numel()
    mover = KVBlockMover.create(caches, blocks, host_rows=moved, kernel=kernel)
    nbytes = moved * mover.row_bytes
    to_host, to_device = link_rates(nbytes, repeat)
    block_list, host_rows = ids.tolist(), list(range(moved))
    save = timed(lambda: mover.save(block_list, host_rows), repeat)
    load = timed(lambda: mover.load(host_rows, block_list), repeat)
    pieces = -(-moved // mover.staging_rows)
    return [Bandwidth("mover save (kernel + copy to pinned host)", nbytes, save, "one copy to pinned host",
                      to_host, {"pieces": pieces}),
            Bandwidth("mover load (copy from pinned host + kernel)", nbytes, load, "one copy from pinned host",
                      to_device, {"pieces": pieces})]


def bandwidth(kernel: Any, layers: int, blocks: int, moved: int, repeat: int) -> list[Bandwidth]:
    """Llama-3.1-8B's KV shape per layer (FlashAttention's layout, bf16), ``moved`` random blocks."""
    g = torch.Generator().manual_seed(1)
    caches = [torch.randn((2, blocks, 16, 8, 128), dtype=torch.bfloat16, device="cuda") for _ in range(layers)]
    ids = torch.randperm(blocks, generator=g)[:moved].cuda()
    return device_rates(kernel, block_views(caches, blocks), ids, repeat) + mover_rates(kernel, caches, ids, repeat)


# ---- the run ---------------------------------------------------------------------------------
def build_kernel(args: argparse.Namespace, scratch: Path) -> tuple[Any, dict[str, Any]]:
    """The kernel, built as ``--build`` says. A failed prebuild falls back to the run-time compile (one
    device run should not be lost to one build route), with its error in the report."""
    started = time.monotonic()
    report: dict[str, Any] = {}
    kernel = None
    if args.build == "prebuild":
        try:
            report = kv_kernel.prebuild(scratch, args.arch_list)
            kernel = kv_kernel.import_module(Path(str(report["path"])))
        except Exception as error:  # any build failure: say it, try the other route
            report = {"prebuild_error": f"{type(error).__name__}: {error}"}
            print(f"prebuild failed, compiling with torch.utils.cpp_extension instead: {report['prebuild_error']}",
                  file=sys.stderr)
    if kernel is None:
        kernel = kv_kernel.build(verbose=False)
    built = "prebuild" if "path" in report else "jit"
    return kernel, {**report, "build": built, "seconds": round(time.monotonic() - started, 1),
                    "nvcc": kv_kernel.find_nvcc()}


def environment() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    nvcc = kv_kernel.find_nvcc()
    lines = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.splitlines() if nvcc else []
    release = [line.strip() for line in lines if "release" in line]
    return {"device": props.name, "capability": f"{props.major}.{props.minor}", "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "nvcc": release[0] if release else nvcc,
            "python": platform.python_version()}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device visible to torch: this check needs a GPU (see docs/kv-swap.md)", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"environment": environment(), "arguments": {k: str(v) for k, v in vars(args).items()}}
    print(json.dumps(report["environment"]))
    with tempfile.TemporaryDirectory(prefix="kv-kernel-gpu-") as scratch:
        kernel, report["kernel"] = build_kernel(args, Path(scratch))
        print(f"kernel: {report['kernel']['build']} in {report['kernel']['seconds']} s; machine code: "
              f"{' '.join(report['kernel'].get('elf', [])) or '(jit: this GPU only)'}")
        results = [check_case(kernel, case, "cuda", seed) for seed, case in enumerate(CASES)]
        report["cases"] = [asdict(r) | {"ok": r.ok} for r in results]
        print(f"\n{'case':48} gather  scatter  mover (pieces, host transfers)")
        for r in results:
            mover = "-" if r.mover is None else f"{'ok' if r.mover else 'DIFFERS'} ({r.pieces}, {r.transfers})"
            print(f"{r.name:48} {'ok' if r.gather else 'DIFFERS':7} {'ok' if r.scatter else 'DIFFERS':8} {mover}")
        rates = bandwidth(kernel, args.layers, args.blocks, args.moved, args.repeat)
    report["bandwidth"] = [asdict(b) | {"gbps": b.gbps, "baseline_gbps": b.baseline_gbps} for b in rates]
    print(f"\nbandwidth: {args.moved} blocks of {args.blocks} x {args.layers} layers (bf16, 2 x 16 x 8 x 128), "
          f"{rates[0].bytes / 2**30:.2f} GiB per run, median of {args.repeat}")
    print(f"{'what':46} {'GB/s':>8} {'baseline':>28} {'GB/s':>8} {'ratio':>6}  other")
    for b in rates:
        other = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in b.extra.items())
        print(f"{b.what:46} {b.gbps:8.1f} {b.baseline:>28} {b.baseline_gbps:8.1f} {b.gbps / b.baseline_gbps:6.2f}  "
              f"{other}")
    failed = [r.name for r in results if not r.ok]
    report["ok"] = not failed
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print("\nall cases bit for bit" if not failed else f"\nDIFFERS: {', '.join(failed)}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
