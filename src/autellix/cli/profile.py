"""``autellix profile``: fit the simulator's step cost model to a running engine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autellix.cli.common import fail, progress


def profile(
    target: Annotated[str, typer.Option(help="Base URL of a running vLLM engine (--enable-per-request-metrics)")],
    name: Annotated[str, typer.Option(help="Profile name")] = "cpu-tiny",
    out: Annotated[Path | None, typer.Option(help="Where to write the profile JSON (default: ./<name>.json)")] = None,
    model: Annotated[str, typer.Option(help="Model name to request")] = "tiny-llama",
    max_num_seqs: Annotated[int, typer.Option(min=1, help="The engine's --max-num-seqs")] = 4,
    max_num_batched_tokens: Annotated[int, typer.Option(min=1, help="The engine's --max-num-batched-tokens")] = 1024,
    max_model_len: Annotated[int, typer.Option(min=1, help="The engine's --max-model-len")] = 8192,
    block_size: Annotated[int | None, typer.Option(min=1, help="KV block size (default: read from /metrics)")] = None,
    kv_blocks: Annotated[int | None, typer.Option(min=1, help="KV blocks (default: read from /metrics)")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Runs of each controlled batch")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the random prompts")] = 0,
) -> None:
    """Drive a running engine with controlled batches and fit the simulator's step cost model."""
    import asyncio
    import datetime
    import json

    from autellix.sim.cost_model import StepCost
    from autellix.sim.engine_profile import EngineProfile
    from autellix.sim.profiling import DEFAULT_GROUPS, INTERFERENCE, build_profile, engine_cache_config, measure

    try:
        cache = engine_cache_config(target)
    except OSError as exc:
        raise fail(f"cannot read {target}/metrics: {exc}") from None
    block_size = block_size or cache.get("block_size")
    kv_blocks = kv_blocks or cache.get("num_gpu_blocks")
    if not block_size or not kv_blocks:
        raise fail("the engine's /metrics has no vllm:cache_config_info: pass --block-size and --kv-blocks")
    try:
        base = EngineProfile(name, block_size, kv_blocks, max_num_seqs, max_num_batched_tokens,
                             StepCost(0.0, 0.0, 0.0, 0.0), max_model_len=max_model_len)
        measured = asyncio.run(measure(target, DEFAULT_GROUPS + INTERFERENCE, model=model, repeats=repeats, seed=seed,
                                       progress=progress))
    except (ValueError, RuntimeError, OSError) as exc:
        raise fail(str(exc)) from None
    engine_info = {"target": target, "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                   "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    data = build_profile(measured, base, engine=engine_info)
    path = out or Path(f"{name}.json")
    path.write_text(json.dumps(data, indent=2) + "\n")
    fit = data["fit"]
    typer.echo(f"wrote {path}: step = {data['cost']} (R^2 {fit['r2']:.3f}, "
               f"mean |error| {100 * fit['mean_abs_rel_error']:.1f}% over {fit['samples']} timings)")
