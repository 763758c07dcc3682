"""The gateway's one HTTP client to its engines: connection pools opened with the app's event loop.

Every request to an engine carries the engine token, so engines answer only their gateways. Calls
go through ``calls`` (``autellix.gateway.engine_calls``: the call leg, at a fraction of a general
client's cost a call); probes, feedback and record requests through aiohttp's client (``get``,
``post``, ``delete``). It exists before the event loop runs (the composition root builds the whole
gateway at once) and opens its pools when the app starts: they belong to a running loop.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from autellix.gateway.engine_calls import EngineCalls
from autellix.protocol import ENGINE_TOKEN_HEADER

#: Idle connections to engines are closed after this many seconds, before the engine closes them
#: (vLLM's API server, uvicorn: 5 s, ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``): a call sent on a connection
#: the engine is closing is dropped unread (``gateway.upstream.open_upstream`` sends it once more).
ENGINE_KEEPALIVE_S = 4.0


class EngineHttp:
    """``calls`` for calls; ``get``, ``post`` and ``delete`` as aiohttp's, once started; the engine token on
    every request."""

    def __init__(self, *, token: str | None) -> None:
        self.token = token
        self._session: aiohttp.ClientSession | None = None
        self._calls: EngineCalls | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=ENGINE_KEEPALIVE_S)
        headers = {ENGINE_TOKEN_HEADER: self.token} if self.token else None
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False, headers=headers,
                                              timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))
        self._calls = EngineCalls(headers=headers, keepalive=ENGINE_KEEPALIVE_S)

    async def stop(self) -> None:
        if self._calls is not None:
            await self._calls.close()
            self._calls = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def calls(self) -> EngineCalls:
        if self._calls is None:
            raise RuntimeError("the engines' HTTP client is not open (the gateway has not started)")
        return self._calls

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the engines' HTTP client is not open (the gateway has not started)")
        return self._session

    def get(self, url: str, **kwargs: Any) -> Any:
        return self.session.get(url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> Any:
        return self.session.post(url, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> Any:
        return self.session.delete(url, **kwargs)


__all__ = ["ENGINE_KEEPALIVE_S", "EngineHttp"]
