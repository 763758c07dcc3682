"""OpenAI-style errors (``autellix.protocol.APIError``) as aiohttp responses, including the
ones aiohttp answers itself before any route or middleware runs."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler

from autellix.protocol import APIError

#: Seconds a client should wait after a 503 (no engine can take the call now): engines come back
#: within a health-check period or a breaker's cooldown.
UNAVAILABLE_RETRY_AFTER = "1"


def error_response(exc: APIError) -> web.Response:
    """The OpenAI-style answer; 429 and 503 say when to come back (``Retry-After``)."""
    headers = None
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        headers = {"Retry-After": str(retry_after)}
    elif exc.status in (429, 503):
        headers = {"Retry-After": UNAVAILABLE_RETRY_AFTER}
    return web.Response(status=exc.status, body=orjson.dumps(exc.body()), content_type="application/json",
                        headers=headers)


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> APIError:
    return APIError(400, message, param=param, code=code)


def not_found(message: str, *, code: str) -> APIError:
    return APIError(404, message, code=code)


def unavailable(message: str) -> APIError:
    return APIError(503, message, type="service_unavailable", code="no_engine_available")


def upstream_failed(message: str) -> APIError:
    return APIError(502, message, type="upstream_error", code="engine_failed")


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


__all__ = ["APIError", "GatewayRunner", "OpenAIErrorRequestHandler", "bad_request", "error_response", "not_found",
           "unavailable", "upstream_failed"]
