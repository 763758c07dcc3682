"""Errors (``autellix.protocol.APIError``) as aiohttp responses, in the shape of the API a route speaks
(OpenAI's or Anthropic's), including the ones aiohttp answers itself before any route or middleware runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler

from autellix.protocol import APIError

#: Seconds a client should wait after a 503 (no engine can take the call now): engines come back
#: within a health-check period or a breaker's cooldown.
UNAVAILABLE_RETRY_AFTER = "1"


#: An error's body in one API's shape.
ErrorShape = Callable[[APIError], dict[str, Any]]

#: Anthropic's error types by HTTP status (its Messages API's error shape).
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                         503: "overloaded_error", 529: "overloaded_error"}


def openai_shape(exc: APIError) -> dict[str, Any]:
    """``{"error": {"message", "type", "code", "param"}}``."""
    return exc.body()


def anthropic_shape(exc: APIError) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``: Anthropic's type by status (``api_error`` for any
    other 5xx, ``invalid_request_error`` for any other 4xx)."""
    kind = ANTHROPIC_ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def from_http_exception(exc: web.HTTPException) -> APIError:
    """aiohttp's own answers (no such route, wrong method, body too large) as an ``APIError``."""
    code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status, "http_error")
    return APIError(exc.status, exc.reason, code=code)


def error_response(exc: APIError, shape: ErrorShape = openai_shape) -> web.Response:
    """The error's answer in ``shape``; 429 and 503 say when to come back (``Retry-After``)."""
    headers = None
    retry_after = exc.retry_after
    if retry_after is not None:
        headers = {"Retry-After": str(retry_after)}
    elif exc.status in (429, 503):
        headers = {"Retry-After": UNAVAILABLE_RETRY_AFTER}
    return web.Response(status=exc.status, body=orjson.dumps(shape(exc)), content_type="application/json",
                        headers=headers)


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> APIError:
    return APIError(400, message, param=param, code=code)


def not_found(message: str, *, code: str) -> APIError:
    return APIError(404, message, code=code)


def unavailable(message: str) -> APIError:
    return APIError(503, message, type="service_unavailable", code="no_engine_available")


def openai_error_shape(raw: bytes) -> bytes:
    """An engine's error in OpenAI's shape: vLLM says ``"code": 400`` (a number) where OpenAI's
    ``code`` is a string or null (schemathesis found it against ``/openapi.json``)."""
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return raw
    changed = False
    for name in ("code", "param", "type"):
        value = error.get(name)
        if value is not None and not isinstance(value, str):
            error[name], changed = str(value), True
    if not isinstance(error.get("message"), str):
        error["message"], changed = str(error.get("message", "")), True
    return orjson.dumps(answer) if changed else raw


def anthropic_error_shape(raw: bytes, status: int) -> bytes:
    """An engine's error in Anthropic's shape: vLLM answers some refusals of its Messages route (its request
    validation) in its OpenAI-like shape; the client gets ``{"type": "error", "error": {"type", "message"}}``."""
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        answer = None
    if isinstance(answer, dict) and answer.get("type") == "error" and isinstance(answer.get("error"), dict):
        return raw
    error = answer.get("error") if isinstance(answer, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    text = message if isinstance(message, str) else raw.decode(errors="replace")[:2000]
    return orjson.dumps(anthropic_shape(APIError(status, text)))


class OpenAIErrorRequestHandler(RequestHandler):
    """aiohttp's connection handler, answering what its HTTP parser refuses (a request line or
    header field over ``max_line_size``/``max_field_size``, too many headers, a malformed
    request) in the OpenAI error shape, not aiohttp's plain text. No middleware sees those
    requests: aiohttp calls ``handle_error`` directly."""

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs it; raises if bytes went out already
        if isinstance(exc, LineTooLong):  # the parser's message quotes the line: never echo a header back
            limit = exc.args[1] if len(exc.args) > 1 else "its limit of"
            api = APIError(431, f"A request line or header field is longer than the gateway accepts ({limit} "
                           "bytes).", code="header_too_large")
        elif status >= 500:
            api = APIError(500, "Internal gateway error.", type="server_error", code="internal_error")
        else:
            api = APIError(status, "Malformed HTTP request.", code="bad_http_request")
        response = error_response(api)
        response.force_close()  # the connection's parser state is unknown after a refusal
        return response


class _OpenAIErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        return OpenAIErrorRequestHandler(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer parser errors in the OpenAI shape."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _OpenAIErrorServer  # same object, same state: only the handler it makes differs
        return server


__all__ = [
    "ANTHROPIC_ERROR_TYPES",
    "APIError",
    "ErrorShape",
    "GatewayRunner",
    "OpenAIErrorRequestHandler",
    "anthropic_error_shape",
    "anthropic_shape",
    "bad_request",
    "error_response",
    "from_http_exception",
    "not_found",
    "openai_error_shape",
    "openai_shape",
    "unavailable",
]
