"""Request validation: every check runs before any state changes, and a bad
request gets a 400 naming the parameter (in the shape of the API its route speaks)."""

from __future__ import annotations

from typing import Any, NamedTuple

from autellix.control.sessions import priority_class
from autellix.control.size_hints import expected_tokens
from autellix.gateway.errors import bad_request
from autellix.protocol import EXPECTED_TOKENS_FIELD

#: The roles OpenAI's chat API accepts; any other is a 400, as OpenAI answers.
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
#: Upper bounds (``check_body``'s defaults): one call may not ask for unbounded work.
MAX_N = 16
MAX_TOKENS = 32_768


def check_body(body: Any, route: str, *, max_n: int = MAX_N, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """The request body of ``route`` (``chat`` or ``completion``), checked; raises ``APIError``."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    _check_model(body)
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
        _check_bound(body, name, cap)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object.", param="stream_options")


# ---- OpenAI's Responses ---------------------------------------------------------------------
#: Longest ``previous_response_id`` accepted (the gateway's ids are ``resp_`` and 32 hex digits).
MAX_RESPONSE_ID = 256


def check_responses_body(body: Any, *, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """A ``POST /v1/responses`` body, checked; raises ``APIError``. ``request_id`` is the gateway's
    (it names the stored response, so a chained call can find its engine) and ``background`` responses
    would run unattended, past the call the gateway charges: both are refused."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    _check_model(body)
    source = body.get("input")
    if not isinstance(source, str | list) or (isinstance(source, list) and not source):
        raise bad_request("'input' is required: a string or a non-empty array of input items.", param="input")
    if isinstance(source, list):
        for i, item in enumerate(source):
            if not isinstance(item, dict):
                raise bad_request(f"input[{i}] must be an object.", param=f"input[{i}]")
    for name in ("instructions", "previous_response_id"):
        value = body.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            raise bad_request(f"'{name}' must be a non-empty string.", param=name)
    previous = body.get("previous_response_id")
    if isinstance(previous, str) and (len(previous) > MAX_RESPONSE_ID or not previous.isprintable()):
        raise bad_request(f"'previous_response_id' must be 1 to {MAX_RESPONSE_ID} printable characters.",
                          param="previous_response_id")
    for name in ("stream", "store", "background"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise bad_request(f"'{name}' must be a boolean.", param=name)
    if body.get("background"):
        raise bad_request("'background' responses are not served through the gateway: it charges a program for "
                          "the calls it relays; send the call in the foreground (stream it to see it progress).",
                          param="background", code="unsupported_parameter")
    if "request_id" in body:
        raise bad_request("'request_id' is set by the gateway (it names the stored response).", param="request_id",
                          code="unsupported_parameter")
    _check_bound(body, "max_output_tokens", max_tokens)
    return body


# ---- Anthropic's Messages -------------------------------------------------------------------
#: The roles Anthropic's Messages API accepts in ``messages`` (the system prompt is its own field).
MESSAGE_ROLES = frozenset({"user", "assistant"})


def check_messages_body(body: Any, *, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """A ``POST /v1/messages`` body, checked; raises ``APIError`` (answered in Anthropic's error shape)."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    _check_model(body)
    if "max_tokens" not in body:
        raise bad_request("'max_tokens' is required.", param="max_tokens")
    _check_bound(body, "max_tokens", max_tokens)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required and must be a non-empty array.", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in MESSAGE_ROLES:
            raise bad_request(f"messages[{i}] must be an object whose 'role' is 'user' or 'assistant'.",
                              param=f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):
            for j, block in enumerate(content):
                if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                    raise bad_request(f"messages[{i}].content[{j}] must be an object with a string 'type'.",
                                      param=f"messages[{i}].content[{j}]")
        elif not isinstance(content, str):
            raise bad_request(f"messages[{i}].content must be a string or an array of content blocks.",
                              param=f"messages[{i}].content")
    system = body.get("system")
    if system is not None and not isinstance(system, str) and not (
            isinstance(system, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                             and isinstance(b.get("text"), str) for b in system)):
        raise bad_request("'system' must be a string or an array of text blocks ({\"type\": \"text\", "
                          "\"text\": ...}).", param="system")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise bad_request("'stream' must be a boolean.", param="stream")
    return body


def check_count_tokens_body(body: Any) -> dict[str, Any]:
    """A ``POST /v1/messages/count_tokens`` body: a Messages body without ``max_tokens``."""
    if isinstance(body, dict) and "max_tokens" not in body:
        check_messages_body({**body, "max_tokens": 1})
        return body
    return check_messages_body(body)


def _check_model(body: dict[str, Any]) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string.", param="model")


def _check_bound(body: dict[str, Any], name: str, cap: int) -> None:
    value = body.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= cap):
        raise bad_request(f"'{name}' must be an integer from 1 to {cap}.", param=name)


class SessionFields(NamedTuple):
    """What ``POST /v1/sessions`` says of the new program."""

    parent: str | None = None
    #: Its priority class for admission (0 unless said).
    priority: int = 0
    #: The tokens it expects to generate in all (0 unless said: ``autellix.control.size_hints``).
    expected_tokens: int = 0


def session_fields(body: Any, *, also: frozenset[str] = frozenset()) -> SessionFields:
    """``POST /v1/sessions``'s body: empty (``{}``), or any of ``{"parent": "<session id>", "priority": N,
    "expected_tokens": N}`` (and the fields ``also`` names, which the caller reads)."""
    if not isinstance(body, dict) or set(body) - {"parent", "priority", EXPECTED_TOKENS_FIELD} - also:
        raise bad_request('The body must be empty or {"parent": "<session id>", "priority": <integer>, '
                          '"expected_tokens": <integer>} (each optional).', param="parent")
    parent = body.get("parent")
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise bad_request("'parent' must be a session id (a non-empty string) or null.", param="parent")
    priority = body.get("priority")
    expected = body.get(EXPECTED_TOKENS_FIELD)
    return SessionFields(parent, 0 if priority is None else priority_class(priority, "priority"),
                         0 if expected is None else expected_tokens(expected, EXPECTED_TOKENS_FIELD))
