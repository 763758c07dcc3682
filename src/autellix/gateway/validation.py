"""Request validation: every check runs before any state changes, and a bad
request gets an OpenAI-style 400 naming the parameter."""

from __future__ import annotations

from typing import Any

from autellix.gateway.errors import bad_request


def check_body(body: Any, route: str) -> dict[str, Any]:
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
    _check_options(body)
    return body


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required and must be a non-empty array.", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string 'role'.", param="messages")


def _check_prompt(prompt: Any) -> None:
    if not isinstance(prompt, str | list) or (isinstance(prompt, list) and not prompt):
        raise bad_request("'prompt' is required: a string or an array.", param="prompt")


def _check_options(body: dict[str, Any]) -> None:
    if "stream" in body and not isinstance(body["stream"], bool):
        raise bad_request("'stream' must be a boolean.", param="stream")
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise bad_request(f"'{name}' must be a positive integer.", param=name)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object.", param="stream_options")
