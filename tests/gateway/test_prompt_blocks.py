"""Chat prompts rendered and tokenized as the engine does, and hashed into the blocks the index is asked about."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from autellix.core import VllmBlockHasher
from autellix.engine.tiny_model import build_tiny_model, default_model_dir, render_chat
from autellix.gateway.prompt_blocks import ChatPrompt, EngineTokenizers, PromptBlocks
from autellix.protocol import CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH

pytest.importorskip("jinja2")


@pytest.fixture(scope="module")
def tiny() -> ChatPrompt:
    prompt = ChatPrompt.from_model_dir(build_tiny_model(default_model_dir()))
    assert prompt is not None
    return prompt


def test_the_tiny_models_template_gives_its_byte_tokens(tiny: ChatPrompt):
    messages = [{"role": "system", "content": "Be brief. é"}, {"role": "user", "content": [
        {"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]
    flat = [messages[0], {"role": "user", "content": "one\ntwo"}]
    assert tiny.tokens({"messages": messages}) == list(render_chat(flat).encode())
    # what cannot be known here: images, malformed messages
    assert tiny.tokens({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}) is None
    assert tiny.tokens({"messages": ["not a message"]}) is None
    assert tiny.tokens({"messages": "text"}) is None


def write_model(folder: Path, config: dict) -> Path:
    folder.mkdir()
    (folder / "tokenizer.json").write_text((default_model_dir() / "tokenizer.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_templates_named_special_tokens_and_refusals(tmp_path: Path):
    named = write_model(tmp_path / "named", {
        "bos_token": {"content": "<s>"},
        "chat_template": [{"name": "tool_use", "template": "x"},
                          {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }}"
                                                          "{% if m['content'] == 'no' %}{{ raise_exception('no') }}"
                                                          "{% endif %}{% endfor %}"}]})
    prompt = ChatPrompt.from_model_dir(named)
    assert prompt is not None
    # the special token renders as its text and tokenizes as its own id (256), as on the engine
    assert prompt.tokens({"messages": [{"role": "user", "content": "hi"}]}) == [256, *b"hi"]
    assert prompt.tokens({"messages": [{"role": "user", "content": "no"}]}) is None  # the template refused
    assert ChatPrompt.from_model_dir(write_model(tmp_path / "plain", {})) is None  # no chat template
    assert ChatPrompt.from_model_dir(tmp_path / "missing") is None


def test_blocks_only_for_chat_calls_once_the_engines_named_their_blocks(tiny: ChatPrompt):
    naming = SimpleNamespace(hasher=None)
    blocks = PromptBlocks(EngineTokenizers(http=None, local=tiny), naming)  # type: ignore[arg-type]
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "x" * 300}]}
    assert blocks.of(CHAT_COMPLETIONS_PATH, body) == ()
    naming.hasher = VllmBlockHasher(128)
    assert blocks.of(CHAT_COMPLETIONS_PATH, body) == naming.hasher.chain(tiny.tokens(body))
    assert len(blocks.of(CHAT_COMPLETIONS_PATH, body)) == 2
    assert blocks.of(COMPLETIONS_PATH, {"model": "tiny-llama", "prompt": "x" * 300}) == ()
