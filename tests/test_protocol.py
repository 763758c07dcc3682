"""The wire contract is defined once, in ``autellix.protocol``, and the record the
engine plugin publishes is the one the gateway reads."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import autellix.protocol as protocol
from autellix.engine.planner import CallIdentity
from autellix.protocol import CallRecord, SchedulingFields

SRC = Path(__file__).resolve().parents[1] / "src" / "autellix"

#: The policy core sits below the protocol and imports nothing of ours; its
#: entries' own dict view names the object (the gateway sets it from the protocol).
ALLOWED = {("core/process_table.py", protocol.SESSION_OBJECT)}


def wire_names() -> set[str]:
    """The protocol's distinctive strings (generic ones such as "priority" or
    "/health" are left out: other code says them for other reasons)."""
    values = set()
    for name in (n for n in dir(protocol) if not n.startswith("_")):
        value = getattr(protocol, name)
        items = value if isinstance(value, tuple) else (value,)
        values |= {v for v in items if isinstance(v, str) and ("autellix" in v.lower() or v.startswith(
            ("/admin/", "x-session", "x-claude")) or v == protocol.SESSIONS_PATH)}
    return values


def string_literals(tree: ast.AST) -> set[str]:
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings}


def test_nothing_else_defines_the_wire_names() -> None:
    names = wire_names()
    assert {"X-Autellix-Session", "autellix_program", "/autellix/v1/calls/", "/admin/engines/drain"} <= names
    offenders = {}
    for path in SRC.rglob("*.py"):
        if path.name == "protocol.py":
            continue
        literals = string_literals(ast.parse(path.read_text()))
        hits = sorted(n for n in literals & names if (str(path.relative_to(SRC)), n) not in ALLOWED) + sorted(
            lit for lit in literals if "/autellix/v1/" in lit or lit.startswith("X-Autellix-"))
        if hits:
            offenders[str(path.relative_to(SRC))] = hits
    assert not offenders, offenders


def test_the_fields_the_gateway_sends_are_what_the_engine_plugin_reads() -> None:
    fields = SchedulingFields(program="p", call="c1", service=1.25, wait=0.5, thread="t", level=2)
    who = CallIdentity.of("req-1", fields.xargs(), None)
    assert (who.program_id, who.gateway_call, who.thread_id, who.service, who.wait) == ("p", "c1", "t", 1.25, 0.5)
    assert who.tree is None and protocol.XARG_TREE not in fields.xargs()  # a program's own totals name no tree
    subagent = SchedulingFields(program="root/agent1", call="c2", service=3.0, wait=1.0, tree="root")
    assert CallIdentity.of("req-2", subagent.xargs(), None).tree == "root"
    assert who.expect_return is False and protocol.XARG_EXPECT_RETURN not in fields.xargs()
    tools = SchedulingFields(program="p", call="c3", service=0.0, wait=0.0, expect_return=True)
    assert CallIdentity.of("req-3", tools.xargs(), None).expect_return is True
    assert CallIdentity.of("req-4", {**fields.xargs(), protocol.XARG_EXPECT_RETURN: "yes"}, None).expect_return is False



def test_a_call_record_round_trips_and_bad_ones_are_refused() -> None:
    record = CallRecord(call="c1", program="p", finished=True, service_s=0.25, wait_s=1.0, steps=12,
                        promotions=0, demotions=1, preemptions=2)
    assert CallRecord.from_dict(record.to_dict()) == record
    assert set(record.to_dict()) == set(protocol.CALL_RECORD_FIELDS)
    for bad in ({}, {**record.to_dict(), "service_s": -1}, {**record.to_dict(), "service_s": math.inf},
                {**record.to_dict(), "wait_s": "soon"}):
        assert CallRecord.from_dict(bad) is None


def test_a_calls_program_key_is_the_first_key_header_it_carries_the_one_envoy_hashes_on() -> None:
    first, *rest = protocol.PROGRAM_KEY_HEADERS
    assert first == protocol.SESSION_HEADER and tuple(rest) == protocol.IMPLICIT_SESSION_HEADERS
    agent = protocol.AGENT_SESSION_HEADERS[0]
    assert protocol.program_key({agent: "agent-1", protocol.SESSION_HEADER: "sess-1"}) == "sess-1"
    assert protocol.program_key({protocol.FAIRNESS_ID_HEADERS[0]: "flow-1", agent: "agent-1"}) == "agent-1"
    assert protocol.program_key({protocol.SESSION_HEADER: "", agent: "agent-1"}) == "agent-1"  # empty: absent
    assert protocol.program_key({"content-type": "application/json"}) is None  # a one-call program
