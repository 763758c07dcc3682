import pytest

from autellix.core import ATLAS, PLAS, DuplicateProgram, ProcessTable, UnknownCall, UnknownProgram


def test_session_life_cycle():
    table = ProcessTable(PLAS())
    entry = table.start("p", now=1.0)
    assert table.get("p") is entry and len(table) == 1
    with pytest.raises(DuplicateProgram):
        table.start("p", now=2.0)
    assert table.end("p") is entry
    assert "p" not in table
    with pytest.raises(UnknownProgram):
        table.end("p")
    with pytest.raises(UnknownProgram):
        table.call_arrived("p", "c", now=3.0)


def test_plas_sums_model_time_and_keeps_waiting_apart():
    table = ProcessTable(PLAS())
    table.start("p", now=0.0)
    for i, (model_time, wait) in enumerate([(2.0, 1.0), (3.0, 0.5)]):
        call = table.call_arrived("p", f"c{i}", now=float(i), thread_id="t0", engine="e1")
        assert call.inherited == table.priority("p")
        table.call_finished("p", f"c{i}", now=i + 0.5, model_time=model_time, wait=wait, completion_tokens=7)
    entry = table["p"]
    assert entry.service == 5.0 and entry.waiting == 1.5
    assert entry.calls_done == 2 and entry.completion_tokens == 14
    assert entry.engines == {"e1"} and entry.last_finish == 1.5 and entry.last_arrival == 1.0
    assert not entry.active


def test_atlas_charges_width_and_keeps_the_critical_path():
    """Width-aware ATLAS: the priority is all the engine time the program took
    (parallel siblings add up); the critical path is kept beside it."""
    table = ProcessTable(ATLAS())
    table.start("p", now=0.0)
    table.call_arrived("p", "root", now=0.0)
    table.call_finished("p", "root", now=2.0, model_time=2.0)
    for child in ("a", "b", "c"):  # three parallel children inherit 2.0
        call = table.call_arrived("p", child, now=2.0)
        assert call.inherited_path == 2.0
    table.call_finished("p", "a", now=3.0, model_time=1.0)
    assert table["p"].service == 3.0 and table["p"].critical_path == 3.0
    table.call_finished("p", "b", now=6.0, model_time=4.0)
    assert table["p"].service == 7.0 and table["p"].critical_path == 6.0
    table.call_finished("p", "c", now=7.0, model_time=2.0)  # a shorter path: the path stays, the charge grows
    assert table["p"].service == 9.0 and table["p"].critical_path == 6.0
    assert table["p"].to_dict()["critical_path"] == 6.0


def test_a_wide_program_is_charged_like_the_same_calls_run_one_after_another():
    wide, narrow = ProcessTable(ATLAS()), ProcessTable(ATLAS())
    for table in (wide, narrow):
        table.start("p", now=0.0)
    for i in range(8):  # eight parallel calls of 1 s
        wide.call_arrived("p", f"w{i}", now=0.0)
    for i in range(8):
        wide.call_finished("p", f"w{i}", now=1.0, model_time=1.0)
    for i in range(8):  # the same eight calls in a chain
        narrow.call_arrived("p", f"n{i}", now=float(i))
        narrow.call_finished("p", f"n{i}", now=i + 1.0, model_time=1.0)
    assert wide.priority("p") == narrow.priority("p") == 8.0
    assert wide["p"].critical_path == 1.0 and narrow["p"].critical_path == 8.0


def test_abort_counts_wait_but_no_service():
    table = ProcessTable(PLAS())
    table.start("p", now=0.0)
    table.call_arrived("p", "c", now=0.0)
    table.call_aborted("p", "c", now=1.0, wait=0.7)
    entry = table["p"]
    assert entry.service == 0.0 and entry.waiting == 0.7 and entry.calls_aborted == 1
    with pytest.raises(UnknownCall):
        table.call_finished("p", "c", now=2.0, model_time=1.0)


def test_bad_times_change_nothing():
    table = ProcessTable(PLAS())
    table.start("p", now=0.0)
    table.call_arrived("p", "c", now=0.0)
    with pytest.raises(ValueError):
        table.call_finished("p", "c", now=1.0, model_time=-1.0)
    assert "c" in table["p"].active and table["p"].service == 0.0


