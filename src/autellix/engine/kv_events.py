"""The engine's KV cache events: vLLM's publisher as Autellix starts it, and how the engine describes it.

vLLM publishes the blocks its prefix cache stores and removes on a ZeroMQ PUB
socket (``--kv-events-config``), with a ROUTER socket beside it that replays
recent batches from a sequence number. ``autellix engine`` turns both on: on a
host with one engine per port (``autellix up``, the tests) on IPC sockets named
for the engine's port; in a pod (the chart, the operator) on TCP ports
:data:`autellix.protocol.KV_EVENTS_PORT` and the next one, which the gateway
reaches at the pod's address.

The scheduler plugin tells the gateway where to subscribe and how to hash a
prompt as this engine does (block size, hash algorithm, seed, and the files it
tokenizes with) in its hello, served as ``GET /autellix/v1/info``'s
``kv_events`` (``describe``); the files themselves at ``GET
/autellix/v1/tokenizer`` (``read_tokenizer``), so a gateway that does not
have the model can tokenize chat prompts as the engine does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from autellix.protocol import KV_EVENTS_PORT


def kv_events_ipc_for(port: int, directory: str | None = None) -> tuple[str, str]:
    """The publisher's and the replay's sockets of the engine serving on ``port`` (one per engine on a host)."""
    base = directory or os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return f"ipc://{base}/autellix-kv-events-{port}.sock", f"ipc://{base}/autellix-kv-replay-{port}.sock"


def kv_events_tcp(port: int = KV_EVENTS_PORT) -> tuple[str, str]:
    """The publisher on TCP ``port`` of every address, the replay on the next port (a pod's engine)."""
    return f"tcp://*:{port}", f"tcp://*:{port + 1}"


def kv_events_args(endpoints: tuple[str, str]) -> list[str]:
    """vLLM's arguments that publish KV cache events on ``endpoints`` (publisher, replay)."""
    endpoint, replay = endpoints
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "replay_endpoint": replay}
    return ["--kv-events-config", json.dumps(config, separators=(",", ":"))]


#: The tokenizer's files a gateway needs: the vocabulary and the chat template with its special tokens.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def tokenizer_files(name: str, revision: str | None = None) -> dict[str, str]:
    """Where the engine's tokenizer files are: in its folder, or in the Hugging Face cache for a hub id
    (never downloaded here); the files that are not found are left out."""
    folder = Path(name)
    if folder.is_dir():
        return {f: str(folder / f) for f in TOKENIZER_FILES if (folder / f).is_file()}
    try:
        from huggingface_hub import try_to_load_from_cache

        found = {f: try_to_load_from_cache(name, f, revision=revision) for f in TOKENIZER_FILES}
    except Exception:  # not a hub id either (or no hub library): the engine still starts, without them
        return {}
    return {f: path for f, path in found.items() if isinstance(path, str)}


def read_tokenizer(description: dict[str, Any] | None) -> dict[str, Any] | None:
    """The tokenizer files an engine's description names, for ``GET /autellix/v1/tokenizer``; None: not both."""
    files = (description or {}).get("tokenizer_files") or {}
    if set(files) != set(TOKENIZER_FILES):
        return None
    try:
        return {"tokenizer_json": Path(files["tokenizer.json"]).read_text(encoding="utf-8"),
                "tokenizer_config": json.loads(Path(files["tokenizer_config.json"]).read_text(encoding="utf-8"))}
    except (OSError, ValueError):
        return None


def describe(vllm_config: Any, hash_block_size: int) -> dict[str, Any] | None:
    """Where this engine publishes its KV events and how it names blocks; None when it publishes none."""
    events, cache, model = vllm_config.kv_events_config, vllm_config.cache_config, vllm_config.model_config
    if events is None or not events.enable_kv_cache_events or events.publisher != "zmq" \
            or not cache.enable_prefix_caching:
        return None
    return {"endpoint": events.endpoint, "replay_endpoint": events.replay_endpoint, "topic": events.topic,
            "block_size": hash_block_size, "hash_algorithm": cache.prefix_caching_hash_algo,
            "hash_seed": os.environ.get("PYTHONHASHSEED"),
            "tokenizer_files": tokenizer_files(model.tokenizer, getattr(model, "tokenizer_revision", None))}
