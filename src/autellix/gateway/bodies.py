"""JSON in and out of the gateway's listeners: request bodies read within their limit, answers dumped."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from autellix.gateway.errors import bad_request
from autellix.protocol import APIError


async def read_json(request: web.Request) -> Any:
    """The request's JSON body; 413 past the app's size limit, 400 when it is not JSON."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise APIError(413, f"Request body too large: {exc.text}", code="request_too_large") from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"Invalid JSON body: {exc}.", code="invalid_json") from None


def dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def json_answer(obj: Any, status: int = 200) -> web.Response:
    return web.json_response(obj, status=status, dumps=dumps)


__all__ = ["dumps", "json_answer", "read_json"]
