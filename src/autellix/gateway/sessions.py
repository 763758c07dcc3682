"""API keys: who a caller is (transport side). Session rules live in
``autellix.control.sessions``; header names in ``autellix.protocol``.

With API keys configured a session belongs to the key that created it; other
keys get 404. Keys are kept only as SHA-256 digests and never logged.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from autellix.control.sessions import CallOwner, Sessions
from autellix.control.store import ENDED_MEMORY
from autellix.protocol import IMPLICIT_SESSION_HEADERS, MAX_ID_LENGTH, SESSION_HEADER, THREAD_HEADER, APIError

#: Old names of the headers (``autellix.protocol`` defines them).
IMPLICIT_HEADERS = IMPLICIT_SESSION_HEADERS


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


__all__ = ["ENDED_MEMORY", "IMPLICIT_HEADERS", "MAX_ID_LENGTH", "SESSION_HEADER", "THREAD_HEADER", "Authenticator",
           "CallOwner", "Sessions", "key_identity", "load_api_keys"]
