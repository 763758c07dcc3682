"""The KV event index against two real engines: what it says each holds is what each finds in its prefix cache.

Both engines publish their KV cache events (``autellix engine``'s default with Autellix's scheduler); a feed
follows them from their info, as the gateway does. Prompts sent to one engine land in its entry only, and for
every prompt and engine the cached tokens the index predicts equal the engine's own prefix-cache hits when
the prompt is then sent there. A gateway in front of both (given no tokenizer: it fetches the engines') sends
a new program's call to the engine that holds its system prompt, past the engine a tie on load would pick.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
import uuid

import pytest

from autellix.backends import parse_metrics
from autellix.child_processes import admin_url
from autellix.core import PrefixIndex
from autellix.engine.launch import EngineProcess
from autellix.engine.tiny_model import default_model_dir
from autellix.gateway.kv_events import KvEventFeed
from autellix.gateway.prompt_blocks import ChatPrompt
from autellix.protocol import FEEDBACK_INFO_PATH, INFO_KV_EVENTS
from tests.live import MODEL, gateway, http

pytestmark = pytest.mark.engine

HITS = "vllm:prefix_cache_hits_total"


def prefix_hits(engine: EngineProcess) -> float:
    with urllib.request.urlopen(engine.url + "/metrics", timeout=30) as r:
        return parse_metrics(r.read().decode(), {HITS})[HITS]


def chat(system: str, question: str) -> dict:
    return {"model": MODEL, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}


def system_prompt(tag: str) -> str:
    return f"[{tag} {uuid.uuid4().hex}] " + "Answer with care and cite every tool result you used. " * 20


async def settle(feed: KvEventFeed, engines: list[EngineProcess], blocks: dict[str, int]) -> None:
    deadline = time.monotonic() + 20
    while any(len(feed.index.held(e.url)) < blocks[e.url] for e in engines):
        assert time.monotonic() < deadline, f"index holds {feed.index.summary()}, expected at least {blocks}"
        await asyncio.sleep(0.05)


def test_the_index_matches_what_both_engines_hold(two_engines: list[EngineProcess]) -> None:
    async def run() -> None:
        feed = KvEventFeed(PrefixIndex())
        await feed.start()
        try:
            for engine in two_engines:
                status, info = http("GET", engine.url + FEEDBACK_INFO_PATH)
                assert status == 200 and info[INFO_KV_EVENTS]["block_size"] > 0
                feed.engine_described(engine.url, info[INFO_KV_EVENTS])
            prompt = ChatPrompt.from_model_dir(default_model_dir())
            assert prompt is not None
            systems = [system_prompt("a"), system_prompt("b")]
            before = {e.url: len(feed.index.held(e.url)) for e in two_engines}
            for engine, system in zip(two_engines, systems, strict=True):
                assert http("POST", engine.url + "/v1/chat/completions", chat(system, "first"))[0] == 200
            await settle(feed, two_engines, {url: held + 1 for url, held in before.items()})
            assert feed.hasher is not None
            for system in systems:
                chain = feed.hasher.chain(prompt.tokens(chat(system, "second question")) or [])
                predicted = feed.index.cached_tokens(chain, [e.url for e in two_engines])
                # each prompt's system prompt is held by the engine it was sent to, and only there
                assert len(predicted) == 1 and min(predicted.values()) > len(system) - feed.hasher.block_size
                for engine in two_engines:
                    start = prefix_hits(engine)
                    assert http("POST", engine.url + "/v1/chat/completions", chat(system, "second question"))[0] == 200
                    assert prefix_hits(engine) - start == predicted.get(engine.url, 0)
        finally:
            await feed.stop()

    asyncio.run(run())


def index_blocks(gw: str) -> float:
    """The blocks the gateway's index holds, over every engine (``autellix_kv_index_blocks``)."""
    with urllib.request.urlopen(gw + "/metrics", timeout=30) as r:
        return parse_metrics(r.read().decode(), {"autellix_kv_index_blocks"}).get("autellix_kv_index_blocks", 0.0)


def test_the_gateway_sends_a_new_program_where_its_system_prompt_is(two_engines: list[EngineProcess]) -> None:
    first, second = sorted(two_engines, key=lambda e: e.url)  # idle engines tie: the first by name takes a call
    # no --tokenizer: the gateway fetches the engines' tokenizer to hash chat prompts as they do
    with gateway([e.url for e in two_engines], "--no-program-admission") as gw:
        deadline = time.monotonic() + 60
        while True:  # a fresh system prompt each time: a call sent before the tokenizer came spoils only its own
            system = system_prompt("routing")
            held = index_blocks(gw)
            assert http("POST", second.url + "/v1/chat/completions", chat(system, "warm up"))[0] == 200
            while index_blocks(gw) <= held:  # the gateway has seen the warm-up's blocks
                assert time.monotonic() < deadline, "the gateway's index never followed the engines' events"
                time.sleep(0.1)
            assert http("POST", gw + "/v1/chat/completions", chat(system, "a new program"))[0] == 200
            calls = http("GET", admin_url(gw) + "/admin/calls?limit=1")[1]["data"]
            if calls[0]["attempts"][-1]["engine"] == second.url:
                break
            assert time.monotonic() < deadline, "the gateway never routed by the engines' caches"
    # with the index off, the same call goes to the least loaded engine: the first by name
    with gateway([e.url for e in two_engines], "--tokenizer", str(default_model_dir()), "--no-program-admission",
                 "--no-kv-index") as gw:
        assert http("POST", gw + "/v1/chat/completions", chat(system, "another program"))[0] == 200
        calls = http("GET", admin_url(gw) + "/admin/calls?limit=1")[1]["data"]
        assert calls[0]["attempts"][-1]["engine"] == first.url
