"""What each call API's front door reads of a body beyond checking it."""

from __future__ import annotations

import pytest

from autellix.gateway.dialects import CHAT, COMPLETION, MESSAGES, RESPONSES


@pytest.mark.parametrize(("dialect", "body", "offers"), [
    ("chat", {"tools": [{"type": "function"}]}, True),
    ("chat", {"tools": [{"type": "function"}], "tool_choice": "required"}, True),
    ("chat", {"tools": [{"type": "function"}], "tool_choice": "none"}, False),
    ("chat", {"tools": []}, False),
    ("completions", {"prompt": "x"}, False),
    ("responses", {"tools": [{"type": "function"}], "tool_choice": "auto"}, True),
    ("messages", {"tools": [{"name": "lookup"}], "tool_choice": {"type": "any"}}, True),
    ("messages", {"tools": [{"name": "lookup"}], "tool_choice": {"type": "none"}}, False),
])
def test_a_call_offers_tools_unless_it_rules_them_out(dialect: str, body: dict, offers: bool) -> None:
    front = {"chat": CHAT, "completions": COMPLETION, "responses": RESPONSES, "messages": MESSAGES}[dialect]
    assert front.offers_tools(body) is offers
