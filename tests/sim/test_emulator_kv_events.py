"""The emulator's KV cache events: followed as a real engine's are, and what they say is what its cache holds.

Two emulated engines publish on IPC sockets; a ``KvEventFeed`` follows them from their info, as the gateway
does. For every prompt and engine the cached tokens the index predicts equal the engine's prefix-cache hits
when the prompt is then sent there, a generated reply's blocks included (the next turn repeats it); a feed
started after the calls learns the same from the replay. A gateway given no tokenizer fetches the emulator's
and sends a new program to the engine that holds its system prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator

import aiohttp
import pytest

from autellix.backends import parse_metrics
from autellix.child_processes import admin_url, free_ports
from autellix.core import PrefixIndex
from autellix.engine.kv_events import kv_events_ipc_for
from autellix.gateway.kv_events import KvEventFeed
from autellix.gateway.prompt_blocks import ChatPrompt
from autellix.protocol import FEEDBACK_INFO_PATH, FEEDBACK_TOKENIZER_PATH, INFO_KV_EVENTS
from autellix.sim.emulator import EmulatedEngine, emulator_process
from autellix.sim.engine_profile import EngineProfile
from tests.live import gateway, http
from tests.sim.emulated import serving

pytest.importorskip("zmq")
pytest.importorskip("msgspec")

MODEL = "emulated"
HITS = "vllm:prefix_cache_hits_total"


def chat(system: str, *turns: str) -> dict:
    messages = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "assistant" if i % 2 else "user", "content": text})
    return {"model": MODEL, "max_tokens": 200, "messages": messages}


def system_prompt(tag: str) -> str:
    return f"[{tag} {uuid.uuid4().hex}] " + "Answer with care and cite every tool result you used. " * 20


@contextlib.asynccontextmanager
async def two_engines(tmp_path) -> AsyncIterator[list[str]]:
    ports = free_ports(2)
    engines = [EmulatedEngine(EngineProfile.load("cpu-tiny"), time_scale=0.05,
                              kv_events=kv_events_ipc_for(port, str(tmp_path))) for port in ports]
    async with serving(engines, ports) as urls:
        yield urls


async def post(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def hits(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as r:
        return parse_metrics(await r.text(), {HITS})[HITS]


async def follow(session: aiohttp.ClientSession, urls: list[str]) -> KvEventFeed:
    feed = KvEventFeed(PrefixIndex())
    await feed.start()
    for url in urls:
        async with session.get(url + FEEDBACK_INFO_PATH) as r:
            feed.engine_described(url, (await r.json())[INFO_KV_EVENTS])
    return feed


async def settle(feed: KvEventFeed, blocks: dict[str, int]) -> None:
    deadline = time.monotonic() + 20
    while any(len(feed.index.held(url)) < least for url, least in blocks.items()):
        assert time.monotonic() < deadline, f"index holds {feed.index.summary()}, expected at least {blocks}"
        await asyncio.sleep(0.02)


@pytest.mark.asyncio
async def test_the_index_matches_what_emulated_engines_hold(tmp_path) -> None:
    async with two_engines(tmp_path) as urls, aiohttp.ClientSession() as s:
        async with s.get(urls[0] + FEEDBACK_TOKENIZER_PATH) as r:
            files = await r.json()
        prompt = ChatPrompt.from_files(files["tokenizer_json"], files["tokenizer_config"])
        assert prompt is not None
        feed = await follow(s, urls)
        try:
            systems = [system_prompt("a"), system_prompt("b")]
            replies = [(await post(s, url, chat(system, "first")))["choices"][0]["message"]["content"]
                       for url, system in zip(urls, systems, strict=True)]
            await settle(feed, {url: len(system) // 128 + 1 for url, system in zip(urls, systems, strict=True)})
            assert feed.hasher is not None
            for system, reply in zip(systems, replies, strict=True):
                body = chat(system, "first", reply, "second question")  # the next turn repeats the reply
                chain = feed.hasher.chain(prompt.tokens(body) or [])
                predicted = feed.index.cached_tokens(chain, urls)
                # each system prompt and its reply are held by the engine they went to, and only there
                assert len(predicted) == 1
                assert min(predicted.values()) > len(system) + len(reply) - feed.hasher.block_size
                for url in urls:
                    before = await hits(s, url)
                    await post(s, url, body)
                    assert await hits(s, url) - before == predicted.get(url, 0)
            # a feed that starts now learns from the replay what the first one followed live
            late = await follow(s, urls)
            try:
                await settle(late, {url: len(feed.index.held(url)) for url in urls})
                assert all(late.index.held(url) == feed.index.held(url) for url in urls)
            finally:
                await late.stop()
        finally:
            await feed.stop()


def index_blocks(gw: str) -> float:
    """The blocks the gateway's index holds, over every engine (``autellix_kv_index_blocks``)."""
    with urllib.request.urlopen(gw + "/metrics", timeout=30) as r:
        return parse_metrics(r.read().decode(), {"autellix_kv_index_blocks"}).get("autellix_kv_index_blocks", 0.0)


def test_a_gateway_routes_by_the_emulators_events(tmp_path) -> None:
    with emulator_process(2, "--time-scale", "0.05", "--max-num-seqs", "6",
                          log_path=tmp_path / "emulator.log") as urls:
        first, second = sorted(urls)  # idle engines tie: the first by name takes a call
        # no --tokenizer: the gateway fetches the emulator's (the tiny model's) to hash prompts as it does
        with gateway(urls, "--no-program-admission", log_path=tmp_path / "gateway.log") as gw:
            # each engine's size, as its info says, once it turned healthy: what its cached tokens are weighed by
            deadline = time.monotonic() + 20
            while (sizes := {e["url"]: e["slots"] for e in http("GET", admin_url(gw) + "/admin/engines")[1]["data"]
                             if e["healthy"]}) != dict.fromkeys(urls, 6):
                assert time.monotonic() < deadline, sizes
                time.sleep(0.1)
            deadline = time.monotonic() + 20
            while True:  # a fresh system prompt each time: a call sent before the tokenizer came spoils only its own
                system = system_prompt("routing")
                held = index_blocks(gw)
                assert http("POST", second + "/v1/chat/completions", chat(system, "warm up"))[0] == 200
                while index_blocks(gw) <= held:  # the gateway has seen the warm-up's blocks
                    assert time.monotonic() < deadline, "the gateway's index never followed the emulator's events"
                    time.sleep(0.05)
                assert http("POST", gw + "/v1/chat/completions", chat(system, "a new program"))[0] == 200
                calls = http("GET", admin_url(gw) + "/admin/calls?limit=1")[1]["data"]
                if calls[0]["attempts"][-1]["engine"] == second:
                    break
                assert time.monotonic() < deadline, "the gateway never routed by the emulator's events"
        with gateway(urls, "--no-program-admission", "--no-kv-index", log_path=tmp_path / "gateway2.log") as gw:
            # with the index off, a prompt the second engine holds goes to the least loaded: the first by name
            assert http("POST", gw + "/v1/chat/completions", chat(system, "another program"))[0] == 200
            calls = http("GET", admin_url(gw) + "/admin/calls?limit=1")[1]["data"]
            assert calls[0]["attempts"][-1]["engine"] == first
