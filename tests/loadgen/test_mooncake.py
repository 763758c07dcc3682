"""Mooncake's chats: the trace's requests joined into conversations, and the programs that replay them."""

from __future__ import annotations

import asyncio
import json

import pytest

from autellix.workloads import CONTEXT_LIMIT, make_programs, mooncake
from autellix.workloads.data import (
    ENV_VAR,
    MOONCAKE_BLOCK_TOKENS,
    MooncakeTurn,
    load_mooncake,
    mooncake_conversations,
    workloads_available,
    workloads_dir,
)
from tests.loadgen.test_programs import RecordingLLM

needs_data = pytest.mark.skipif(not workloads_available(), reason=f"no workload data (set {ENV_VAR})")


def _row(blocks: list[int], input_length: int, output_length: int) -> dict:
    return {"timestamp": 0, "input_length": input_length, "output_length": output_length, "hash_ids": blocks}


def test_a_request_over_an_earlier_ones_full_blocks_is_its_next_turn() -> None:
    rows = [_row([0, 1, 2, 3], 1800, 100),       # a: blocks 0-2 full, 3 partial
            _row([0, 1, 2, 7, 8], 2100, 50),      # over a's full blocks: a's next turn
            _row([0, 9, 10], 1200, 30),          # shares only the first block: a new conversation
            _row([0, 1, 2, 7, 11, 12], 2700, 5)]  # over the second request's full blocks
    conversations = mooncake_conversations(rows)
    assert [c.turns for c in conversations] == [
        (MooncakeTurn(1800, 100), MooncakeTurn(2100 - 1800 - 100, 50), MooncakeTurn(2700 - 2100 - 50, 5)),
        (MooncakeTurn(1200, 30),),
    ]


def test_the_first_block_alone_joins_nothing() -> None:
    rows = [_row([0, 1], 600, 10), _row([0, 1, 2], 1100, 10), _row([0, 3], 700, 10)]
    assert [len(c.turns) for c in mooncake_conversations(rows)] == [1, 1, 1]


def test_a_turn_after_a_trimmed_history_adds_at_least_one_token() -> None:
    rows = [_row([0, 1, 2, 3], 1800, 900), _row([0, 1, 2, 4], 1900, 10)]
    (conversation,) = mooncake_conversations(rows)
    assert conversation.turns[1] == MooncakeTurn(1, 10)


def test_a_branch_continues_the_latest_request_with_those_blocks() -> None:
    rows = [_row([0, 1, 2, 3], 1800, 10), _row([0, 5, 6, 7], 1800, 10), _row([0, 1, 2, 4], 1800, 10),
            _row([0, 1, 2, 4, 9], 2300, 10)]
    conversations = mooncake_conversations(rows)
    assert [len(c.turns) for c in conversations] == [3, 1]


@needs_data
def test_every_request_of_the_trace_is_one_turn() -> None:
    path = workloads_dir() / "mooncake" / "conversation_trace.jsonl"
    requests = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    conversations = load_mooncake(workloads_dir().resolve())
    assert sum(len(c.turns) for c in conversations) == requests
    assert any(len(c.turns) > 1 for c in conversations)


@needs_data
def test_a_program_replays_its_conversation_scaled_over_the_whole_history() -> None:
    program = next(p for p in make_programs(mooncake.WORKLOAD, 100, seed=3) if (p.expected_calls or 0) >= 3)
    llm = RecordingLLM()
    asyncio.run(program.run(llm))
    assert len(llm.calls) == program.expected_calls
    system = llm.calls[0][0][0]
    assert system[0] == "system"
    budgets = tuple(max_tokens for _, max_tokens, _ in llm.calls)
    assert budgets in {tuple(max(1, round(t.output_tokens / mooncake.SCALE)) for t in c.turns)
                       for c in load_mooncake(workloads_dir().resolve())}
    assert len(system[1].encode("utf-8")) == MOONCAKE_BLOCK_TOKENS // mooncake.SCALE
    for before, after in zip(llm.calls, llm.calls[1:], strict=False):
        history = (*before[0], ("assistant", "x" * before[1]))
        fits = sum(len(c.encode("utf-8")) + 40 for _, c in after[0]) + after[1] <= CONTEXT_LIMIT
        assert fits
        if after[0][: len(history)] == history:  # not cut to fit: the whole history, then one user turn
            assert len(after[0]) == len(history) + 1 and after[0][-1][0] == "user"


@needs_data
def test_programs_draw_multi_turn_chats_and_share_one_system_prompt() -> None:
    programs = make_programs(mooncake.WORKLOAD, 200, seed=1)
    assert make_programs(mooncake.WORKLOAD, 200, seed=1)[17].expected_calls == programs[17].expected_calls
    assert sum(p.expected_calls or 0 for p in programs) > len(programs)  # some chats have several turns
    systems = set()
    for program in programs[:20]:
        llm = RecordingLLM()
        asyncio.run(program.run(llm))
        systems.add(llm.calls[0][0][0])
    assert len(systems) == 1


def test_the_trace_rows_are_json_lines(tmp_path) -> None:
    folder = tmp_path / "mooncake"
    folder.mkdir()
    rows = [_row([0, 1, 2], 1100, 20), _row([0, 1, 2, 3], 1700, 20)]
    (folder / "conversation_trace.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (conversation,) = load_mooncake(tmp_path)
    assert conversation.turns == (MooncakeTurn(1100, 20), MooncakeTurn(1700 - 1100 - 20, 20))
