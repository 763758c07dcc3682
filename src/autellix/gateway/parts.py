"""The gateway's parts as the composition root wires them, and the few things they answer together.

``autellix.gateway.compose.build_gateway`` makes every part from the
configuration and hands each module the parts it uses; the routes reach them
through ``GATEWAY_KEY``. Nothing here builds anything or is set from outside.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from autellix.control import RequestController, Sessions
from autellix.control.admission import ProgramGate
from autellix.control.keys import KeyRing
from autellix.control.limits import TenantLimiter
from autellix.control.store.base import GatewayStore
from autellix.core import ProgramEntry
from autellix.gateway.call_path import CallPath
from autellix.gateway.config import GatewayConfig
from autellix.gateway.engines import EnginePool
from autellix.gateway.metrics import GatewayMetrics
from autellix.gateway.validation import SessionFields
from autellix.protocol import APIError

log = logging.getLogger("autellix.gateway")


class Service(Protocol):
    """A part with a life of its own (a background task, a listener): started in order, stopped in reverse."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class AdminAddress(Protocol):
    """Where the admin listener serves, once it does."""

    @property
    def url(self) -> str | None: ...


class NoAdminListener:
    url = None


@dataclass(frozen=True)
class Gateway:
    """One gateway's parts, wired; ``start`` and ``stop`` run its services' lives."""

    config: GatewayConfig
    #: Programs, stored responses and engine drains, in memory or shared with other replicas.
    store: GatewayStore
    sessions: Sessions
    pool: EnginePool
    controller: RequestController
    calls: CallPath
    limiter: TenantLimiter
    tenant_keys: KeyRing
    admin_keys: KeyRing
    metrics: GatewayMetrics
    #: Program admission under overload (None: off).
    admission: ProgramGate | None
    admin: AdminAddress
    services: Sequence[Service]

    async def start(self) -> None:
        started: list[Service] = []
        try:
            for service in self.services:
                await service.start()
                started.append(service)
        except BaseException:
            for service in reversed(started):
                await service.stop()
            raise

    async def stop(self) -> None:
        for service in reversed(self.services):
            try:
                await service.stop()
            except Exception:  # one part failing to stop must not keep the others running
                log.exception("stopping %r failed", service)

    @property
    def admin_url(self) -> str | None:
        return self.admin.url

    async def open_session(self, tenant: str | None, fields: SessionFields) -> ProgramEntry:
        """A session of ``tenant`` (a subagent of its session ``fields.parent``, if named): every check first
        (the parent is the tenant's and live: 404; the tenant's session bound: 429), then admission (a new
        program may wait while the engines are saturated, or get a 429), then the change."""
        now = time.monotonic()
        parent_id = await self.sessions.parent_of_new_session(fields.parent, tenant)
        self.limiter.check_session(tenant, now)
        entry = await self.sessions.open(now, tenant, parent=parent_id, priority=fields.priority)
        if fields.expected_tokens:
            self.store.programs.declare(entry.program_id, fields.expected_tokens)
        self.limiter.session_opened(tenant, entry.program_id, now)
        return entry

    async def end_session(self, session_id: str, tenant: str | None) -> ProgramEntry:
        """End the tenant's session ``session_id`` (404 when it is not the tenant's or not live)."""
        entry = await self.sessions.end(session_id, tenant)
        self.limiter.session_closed(tenant, entry.program_id, time.monotonic())
        self.pool.program_ended(entry.program_id, entry.engines)
        return entry

    def identify(self, key: str | None) -> str | None:
        """The caller's tenant by its key; None when tenant auth is off; 401 for a missing or wrong key."""
        if not self.tenant_keys.enabled:
            return None
        tenant = self.tenant_keys.tenant_of(key) if key else None
        if tenant is None:
            raise APIError(401, "Invalid or missing API key (Authorization: Bearer ... or x-api-key).",
                           type="authentication_error", code="invalid_api_key")
        return tenant.name

    def exposure_error(self, host: str) -> str | None:
        """Why serving on ``host`` (and the admin listener) would be open to anyone, or None."""
        if not self.tenant_keys.enabled and not self.config.allow_anonymous and not loopback(host):
            return (f"refusing to listen on {host} without tenant keys (--api-keys-file or $AUTELLIX_API_KEYS); "
                    "--allow-anonymous serves without them")
        if self.config.admin_port is not None and not self.admin_keys.enabled and not loopback(
                self.config.admin_host):
            return (f"refusing an admin listener on {self.config.admin_host} without admin keys "
                    "(--admin-keys-file or $AUTELLIX_ADMIN_KEYS)")
        return None


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: Where an app keeps its gateway's parts.
GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway", Gateway)


def tenant_key(request: web.Request) -> str | None:
    """The key a caller presents: ``Authorization: Bearer KEY`` (OpenAI's clients) or ``x-api-key: KEY``
    (Anthropic's)."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        return key.strip()
    return request.headers.get("x-api-key", "").strip() or None


def caller(request: web.Request) -> tuple[Gateway, str | None]:
    """The gateway's parts and the caller's tenant (401 first, before anything else is read)."""
    gateway = request.app[GATEWAY_KEY]
    return gateway, gateway.identify(tenant_key(request))


__all__ = ["GATEWAY_KEY", "AdminAddress", "Gateway", "NoAdminListener", "Service", "caller", "loopback", "tenant_key"]