def test_idle_programs_expire_but_busy_ones_stay():
    table = ProcessTable(PLAS(), idle_ttl=10.0)
    table.start("idle", now=0.0)
    table.start("busy", now=0.0)
    table.call_arrived("busy", "c", now=1.0)
    table.start("recent", now=0.0)
    table.call_arrived("recent", "c", now=1.0)
    table.call_finished("recent", "c", now=8.0, model_time=1.0)
    expired = table.expire(now=12.0)
    assert [e.program_id for e in expired] == ["idle"]
    assert {e.program_id for e in table} == {"busy", "recent"}
    assert [e.program_id for e in table.expire(now=18.5)] == ["recent"]


def test_dropping_an_engine_frees_its_pins():
    table = ProcessTable(ATLAS())
    for pid, engine in [("a", "e1"), ("b", "e2"), ("c", "e1")]:
        table.start(pid, now=0.0)
        table.pin(pid, engine)
    assert sorted(table.drop_engine("e1")) == ["a", "c"]
    assert table["a"].pinned_engine is None and table["b"].pinned_engine == "e2"


def test_to_dict_is_json_ready():
    import json

    table = ProcessTable(ATLAS())
    table.start("p", now=0.0, owner="key1")
    table.call_arrived("p", "c", now=1.0, thread_id="t", engine="e")
    data = json.loads(json.dumps(table["p"].to_dict()))
    assert data["id"] == "p" and data["calls_active"] == 1 and data["active"][0]["thread_id"] == "t"
    assert "owner" not in data  # the owner identity is never exposed


def test_calls_in_flight_beside_the_first_commit_their_program_to_a_typical_call_each():
    table = ProcessTable(ATLAS())
    table.start("q", now=0.0)
    for i, model_time in enumerate((2.0, 4.0)):
        table.call_arrived("q", f"q{i}", now=0.0)
        table.call_finished("q", f"q{i}", now=1.0, model_time=model_time)
    assert table.call_time == 3.0  # the mean of the first calls
    table.start("w", now=1.0)
    table.call_arrived("w", "w0", now=1.0)
    assert table.view("w").committed == 0.0  # one call in flight: nothing beside it
    for i in range(1, 4):
        table.call_arrived("w", f"w{i}", now=1.0)
    view = table.view("w")
    assert (view.service, view.committed, view.priority, view.charged) == (0.0, 9.0, 9.0, 9.0)
    assert table.priority("w") == 9.0
    assert table.view("q").committed == 0.0  # no call in flight
    # a call done under the typical time: while the round is in flight its priority holds
    table.call_finished("w", "w0", now=2.0, model_time=1.0)
    assert table.call_time == pytest.approx(7.0 / 3.0)
    view = table.view("w")
    assert (view.service, view.priority, view.committed) == (1.0, 9.0, 8.0)
    # one over it: the priority rises with it
    table.call_finished("w", "w1", now=3.0, model_time=10.0)
    assert table.call_time == pytest.approx(17.0 / 4.0)
    assert table.view("w").priority == pytest.approx(11.0 + 17.0 / 4.0)
    for i in (2, 3):
        table.call_finished("w", f"w{i}", now=4.0, model_time=1.0)
    view = table.view("w")  # the round is over: attained service alone
    assert (view.service, view.priority, view.committed) == (13.0, 13.0, 0.0)


def test_a_subagent_trees_calls_in_flight_commit_the_whole_tree():
    table = ProcessTable(ATLAS())
    table.start("root", now=0.0)
    table.call_arrived("root", "r0", now=0.0)
    table.call_finished("root", "r0", now=1.0, model_time=2.0)
    table.start("root/a", now=1.0, parent="root")
    table.start("root/b", now=1.0, parent="root")
    table.call_arrived("root", "r1", now=1.0)
    table.call_arrived("root/a", "a0", now=1.0)
    table.call_arrived("root/b", "b0", now=1.0)
    for program_id in ("root", "root/a", "root/b"):  # three in flight across the tree: two committed
        assert table.view(program_id).committed == 4.0 and table.view(program_id).priority == 6.0
    for program_id, call_id in (("root", "r1"), ("root/a", "a0"), ("root/b", "b0")):
        table.call_finished(program_id, call_id, now=3.0, model_time=2.0)
    assert table.view("root/a").committed == 0.0 and table.view("root/a").priority == 8.0


def test_the_typical_call_follows_recent_calls():
    table = ProcessTable(PLAS())
    table.start("p", now=0.0)
    for i in range(200):
        table.call_arrived("p", f"c{i}", now=float(i))
        table.call_finished("p", f"c{i}", now=i + 0.5, model_time=1.0 if i < 100 else 5.0)
    assert table.call_time == pytest.approx(5.0, rel=0.01)
