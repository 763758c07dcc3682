"""A Chat Completions call's prompt as its engine tokenizes it: the token ids its KV blocks are hashed from.

vLLM renders a chat call's messages with the model's chat template (Jinja, in
a sandbox, ``trim_blocks`` and ``lstrip_blocks`` as Hugging Face renders it,
with the generation prompt) and tokenizes the text without adding special
tokens. ``ChatPrompt`` does the same from the model's ``tokenizer.json`` (the
``tokenizers`` library) and the ``chat_template`` and special tokens of its
``tokenizer_config.json``. Only text messages are rendered: a call with
images, audio or other parts, or one the template refuses, has no known tokens
(and routing does not look up its prefix).

The files come from the gateway's ``--tokenizer`` folder, or else from the
engines themselves (``GET /autellix/v1/tokenizer``, ``EngineTokenizers``): a
gateway in a cluster needs no copy of the model.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from autellix.control.background import cancel
from autellix.core import VllmBlockHasher
from autellix.gateway.engine_http import EngineHttp
from autellix.protocol import CHAT_COMPLETIONS_PATH, FEEDBACK_TOKENIZER_PATH

log = logging.getLogger("autellix.gateway.prompt_blocks")

#: Special tokens a chat template may name, from ``tokenizer_config.json``.
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")
#: Seconds to fetch an engine's tokenizer files.
FETCH_TIMEOUT = 30.0


def _text(content: Any) -> str | None:
    """A message's content as text (its text parts joined, as vLLM's "string" content format); None: not text."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
        return "\n".join(texts)
    return None


def _raise(message: str) -> None:
    raise ValueError(message)  # what Hugging Face's templates call to refuse a conversation


def _special(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` gives it: a string, or an added token's content."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


class ChatPrompt:
    """Renders and tokenizes chat messages as the engine serving the model does."""

    def __init__(self, tokenizer_json: str, template: str, special: Mapping[str, str]) -> None:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_str(tokenizer_json)
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        environment.globals["raise_exception"] = _raise
        self._template = environment.from_string(template)
        self._special = dict(special)

    @classmethod
    def from_files(cls, tokenizer_json: str, config: Mapping[str, Any]) -> ChatPrompt | None:
        """From a tokenizer's JSON and its ``tokenizer_config.json``; None when there is no chat template or
        jinja2 is missing."""
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t.get("template") for t in template if isinstance(t, Mapping)
                             and t.get("name") == "default"), None)
        if not isinstance(template, str):
            return None
        special = {name: value for name in SPECIAL_TOKENS if (value := _special(config.get(name))) is not None}
        try:
            return cls(tokenizer_json, template, special)
        except ImportError:
            log.warning("no chat prompts: jinja2 is not installed (the kv-index extra)")
            return None

    @classmethod
    def from_model_dir(cls, path: Path) -> ChatPrompt | None:
        """From a model's folder; None when it has no tokenizer or chat template."""
        config_path, tokenizer_file = path / "tokenizer_config.json", path / "tokenizer.json"
        if not path.is_dir() or not config_path.is_file() or not tokenizer_file.is_file():
            return None
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
            return cls.from_files(tokenizer_file.read_text(encoding="utf-8"), config)
        except (OSError, ValueError) as exc:
            log.warning("no chat prompts from %s: %s", path, exc)
            return None

    def tokens(self, body: Mapping[str, Any]) -> list[int] | None:
        """The prompt's token ids for a Chat Completions ``body``; None when they cannot be known here."""
        raw = body.get("messages")
        if not isinstance(raw, Sequence) or isinstance(raw, str):
            return None
        messages = []
        for message in raw:
            if not isinstance(message, Mapping):
                return None
            content = _text(message.get("content"))
            if content is None:
                return None
            messages.append({**message, "content": content})
        try:
            text = self._template.render(messages=messages, add_generation_prompt=True, tools=body.get("tools"),
                                         **self._special)
        except Exception as exc:  # a template that raises on this conversation: no tokens, no lookup
            log.debug("chat template failed: %r", exc)
            return None
        return self._tokenizer.encode(text, add_special_tokens=False).ids


class EngineTokenizers:
    """Each served model's ``ChatPrompt``: the gateway's own (``--tokenizer``) for every model, or else
    fetched from the first engine that describes its tokenizer for that model."""

    def __init__(self, http: EngineHttp, local: ChatPrompt | None = None) -> None:
        self.http, self.local = http, local
        self._by_model: dict[str, ChatPrompt] = {}
        self._fetching: dict[str, asyncio.Task[None]] = {}

    def prompt_for(self, model: str) -> ChatPrompt | None:
        return self.local or self._by_model.get(model)

    def engine_described(self, url: str, models: Collection[str]) -> None:
        """``url`` (serving ``models``) describes its tokenizer: fetch it for the models that have none."""
        if self.local is not None or url in self._fetching or all(m in self._by_model for m in models):
            return
        self._fetching[url] = asyncio.create_task(self._fetch(url, tuple(models)), name=f"tokenizer {url}")

    async def _fetch(self, url: str, models: tuple[str, ...]) -> None:
        try:
            async with self.http.get(url + FEEDBACK_TOKENIZER_PATH,
                                     timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT)) as r:
                files = await r.json() if r.status == 200 else None
            prompt = None
            if isinstance(files, dict) and isinstance(files.get("tokenizer_json"), str) \
                    and isinstance(files.get("tokenizer_config"), dict):
                prompt = await asyncio.to_thread(ChatPrompt.from_files, files["tokenizer_json"],
                                                 files["tokenizer_config"])
            if prompt is None:
                log.warning("no chat prompts for %s: %s gave no usable tokenizer", ", ".join(models), url)
                return
            for model in models:
                self._by_model.setdefault(model, prompt)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("fetching %s's tokenizer failed: %r", url, exc)
        finally:
            self._fetching.pop(url, None)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        for url in list(self._fetching):
            await cancel(self._fetching.pop(url, None))


class BlockNaming(Protocol):
    """How the engines name blocks: a ``KvEventFeed``'s hasher, once an engine has described it."""

    hasher: VllmBlockHasher | None


class PromptBlocks:
    """A call's KV block hashes, for the KV event index: Chat Completions calls rendered by their model's
    ``ChatPrompt`` and hashed as the engines name blocks."""

    def __init__(self, prompts: EngineTokenizers, naming: BlockNaming) -> None:
        self.prompts, self.naming = prompts, naming

    def of(self, engine_path: str, body: Mapping[str, Any]) -> Sequence[int]:
        hasher = self.naming.hasher
        model = body.get("model")
        prompt = self.prompts.prompt_for(model) if isinstance(model, str) else None
        if hasher is None or prompt is None or engine_path != CHAT_COMPLETIONS_PATH:
            return ()
        tokens = prompt.tokens(body)
        return hasher.chain(tokens) if tokens else ()


__all__ = ["BlockNaming", "ChatPrompt", "EngineTokenizers", "PromptBlocks"]
