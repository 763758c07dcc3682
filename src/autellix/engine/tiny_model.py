"""A tiny, locally generated Llama model directory for running vLLM on CPU.

Nothing is downloaded: the config and a byte-level tokenizer are written to
disk, and vLLM is started with ``--load-format dummy`` so that it fills the
weights with random values. The output text is gibberish, but the engine,
scheduler, KV cache and OpenAI-compatible server all run for real.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping, Sequence

BOS = "<s>"
EOS = "</s>"
PAD = "<pad>"

# Architecture: small enough for a 2-core CPU, but with head_dim >= 32 so the
# CPU attention kernels accept it, and a long context for agentic programs.
CONFIG: dict[str, object] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 16384,
    "vocab_size": 260,  # 256 bytes + <s>, </s>, <pad> + 1 spare
    "bos_token_id": 256,
    "eos_token_id": 257,
    "pad_token_id": 258,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# Minimal chat template: "<|role|>\ncontent\n" per message, then the
# assistant prefix when a generation prompt is requested.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")


def render_chat(messages: Sequence[Mapping[str, str]]) -> str:
    """``CHAT_TEMPLATE`` applied with the generation prompt, in plain Python: the
    prompt text the engine sees (one token per UTF-8 byte). The simulator renders
    with it, so its prompts and prefix-cache hits are the real engine's: a reply
    generated after ``<|assistant|>\n`` is followed by ``\n`` in the next prompt,
    so the next turn's prompt starts with the last one's prompt and output."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"

#: The token ids a benchmark lets the tiny model generate: printable ASCII.
#: With dummy weights the model samples any byte, and the bytes that are not
#: valid UTF-8 decode to replacement characters (3 bytes each), so a program
#: that re-sends its replies would grow histories 1.7x faster than it generated
#: tokens, and miss the prefix cache on them. A real model's reply re-tokenizes
#: to the tokens it generated; printable ASCII does too (token id == byte).
REPLY_TOKEN_IDS: tuple[int, ...] = tuple(range(32, 127))


def default_model_dir() -> pathlib.Path:
    """Cache location of the tiny model (``$AUTELLIX_CACHE/tiny-llama``)."""
    cache = os.environ.get("AUTELLIX_CACHE") or pathlib.Path.home() / ".cache" / "autellix"
    return pathlib.Path(cache) / "tiny-llama"


def _write_tokenizer(path: pathlib.Path) -> None:
    """Write a byte-level BPE tokenizer with no merges: one token per byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # GPT-2 byte-to-unicode map (what ByteLevel uses): printable bytes map to
    # themselves, the rest to chr(256 + n). Token id == byte value.
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable}
    chars.update({b: chr(256 + n) for n, b in enumerate(others)})
    vocab = {chars[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BOS, EOS, PAD])  # ids 256, 257, 258
    tok.save(str(path / "tokenizer.json"))


def build_tiny_model(path: pathlib.Path) -> pathlib.Path:
    """Create the tiny model directory at ``path`` if missing; return ``path``."""
    path = pathlib.Path(path)
    if all((path / name).is_file() for name in FILES):
        return path
    path.mkdir(parents=True, exist_ok=True)
    _write_tokenizer(path)
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": CONFIG["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    # config.json last: its presence (with the others) marks a complete build.
    (path / "config.json").write_text(json.dumps(CONFIG, indent=2))
    return path
