"""The operator's client of the gateway's HTTP API (aiohttp).

Sessions (``docs/gateway.md``): POST /v1/sessions, GET and DELETE
/v1/sessions/{id}. The engine pool's admin API: GET /admin/engines (every
engine with its load, in-flight calls and whether it drains) and POST
/admin/engines/drain or /undrain ``{"url": ...}``. Kept in one small module so
a change of those routes is a change here only.

With an admin URL (the gateway's admin listener, its own port and keys) the
operator holds no tenant key at all: it drains through the admin routes and
opens, reads and ends an AgentProgram's session there on behalf of the
program's tenant (``POST /admin/sessions {"tenant": ...}``), so the session
belongs to the key the Job calls with. Without one (a gateway without an admin
listener) it uses the tenant routes with its own key, as before.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from autellix.kube.autoscaler import EngineLoad
from autellix.protocol import (
    ADMIN_DRAIN_PATH,
    ADMIN_ENGINES_PATH,
    ADMIN_SESSIONS_PATH,
    ADMIN_UNDRAIN_PATH,
    SESSIONS_PATH,
    session_path,
)


class GatewayError(RuntimeError):
    """The gateway answered with an error (or could not be reached)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class GatewayClient:
    def __init__(self, http: aiohttp.ClientSession, api_key: str | None = None, timeout: float = 10.0, *,
                 default_gateway: str | None = None, admin_url: str | None = None,
                 admin_key: str | None = None) -> None:
        self._http = http
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        #: The gateway whose admin listener is ``admin_url`` (a program may name another gateway).
        self._default_gateway = default_gateway.rstrip("/") if default_gateway else None
        self._admin_url = admin_url.rstrip("/") if admin_url else None
        self._admin_headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}

    def admin_of(self, gateway: str) -> str | None:
        """The admin base URL that serves ``gateway``, None when only its tenant routes can be used."""
        if self._admin_url and (self._default_gateway is None or gateway.rstrip("/") == self._default_gateway):
            return self._admin_url
        return None

    async def _call(self, method: str, url: str, body: Any = None, *, admin: bool = False) -> Any:
        headers = self._admin_headers if admin else self._headers
        try:
            async with self._http.request(method, url, json=body, headers=headers,
                                          timeout=self._timeout) as resp:
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise GatewayError(f"{method} {url}: {exc.__class__.__name__}: {exc}") from exc
        try:
            payload = json.loads(text) if text.strip() else None
        except ValueError:  # a proxy's own answer (Envoy's "no healthy upstream"), not the gateway's
            payload = None
            if resp.status < 400:
                raise GatewayError(f"{method} {url}: {resp.status} with a body that is not JSON: {text[:80]!r}",
                                   resp.status) from None
        if resp.status >= 400:
            error = payload.get("error") if isinstance(payload, dict) else None
            detail = error.get("message") if isinstance(error, dict) else text.strip()[:200]
            raise GatewayError(f"{method} {url}: {resp.status} {detail or resp.reason}", resp.status)
        return payload

    async def open_session(self, gateway: str, tenant: str | None = None, priority: int = 0) -> str:
        """A new session owned by ``tenant`` (through the admin listener), else by this client's key, with its
        priority class for admission under overload (sent only when not the default class, 0)."""
        fields = {"priority": priority} if priority else {}
        if (admin := self.admin_of(gateway)) is not None:
            payload = await self._call("POST", f"{admin}{ADMIN_SESSIONS_PATH}", {"tenant": tenant, **fields},
                                       admin=True)
        else:
            payload = await self._call("POST", f"{gateway}{SESSIONS_PATH}", fields or None)
        if not isinstance(payload, dict) or not payload.get("id"):
            raise GatewayError(f"POST {gateway}: a session answer without an id: {payload!r}"[:300])
        return str(payload["id"])

    def _session_url(self, gateway: str, session_id: str) -> tuple[str, bool]:
        if (admin := self.admin_of(gateway)) is not None:
            return f"{admin}{ADMIN_SESSIONS_PATH}/{session_id}", True
        return f"{gateway}{session_path(session_id)}", False

    async def get_session(self, gateway: str, session_id: str) -> dict[str, Any] | None:
        """The session's process-table entry; None once it has ended or expired."""
        url, admin = self._session_url(gateway, session_id)
        try:
            return await self._call("GET", url, admin=admin)
        except GatewayError as exc:
            if exc.status == 404:
                return None
            raise

    async def end_session(self, gateway: str, session_id: str) -> dict[str, Any] | None:
        """Ends the session; its final entry, or None if it had already ended."""
        url, admin = self._session_url(gateway, session_id)
        try:
            return await self._call("DELETE", url, admin=admin)
        except GatewayError as exc:
            if exc.status == 404:
                return None
            raise

    async def engines(self, gateway: str) -> list[EngineLoad]:
        admin = self.admin_of(gateway)
        url = f"{admin or gateway}{ADMIN_ENGINES_PATH}"
        payload = await self._call("GET", url, admin=admin is not None)
        if not isinstance(payload, dict):
            raise GatewayError(f"GET {url}: expected the engines as a JSON object, got {payload!r}"[:300])
        return [EngineLoad(url=e["url"], load=float(e.get("load", 0.0)), inflight=int(e.get("inflight", 0)),
                           draining=bool(e.get("draining", False)), healthy=bool(e.get("healthy", True)))
                for e in payload.get("data", [])]

    async def drain(self, gateway: str, url: str, draining: bool = True) -> None:
        admin = self.admin_of(gateway)
        await self._call("POST", f"{admin or gateway}{ADMIN_DRAIN_PATH if draining else ADMIN_UNDRAIN_PATH}",
                         {"url": url}, admin=admin is not None)
