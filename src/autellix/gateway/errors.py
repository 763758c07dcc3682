"""OpenAI-style errors: ``{"error": {"message", "type", "code"}}`` with a 4xx/5xx status."""

from __future__ import annotations

import orjson
from aiohttp import web


class APIError(Exception):
    """Raised anywhere in a request; the middleware turns it into a response.

    Raised before any state changes, so a rejected request leaves the process
    table as it found it.
    """

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}

    def response(self) -> web.Response:
        return web.Response(status=self.status, body=orjson.dumps(self.body()), content_type="application/json")


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> APIError:
    return APIError(400, message, param=param, code=code)


def not_found(message: str, *, code: str) -> APIError:
    return APIError(404, message, code=code)


def unavailable(message: str) -> APIError:
    return APIError(503, message, type="service_unavailable", code="no_engine_available")


def upstream_failed(message: str) -> APIError:
    return APIError(502, message, type="upstream_error", code="engine_failed")
