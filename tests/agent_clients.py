"""Agent clients from PyPI as users run them, pointed at a base URL: scenarios shared by the one-gateway
tests (``tests/gateway/test_agent_apis.py``) and the replicas-behind-Envoy tests (``tests/mesh/``).

Each scenario changes nothing in the client but its base URL, its key and, where the client sends
no session id of its own, a session header; each returns what the caller checks in the process table.
"""

from __future__ import annotations

import asyncio
import time

import anthropic
import openai

from tests.live import MODEL, http


def session_entry(base: str, session_id: str, key: str | None = None, *, calls: int | None = None,
                  within: float = 5.0) -> dict:
    """``GET /v1/sessions/{id}``; with ``calls``, until it shows that many calls done (a replica's
    write behind reaches the shared store within a second)."""
    deadline = time.monotonic() + within
    while True:
        status, entry = http("GET", f"{base}/v1/sessions/{session_id}",
                             headers={"Authorization": f"Bearer {key}"} if key else None)
        if (status == 200 and (calls is None or entry["calls_done"] == calls)) or time.monotonic() > deadline:
            assert status == 200, entry
            return entry
        time.sleep(0.1)


def responses_chain(base: str, length: int = 10) -> tuple[str, str]:
    """A ``previous_response_id`` chain of ``length`` responses: (the first's id, the last's id)."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="none")
    first = client.responses.create(model=MODEL, input="Plan the trip.", max_output_tokens=8)
    assert first.id.startswith("resp_") and first.usage is not None and first.usage.output_tokens > 0
    previous = first.id
    for turn in range(length - 1):
        step = client.responses.create(model=MODEL, input=f"Step {turn}: go on.", max_output_tokens=6,
                                       previous_response_id=previous)
        assert step.status in ("completed", "incomplete") and step.output_text is not None
        previous = step.id
    assert client.responses.retrieve(previous).id == previous  # stored on the engine the chain ran on
    return first.id, previous


def responses_stream(base: str) -> tuple[str, int]:
    """One streamed response: its id and its output tokens."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="none")
    with client.responses.stream(model=MODEL, input="Stream this.", max_output_tokens=6) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_response()
    assert events[0] == "response.created" and events[-1] in ("response.completed", "response.incomplete")
    assert final.usage is not None
    assert_output_tokens(final.usage.output_tokens, 6, hit_limit=final.status == "incomplete")
    return final.id, final.usage.output_tokens


def assert_output_tokens(tokens: int, limit: int, *, hit_limit: bool) -> None:
    """The random-weight model may sample its end-of-sequence token at any step: a reply cut by the
    limit has exactly ``limit`` tokens, one ended by the model between one and ``limit``."""
    assert (tokens == limit) if hit_limit else (1 <= tokens <= limit), (tokens, limit, hit_limit)


def anthropic_conversation(base: str, session: str, turns: int = 5) -> None:
    """A ``turns``-turn Messages conversation under Claude Code's session header, then one streamed turn."""
    client = anthropic.Anthropic(base_url=base, api_key="none",
                                 default_headers={"x-claude-code-session-id": session})
    history: list[dict] = []
    for turn in range(turns):
        history.append({"role": "user", "content": f"turn {turn}"})
        message = client.messages.create(model=MODEL, max_tokens=6, messages=history)
        assert message.type == "message" and message.usage.output_tokens > 0
        history.append({"role": "assistant", "content": message.content[0].text or "."})
    with client.messages.stream(model=MODEL, max_tokens=6, messages=[{"role": "user", "content": "go"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.stop_reason in ("max_tokens", "end_turn")
    assert_output_tokens(final.usage.output_tokens, 6, hit_limit=final.stop_reason == "max_tokens")
    assert text == "".join(b.text for b in final.content)


def agents_sdk_run(base: str, session: str) -> None:
    """The OpenAI Agents SDK on its default model, the Responses API."""
    import agents

    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", default_headers={"x-session-id": session})
    agents.set_tracing_disabled(True)
    # the tiny random model never ends a reply by itself, and the SDK refuses an incomplete one: every
    # token stops it (vLLM's stop_token_ids), so the reply is complete after one token
    agent = agents.Agent(name="planner", instructions="Answer briefly.",
                         model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
                         model_settings=agents.ModelSettings(max_tokens=8,
                                                             extra_body={"stop_token_ids": list(range(256))}))
    result = asyncio.run(agents.Runner.run(agent, "What is next?"))
    assert isinstance(result.final_output, str)


def langgraph_run(base: str, session: str) -> None:
    """A two-step LangGraph graph over ``ChatOpenAI``: two calls of one program."""
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph

    model = ChatOpenAI(model=MODEL, base_url=base + "/v1", api_key="none", max_tokens=8,
                       default_headers={"x-session-id": session})

    def think(state: dict) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("think", think)
    builder.add_node("think_again", think)
    builder.add_edge(START, "think")
    builder.add_edge("think", "think_again")
    builder.add_edge("think_again", END)
    state = builder.compile().invoke({"messages": [("user", "Say something.")]})
    assert [m.type for m in state["messages"]] == ["human", "ai", "ai"]
