"""What a call or a session says of its program's size: the hints read, and from which clients.

A program may say how many tokens it will generate in all. The process table
ranks it at the larger of the service it attained and the service it declared
(``autellix.core.ProcessTable.declared``): declaring too little gains nothing,
declaring what it will take puts it, from its first call, where the clairvoyant
order would (``docs/scheduling.md``, "Declared sizes"). Read, in this order, the
first present counting:

* ``X-Autellix-Expected-Tokens: N`` on a call of any API (Chat, Completions,
  Responses, Messages), from any client that can set a header;
* ``nvext.agent_hints`` in the body, NVIDIA Dynamo's per-request hints as the
  NVIDIA NeMo Agent Toolkit sends them: ``total_requests`` (the calls it expects
  in the conversation) times ``osl`` (the output tokens it expects per call).
  ``osl`` alone says one call's size, not the program's, and is not read; nor are
  ``priority``, ``latency_sensitivity`` and the rest (``docs/agents.md``);
* ``expected_tokens`` in ``POST /v1/sessions``'s body, for a session opened first.

A program's declaration only grows: a later, smaller one changes nothing.
Malformed hints are a 400 before anything changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autellix.protocol import EXPECTED_TOKENS_HEADER, MAX_EXPECTED_TOKENS, APIError

#: NVIDIA Dynamo's request extension and its agent hints' keys read here.
NVEXT_FIELD, AGENT_HINTS_FIELD = "nvext", "agent_hints"
TOTAL_REQUESTS_HINT, OSL_HINT = "total_requests", "osl"


def expected_tokens(value: object, param: str) -> int:
    """A declared size: an integer from 1 to ``MAX_EXPECTED_TOKENS`` (a header's text or a JSON number); else 400."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_EXPECTED_TOKENS:
        raise APIError(400, f"{param} must be an integer from 1 to {MAX_EXPECTED_TOKENS} (the tokens the program "
                       "expects to generate in all).", param=param)
    return value


def declared_tokens(headers: Mapping[str, str], body: Mapping[str, Any]) -> int:
    """The tokens a call says its program will generate in all; 0 when it says nothing."""
    value = headers.get(EXPECTED_TOKENS_HEADER)
    if value is not None:
        return expected_tokens(value, EXPECTED_TOKENS_HEADER)
    hints = _agent_hints(body)
    if hints is None or TOTAL_REQUESTS_HINT not in hints or OSL_HINT not in hints:
        return 0
    prefix = f"{NVEXT_FIELD}.{AGENT_HINTS_FIELD}."
    calls = _count(hints[TOTAL_REQUESTS_HINT], prefix + TOTAL_REQUESTS_HINT)
    per_call = _count(hints[OSL_HINT], prefix + OSL_HINT)
    return min(calls * per_call, MAX_EXPECTED_TOKENS)


def _agent_hints(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    nvext = body.get(NVEXT_FIELD)
    if nvext is None:
        return None
    if not isinstance(nvext, dict) or not isinstance(hints := nvext.get(AGENT_HINTS_FIELD), dict | None):
        raise APIError(400, f"'{NVEXT_FIELD}' must be an object, its '{AGENT_HINTS_FIELD}' an object.",
                       param=NVEXT_FIELD)
    return hints


def _count(value: object, param: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_EXPECTED_TOKENS:
        raise APIError(400, f"'{param}' must be an integer from 1 to {MAX_EXPECTED_TOKENS}.", param=param)
    return value


__all__ = ["declared_tokens", "expected_tokens"]
