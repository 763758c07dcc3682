"""Prompt length for Algorithm 2's 2048-token threshold.

With the model's tokenizer (a ``tokenizers`` JSON file the gateway can load) the
count is exact. Otherwise it is estimated as UTF-8 bytes / 4: English BPE
vocabularies average about four bytes per token, and over-estimating a little
only pins a few more programs, which costs nothing when they fit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

BYTES_PER_TOKEN = 4

Counter = Callable[[str], int]


def estimate_tokens(text: str) -> int:
    return (len(text.encode()) + BYTES_PER_TOKEN - 1) // BYTES_PER_TOKEN


def tokenizer_counter(path: Path) -> Counter:
    """Exact counts from a ``tokenizer.json``, or a model's folder that has one (the ``tokenizers`` library)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def prompt_text(body: dict[str, Any]) -> str:
    """The text a request sends to the model, for counting."""
    if "messages" in body:
        parts = []
        for m in body["messages"]:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
        return "\n".join(parts)
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return prompt if isinstance(prompt, str) else ""
