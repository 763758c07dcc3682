"""Declared sizes: a program ranks at the larger of what it attained and what it declared."""

import random

import pytest

from autellix.core import ATLAS, MultiLevelQueue, ProcessTable, SchedulerConfig


def _table_with_rate(seconds_per_token: float = 0.01) -> ProcessTable:
    """A table that has seen one call, so that it knows the model time per generated token."""
    table = ProcessTable(ATLAS())
    table.start("warm", now=0.0)
    table.call_arrived("warm", "w", now=0.0)
    table.call_finished("warm", "w", now=1.0, model_time=100 * seconds_per_token, completion_tokens=100)
    table.end("warm")
    return table


def _call(table: ProcessTable, program: str, call: str, model_time: float, tokens: int) -> None:
    table.call_arrived(program, call, now=0.0)
    table.call_finished(program, call, now=0.0, model_time=model_time, completion_tokens=tokens)


def test_a_declaration_is_the_floor_of_the_priority_at_the_recent_model_time_per_token():
    table = _table_with_rate(0.01)
    assert table.seconds_per_token == pytest.approx(0.01)
    table.start("p", now=0.0)
    table.declare("p", 500)
    view = table.view("p")
    assert view.priority == pytest.approx(5.0) and view.declared == pytest.approx(5.0)
    assert view.service == 0.0 and view.charged == pytest.approx(5.0)  # anti-starvation counts it too
    _call(table, "p", "c1", model_time=7.0, tokens=700)  # past what it declared: its service ranks it
    assert table.view("p").priority == pytest.approx(7.0)


def test_a_declaration_only_grows_and_a_negative_one_is_refused():
    table = _table_with_rate()
    table.start("p", now=0.0)
    table.declare("p", 800)
    table.declare("p", 10)
    assert table["p"].declared_tokens == 800
    with pytest.raises(ValueError):
        table.declare("p", -1)


def test_no_declaration_counts_before_a_call_has_timed_the_tokens():
    table = ProcessTable(ATLAS())
    table.start("p", now=0.0)
    table.declare("p", 10_000)
    assert table.view("p").priority == 0.0


def test_a_program_that_declares_more_goes_behind_one_that_declared_less():
    table = _table_with_rate(0.01)
    queue = MultiLevelQueue(ATLAS().queues(SchedulerConfig()), table.view)
    for program, tokens in (("big", 60_000), ("small", 20)):
        table.start(program, now=0.0)
        table.declare(program, tokens)
        table.call_arrived(program, f"{program}-1", now=0.0)
        queue.add(f"{program}-1", program, now=0.0)
    assert queue.get("big-1").level > queue.get("small-1").level


def test_a_subagent_tree_ranks_by_its_roots_declaration():
    table = _table_with_rate(0.01)
    table.start("root", now=0.0)
    table.declare("root", 1_000)
    table.start("child", now=0.0, parent="root")
    assert table.view("child").priority == pytest.approx(10.0)


def test_a_program_that_understates_its_size_never_ranks_ahead_of_its_undeclared_self():
    """The liar's property: whatever the history, declaring (too little, or anything) never lowers
    a program's priority below what it would be had it declared nothing."""
    rng = random.Random(7)
    for trial in range(200):
        liar, plain = _table_with_rate(rng.uniform(0.001, 0.05)), None
        plain = _table_with_rate(liar.seconds_per_token)
        for table in (liar, plain):
            table.start("p", now=0.0)
        liar.declare("p", rng.randint(1, 2_000))
        for i in range(rng.randint(0, 6)):
            model_time, tokens = rng.uniform(0.01, 3.0), rng.randint(1, 300)
            for table in (liar, plain):
                _call(table, "p", f"c{i}", model_time, tokens)
            assert liar.view("p").priority >= plain.view("p").priority, trial
        if rng.random() < 0.5:  # and with calls in flight
            for table in (liar, plain):
                table.call_arrived("p", "open-1", now=0.0)
                table.call_arrived("p", "open-2", now=0.0)
            assert liar.view("p").priority >= plain.view("p").priority, trial


def test_an_engines_table_ranks_by_the_model_time_that_travelled():
    table = ProcessTable(ATLAS())
    entry = table.start("p", now=0.0)
    entry.declared_service = 3.0
    assert table.view("p").priority == 3.0
