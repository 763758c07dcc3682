"""Which program a call belongs to, and who may see it (no transport).

A call names its program with ``X-Autellix-Session`` (sessions opened by POST
/v1/sessions), or with a well-known agent session header (an implicit session
is created on first use). A call with neither is a one-call program. With API
keys configured a session belongs to the tenant whose key created it; other
tenants get 404, and implicit session ids are scoped per tenant (two tenants'
``x-session-id: run-1`` are two programs, ``<tenant>/run-1`` in the table).
Every check runs before the first state change.

With a ``TenantStanding``, a tenant's new program starts at the service its
tenant's recently ended programs carry (``autellix.control.standing``), so
opening fresh sessions does not reset its standing.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from autellix.control.standing import TenantStanding
from autellix.control.store import ProgramStore
from autellix.core import DuplicateProgram, ProgramEntry
from autellix.protocol import IMPLICIT_SESSION_HEADERS, MAX_ID_LENGTH, SESSION_HEADER, THREAD_HEADER, APIError


@dataclass(frozen=True)
class CallOwner:
    program_id: str
    thread_id: str | None
    #: A one-call program: removed from the table when its call ends.
    ephemeral: bool


def session_not_found(program_id: str, ended: bool) -> APIError:
    state = "has ended" if ended else "does not exist"
    return APIError(404, f"Session {program_id!r} {state}.", code="session_not_found")


class Sessions:
    """Session rules over a ``ProgramStore``; ``owner`` is the caller's identity (None: auth off)."""

    def __init__(self, store: ProgramStore, standing: TenantStanding | None = None) -> None:
        self.store = store
        #: Applies to named tenants only: with auth off nobody can be told apart.
        self.standing = standing

    async def open(self, now: float, owner: str | None, *, program_id: str | None = None,
                   implicit: bool = False) -> ProgramEntry:
        entry = await self.store.open(program_id or f"sess-{uuid.uuid4().hex}", now, owner=owner, implicit=implicit)
        if self.standing is not None and owner is not None:
            floor = self.standing.take_floor(owner, now)
            if floor > entry.service:
                entry.service = floor
        return entry

    def program_left(self, entry: ProgramEntry, now: float) -> None:
        """A program left the table (ended, expired, one-call): its service joins its tenant's carry."""
        if self.standing is not None and entry.owner is not None:
            self.standing.program_left(entry.owner, entry.service, now)

    async def get(self, program_id: str, owner: str | None) -> ProgramEntry:
        """The caller's session ``program_id``: an implicit one by the id its header gave, too."""
        for candidate in dict.fromkeys((scoped_id(owner, program_id), program_id)):
            entry = await self.store.load(candidate)
            if entry is not None and entry.owner == owner:
                return entry
        ended = await self.store.ended(scoped_id(owner, program_id)) or await self.store.ended(program_id)
        raise session_not_found(program_id, ended)

    async def end(self, program_id: str, owner: str | None) -> ProgramEntry:
        entry = await self.get(program_id, owner)
        await self.store.end(entry.program_id)
        self.program_left(entry, entry.last_activity)
        return entry

    async def resolve(self, headers: Mapping[str, str], owner: str | None, now: float) -> CallOwner:
        """The program of a call. Raises (404, 400) before changing anything."""
        thread = header_id(headers, THREAD_HEADER)
        explicit = header_id(headers, SESSION_HEADER)
        if explicit is not None:
            await self.get(explicit, owner)
            return CallOwner(explicit, thread, ephemeral=False)
        for name in IMPLICIT_SESSION_HEADERS:
            named = header_id(headers, name)
            if named is None:
                continue
            implicit = scoped_id(owner, named)
            if await self.store.load(implicit) is not None:
                await self.get(implicit, owner)
            elif await self.store.ended(implicit):
                raise session_not_found(named, True)
            else:
                try:
                    await self.open(now, owner, program_id=implicit, implicit=True)
                except DuplicateProgram:  # opened meanwhile by a concurrent call: join it
                    await self.get(implicit, owner)
            return CallOwner(implicit, thread, ephemeral=False)
        entry = await self.open(now, owner, program_id=f"call-{uuid.uuid4().hex}")
        return CallOwner(entry.program_id, thread, ephemeral=True)


def scoped_id(owner: str | None, session_id: str) -> str:
    """An implicit session's id in the table: the tenant's own namespace (tenant names have no '/')."""
    return session_id if owner is None else f"{owner}/{session_id}"


def header_id(headers: Mapping[str, str], name: str) -> str | None:
    """A session or thread id from a header: 1 to ``MAX_ID_LENGTH`` printable characters (else 400)."""
    value = headers.get(name)
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > MAX_ID_LENGTH or not value.isprintable():
        raise APIError(400, f"Header {name} must be 1 to {MAX_ID_LENGTH} printable characters.",
                       code="invalid_header", param=name)
    return value
