"""The bound on an engine's stored Responses API responses: the oldest dropped past it, the newest kept.

The middleware itself runs in every engine the tests start (``autellix.engine.launch``); the chains of
``tests/gateway/test_agent_apis.py`` go through it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from autellix.engine.responses_store import DEFAULT_KEPT, ENV_KEPT, ResponsesStoreBound, kept_from, trim


def test_trim_drops_the_oldest_past_the_bound_in_each_store() -> None:
    responses = {f"resp_{i}": i for i in range(7)}
    messages = {f"resp_{i}": [i] for i in range(3)}
    assert trim([responses, messages], 4) == 3
    assert list(responses) == ["resp_3", "resp_4", "resp_5", "resp_6"] and len(messages) == 3
    assert trim([responses, messages], 4) == 0


@pytest.mark.parametrize(("raw", "kept"), [("", DEFAULT_KEPT), ("25", 25)])
def test_the_bound_from_the_environment(raw: str, kept: int) -> None:
    assert kept_from({ENV_KEPT: raw}) == kept


@pytest.mark.parametrize("raw", ["0", "-3", "many"])
def test_a_bad_bound_is_refused_with_its_name(raw: str) -> None:
    with pytest.raises(ValueError, match=ENV_KEPT):
        kept_from({ENV_KEPT: raw})


def test_the_middleware_trims_after_a_response_and_leaves_other_routes_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_KEPT, "2")
    serving = SimpleNamespace(response_store={}, msg_store={})
    app_state = SimpleNamespace(state=SimpleNamespace(openai_serving_responses=serving))

    async def app(scope: dict, receive: object, send: object) -> None:  # vLLM storing what it served
        serving.response_store[f"resp_{len(serving.response_store)}"] = {}
        serving.msg_store[f"resp_{len(serving.msg_store)}"] = []

    bound = ResponsesStoreBound(app)
    for path in ("/v1/chat/completions", "/v1/chat/completions", "/v1/responses"):
        asyncio.run(bound({"type": "http", "method": "POST", "path": path, "app": app_state}, None, None))
    assert list(serving.response_store) == ["resp_1", "resp_2"] and list(serving.msg_store) == ["resp_1", "resp_2"]
