"""How an engine publishes and describes its KV cache events, without an engine: vLLM's own config parser
takes the arguments, the description follows the config, the tokenizer's files are served as found."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from autellix.engine.kv_events import (
    describe,
    kv_events_args,
    kv_events_ipc_for,
    kv_events_tcp,
    read_tokenizer,
    tokenizer_files,
)
from autellix.engine.launch import engine_command
from autellix.protocol import KV_EVENTS_PORT


def test_vllm_parses_the_arguments_into_its_own_config():
    kv_events = pytest.importorskip("vllm.config.kv_events")
    flag, value = kv_events_args(kv_events_tcp())
    assert flag == "--kv-events-config"
    config = kv_events.KVEventsConfig(**json.loads(value))
    assert config.enable_kv_cache_events and config.publisher == "zmq"
    assert (config.endpoint, config.replay_endpoint) == (f"tcp://*:{KV_EVENTS_PORT}", f"tcp://*:{KV_EVENTS_PORT + 1}")
    # a host's engines bind IPC sockets named for their ports: two engines never share one
    assert kv_events_ipc_for(8100, "/run") == ("ipc:///run/autellix-kv-events-8100.sock",
                                               "ipc:///run/autellix-kv-replay-8100.sock")
    assert kv_events_ipc_for(8100) != kv_events_ipc_for(8101)


def test_local_engines_publish_with_autellixs_scheduler_only(tmp_path: Path):
    assert "--kv-events-config" in engine_command(tmp_path, 8100)
    assert "--kv-events-config" not in engine_command(tmp_path, 8100, kv_events=False)
    assert "--kv-events-config" not in engine_command(tmp_path, 8100, scheduler="fcfs")


def config(*, events: bool = True, caching: bool = True, tokenizer: str = "/nowhere") -> SimpleNamespace:
    return SimpleNamespace(
        kv_events_config=SimpleNamespace(enable_kv_cache_events=events, publisher="zmq" if events else "null",
                                         endpoint="tcp://*:5557", replay_endpoint="tcp://*:5558", topic=""),
        cache_config=SimpleNamespace(enable_prefix_caching=caching, prefix_caching_hash_algo="sha256"),
        model_config=SimpleNamespace(tokenizer=tokenizer, tokenizer_revision=None))


def test_the_description_follows_the_config_and_names_the_tokenizer(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert describe(config(events=False), 16) is None
    assert describe(config(caching=False), 16) is None  # no prefix cache: no blocks to route by
    (tmp_path / "tokenizer.json").write_text('{"model": {}}')
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    described = describe(config(tokenizer=str(tmp_path)), 128)
    assert described is not None
    assert described["block_size"] == 128 and described["hash_algorithm"] == "sha256"
    assert described["hash_seed"] is None and described["endpoint"] == "tcp://*:5557"
    assert read_tokenizer(described) == {"tokenizer_json": '{"model": {}}',
                                         "tokenizer_config": {"chat_template": "{{ messages }}"}}
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    assert describe(config(tokenizer=str(tmp_path)), 128)["hash_seed"] == "7"


def test_missing_or_broken_tokenizer_files_are_not_served(tmp_path: Path):
    assert tokenizer_files(str(tmp_path)) == {}
    assert tokenizer_files("not a hub id !!") == {}  # never raises: the engine starts regardless
    (tmp_path / "tokenizer.json").write_text("{}")
    assert read_tokenizer({"tokenizer_files": tokenizer_files(str(tmp_path))}) is None  # one of two
    (tmp_path / "tokenizer_config.json").write_text("not json")
    assert read_tokenizer({"tokenizer_files": tokenizer_files(str(tmp_path))}) is None
    assert read_tokenizer(None) is None
