"""The operator's client of the gateway's HTTP API (aiohttp).

Sessions (``docs/gateway.md``): POST /v1/sessions, GET and DELETE
/v1/sessions/{id}. The engine pool's admin API: GET /admin/engines (every
engine with its load, in-flight calls and whether it drains) and POST
/admin/engines/drain or /undrain ``{"url": ...}``. Kept in one small module so
a change of those routes is a change here only.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from autellix.kube.autoscaler import EngineLoad
from autellix.protocol import ADMIN_DRAIN_PATH, ADMIN_ENGINES_PATH, ADMIN_UNDRAIN_PATH, SESSIONS_PATH, session_path


class GatewayError(RuntimeError):
    """The gateway answered with an error (or could not be reached)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class GatewayClient:
    def __init__(self, http: aiohttp.ClientSession, api_key: str | None = None, timeout: float = 10.0) -> None:
        self._http = http
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def _call(self, method: str, url: str, body: Any = None) -> Any:
        try:
            async with self._http.request(method, url, json=body, headers=self._headers,
                                          timeout=self._timeout) as resp:
                payload = await resp.json(content_type=None) if resp.content_length != 0 else None
                if resp.status >= 400:
                    detail = (payload or {}).get("error", {}).get("message") if isinstance(payload, dict) else None
                    raise GatewayError(f"{method} {url}: {resp.status} {detail or resp.reason}", resp.status)
                return payload
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise GatewayError(f"{method} {url}: {exc.__class__.__name__}: {exc}") from exc

    async def open_session(self, gateway: str) -> str:
        payload = await self._call("POST", f"{gateway}{SESSIONS_PATH}")
        return str(payload["id"])

    async def get_session(self, gateway: str, session_id: str) -> dict[str, Any] | None:
        """The session's process-table entry; None once it has ended or expired."""
        try:
            return await self._call("GET", f"{gateway}{session_path(session_id)}")
        except GatewayError as exc:
            if exc.status == 404:
                return None
            raise

    async def end_session(self, gateway: str, session_id: str) -> dict[str, Any] | None:
        """Ends the session; its final entry, or None if it had already ended."""
        try:
            return await self._call("DELETE", f"{gateway}{session_path(session_id)}")
        except GatewayError as exc:
            if exc.status == 404:
                return None
            raise

    async def engines(self, gateway: str) -> list[EngineLoad]:
        payload = await self._call("GET", f"{gateway}{ADMIN_ENGINES_PATH}")
        return [EngineLoad(url=e["url"], load=float(e.get("load", 0.0)), inflight=int(e.get("inflight", 0)),
                           draining=bool(e.get("draining", False)), healthy=bool(e.get("healthy", True)))
                for e in payload.get("data", [])]

    async def drain(self, gateway: str, url: str, draining: bool = True) -> None:
        await self._call("POST", f"{gateway}{ADMIN_DRAIN_PATH if draining else ADMIN_UNDRAIN_PATH}", {"url": url})
