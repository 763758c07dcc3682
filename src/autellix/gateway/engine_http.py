"""The gateway's one HTTP client to its engines: a connection pool opened with the app's event loop.

Every request to an engine (calls, probes, feedback) goes through it and carries the engine token,
so engines answer only their gateways. It exists before the event loop runs (the composition root
builds the whole gateway at once) and opens its aiohttp session when the app starts: aiohttp
sessions belong to a running loop.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from autellix.protocol import ENGINE_TOKEN_HEADER

#: Idle connections to engines are closed after this many seconds, before the engine closes them
#: (vLLM's API server, uvicorn: 5 s, ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``): a call sent on a connection
#: the engine is closing is dropped unread (``gateway.upstream.open_upstream`` sends it once more).
ENGINE_KEEPALIVE_S = 4.0


class EngineHttp:
    """``get``, ``post`` and ``delete`` as aiohttp's, once started; the engine token on every request."""

    def __init__(self, *, token: str | None) -> None:
        self.token = token
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=ENGINE_KEEPALIVE_S)
        headers = {ENGINE_TOKEN_HEADER: self.token} if self.token else None
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False, headers=headers,
                                              timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

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
