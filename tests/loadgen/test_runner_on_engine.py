"""The benchmark's client against a real engine: what a program re-sends, and what the engine reports."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from autellix.engine.launch import EngineProcess
from autellix.engine.tiny_model import REPLY_TOKEN_IDS
from autellix.loadgen.runner import run_programs
from autellix.workloads import AgentProgram
from autellix.workloads.base import LLM, assistant_message, user_message
from tests.live import MODEL


def _chat(replies: list[str]) -> AgentProgram:
    """Three turns, each re-sending the whole history, as the chat workloads do."""

    async def run(llm: LLM) -> None:
        messages = [user_message("a question " * 20)]
        for turn in range(3):
            replies.append(await llm.chat(messages, max_tokens=48))
            messages += [assistant_message(replies[-1]), user_message(f"follow-up {turn} " * 5)]

    return AgentProgram("sharegpt", "chat-0", run, expected_calls=3)


def test_replies_limited_to_ascii_re_tokenize_to_what_was_generated(
        engine_cache: Callable[..., EngineProcess]) -> None:
    # the gateway's routing tests share this engine (the same settings start it once);
    # a bare engine: the runner finds no gateway and sends no sessions
    engine = engine_cache(scheduler="vllm-priority", max_num_seqs=1)
    replies: list[str] = []
    run = asyncio.run(run_programs(engine.url, [_chat(replies)], rate=10.0, seed=1, model=MODEL,
                                   stream=False, reply_tokens=REPLY_TOKEN_IDS))
    assert not run.programs[0].error, run.programs[0].error
    calls = sorted(run.calls, key=lambda c: c.submitted)
    assert [c.completion_tokens for c in calls] == [48, 48, 48]
    # printable ASCII, one byte a token: the reply a program re-sends is the tokens it was given
    assert all(len(r) == 48 and all(32 <= ord(ch) < 127 for ch in r) for r in replies)
    # so each turn's prompt grows by exactly the reply, the follow-up and their template tokens
    follow_up = len("follow-up 0 " * 5)
    growth = [b.prompt_tokens - a.prompt_tokens for a, b in itertools.pairwise(calls)]
    assert growth[0] == growth[1] and 48 + follow_up < growth[0] < 48 + follow_up + 40
    for call in calls:  # vLLM's own timings, from queued to last token, inside the client's latency
        assert call.engine_s is not None and call.queue_s is not None
        assert 0 <= call.queue_s < call.engine_s < call.finished - call.submitted
