"""Request validation: every check runs before any state changes, and a bad
request gets an OpenAI-style 400 naming the parameter."""

from __future__ import annotations

from typing import Any

from autellix.gateway.errors import bad_request

#: The roles OpenAI's chat API accepts; any other is a 400, as OpenAI answers.
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
#: Upper bounds (``check_body``'s defaults): one call may not ask for unbounded work.
MAX_N = 16
MAX_TOKENS = 32_768


def check_body(body: Any, route: str, *, max_n: int = MAX_N, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """The request body of ``route`` (``chat`` or ``completion``), checked; raises ``APIError``."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string.", param="model")
    if route == "chat":
        _check_messages(body.get("messages"))
    else:
        _check_prompt(body.get("prompt"))
    _check_options(body, max_n=max_n, max_tokens=max_tokens)
    return body


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required and must be a non-empty array.", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string 'role'.", param="messages")
        if m["role"] not in ROLES:
            raise bad_request(f"messages[{i}].role {m['role'][:64]!r} is not one of {', '.join(sorted(ROLES))}.",
                              param=f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or ("text" in part and not isinstance(part["text"], str)):
                    raise bad_request(f"messages[{i}].content[{j}] must be an object whose 'text' is a string.",
                                      param=f"messages[{i}].content[{j}]")
        elif content is not None and not isinstance(content, str):
            raise bad_request(f"messages[{i}].content must be a string, an array of parts or null.",
                              param=f"messages[{i}].content")


def _check_prompt(prompt: Any) -> None:
    if not isinstance(prompt, str | list) or (isinstance(prompt, list) and not prompt):
        raise bad_request("'prompt' is required: a string or an array.", param="prompt")


def _check_options(body: dict[str, Any], *, max_n: int, max_tokens: int) -> None:
    if "stream" in body and not isinstance(body["stream"], bool):
        raise bad_request("'stream' must be a boolean.", param="stream")
    for name, cap in (("max_tokens", max_tokens), ("max_completion_tokens", max_tokens), ("n", max_n)):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= cap):
            raise bad_request(f"'{name}' must be an integer from 1 to {cap}.", param=name)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object.", param="stream_options")
