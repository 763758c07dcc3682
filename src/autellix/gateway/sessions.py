"""Sessions: which program a call belongs to, and who may see it.

A call names its program with ``X-Autellix-Session`` (sessions opened by POST
/v1/sessions), or with a well-known agent session header (an implicit session is
created on first use). A call with neither is a one-call program. With API keys
configured a session belongs to the key that created it; other keys get 404.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from autellix.core import ProcessTable, ProgramEntry
from autellix.gateway.errors import APIError, not_found

SESSION_HEADER = "X-Autellix-Session"
THREAD_HEADER = "X-Autellix-Thread"
#: Agent frameworks that already carry a session id (Claude Code, Codex-style clients, ...).
IMPLICIT_HEADERS = ("x-session-id", "x-claude-code-session-id", "session_id", "session-id")
MAX_ID_LENGTH = 256
ENDED_MEMORY = 100_000


def key_identity(key: str) -> str:
    """A stable, non-reversible name for an API key (keys are never stored or logged)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def load_api_keys(path: Path | None = None, environ: Mapping[str, str] | None = None) -> set[str]:
    """Keys from a file (one per line, # comments) and/or ``AUTELLIX_API_KEYS`` (comma-separated)."""
    environ = os.environ if environ is None else environ
    keys = {k.strip() for k in environ.get("AUTELLIX_API_KEYS", "").split(",") if k.strip()}
    if path is not None:
        keys |= {ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")}
    return keys


class Authenticator:
    def __init__(self, keys: set[str]) -> None:
        self._identities = {key_identity(k) for k in keys}

    @property
    def enabled(self) -> bool:
        return bool(self._identities)

    def identify(self, authorization: str | None) -> str | None:
        """The caller's identity, None when auth is off; 401 for a missing or wrong key."""
        if not self._identities:
            return None
        scheme, _, key = (authorization or "").partition(" ")
        identity = key_identity(key.strip()) if scheme.lower() == "bearer" and key.strip() else None
        if identity not in self._identities:
            raise APIError(401, "Invalid or missing API key (Authorization: Bearer ...).",
                           type="authentication_error", code="invalid_api_key")
        return identity


@dataclass(frozen=True)
class CallOwner:
    program_id: str
    thread_id: str | None
    #: A one-call program: removed from the table when its call ends.
    ephemeral: bool


class Sessions:
    def __init__(self, table: ProcessTable) -> None:
        self.table = table
        # Ended ids, remembered (bounded) so a late call on an ended session gets
        # a clear 404 instead of silently opening a new implicit session.
        self._ended: OrderedDict[str, None] = OrderedDict()

    def open(self, now: float, owner: str | None, *, program_id: str | None = None,
             implicit: bool = False) -> ProgramEntry:
        return self.table.start(program_id or f"sess-{uuid.uuid4().hex}", now, owner=owner, implicit=implicit)

    def get(self, program_id: str, owner: str | None) -> ProgramEntry:
        entry = self.table.get(program_id)
        if entry is None or entry.owner != owner:
            state = "has ended" if program_id in self._ended else "does not exist"
            raise not_found(f"Session {program_id!r} {state}.", code="session_not_found")
        return entry

    def end(self, program_id: str, owner: str | None) -> ProgramEntry:
        entry = self.get(program_id, owner)
        self.table.end(program_id)
        self._remember_ended(program_id)
        return entry

    def _remember_ended(self, program_id: str) -> None:
        self._ended[program_id] = None
        while len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)

    def expire(self, now: float) -> list[ProgramEntry]:
        expired = self.table.expire(now)
        for entry in expired:
            self._remember_ended(entry.program_id)
        return expired

    def resolve(self, headers: Mapping[str, str], owner: str | None, now: float) -> CallOwner:
        """The program of a call. Raises (404, 400) before changing anything."""
        thread = _header_id(headers, THREAD_HEADER)
        explicit = _header_id(headers, SESSION_HEADER)
        if explicit is not None:
            self.get(explicit, owner)
            return CallOwner(explicit, thread, ephemeral=False)
        for name in IMPLICIT_HEADERS:
            implicit = _header_id(headers, name)
            if implicit is None:
                continue
            if implicit in self.table:
                self.get(implicit, owner)
            elif implicit in self._ended:
                raise not_found(f"Session {implicit!r} has ended.", code="session_not_found")
            else:
                self.open(now, owner, program_id=implicit, implicit=True)
            return CallOwner(implicit, thread, ephemeral=False)
        entry = self.open(now, owner, program_id=f"call-{uuid.uuid4().hex}")
        return CallOwner(entry.program_id, thread, ephemeral=True)


def _header_id(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > MAX_ID_LENGTH or not value.isprintable():
        raise APIError(400, f"Header {name} must be 1 to {MAX_ID_LENGTH} printable characters.",
                       code="invalid_header", param=name)
    return value
