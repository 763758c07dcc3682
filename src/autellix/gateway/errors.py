"""OpenAI-style errors (``autellix.protocol.APIError``) as aiohttp responses."""

from __future__ import annotations

import orjson
from aiohttp import web

from autellix.protocol import APIError


def error_response(exc: APIError) -> web.Response:
    return web.Response(status=exc.status, body=orjson.dumps(exc.body()), content_type="application/json")


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> APIError:
    return APIError(400, message, param=param, code=code)


def not_found(message: str, *, code: str) -> APIError:
    return APIError(404, message, code=code)


def unavailable(message: str) -> APIError:
    return APIError(503, message, type="service_unavailable", code="no_engine_available")


def upstream_failed(message: str) -> APIError:
    return APIError(502, message, type="upstream_error", code="engine_failed")


__all__ = ["APIError", "bad_request", "error_response", "not_found", "unavailable", "upstream_failed"]
