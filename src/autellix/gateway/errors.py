"""OpenAI-style errors (``autellix.protocol.APIError``) as aiohttp responses."""

from __future__ import annotations

import orjson
from aiohttp import web

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


__all__ = ["APIError", "bad_request", "error_response", "not_found", "unavailable", "upstream_failed"]
