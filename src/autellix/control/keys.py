"""API keys as tenants, loaded fail-closed and reloaded without a restart.

Sources (any mix; ``KeyRing.load`` reads them all):

* a file: one entry per line, ``KEY`` or ``TENANT KEY`` (whitespace apart);
  blank lines and lines whose first non-blank character is ``#`` are comments
  (an indented ``# ...`` is a comment too, never a key);
* the environment: comma-separated entries of the same form
  (``AUTELLIX_API_KEYS=team-a k1,k2``);
* a mounted Kubernetes Secret (a directory): each data key is a tenant name,
  its value that tenant's keys in the file form (``kubectl create secret
  generic autellix-tenant-keys --from-literal=team-a=$(openssl rand -hex 24)``).
  Kubernetes swaps the ``..data`` link when the Secret changes, so the
  directory's files are read through it and hidden entries are skipped.

Fail closed: a source that is configured but yields no key, an unreadable
source, a key given to two tenants or a malformed entry is an error
(``KeysError``), never "auth off". Auth is off only when no source is
configured at all, which the gateway allows only on loopback or when told
``--allow-anonymous``. On reload a broken source keeps the last good keys
(``KeyRing.refresh`` reports the error) rather than locking everyone out or
letting everyone in.

Keys are kept only as SHA-256 digests and never logged; a bare key's tenant
is named after its digest (``key-<8 hex>``), so logs and metrics can name it.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: Environment variable of tenant keys (comma-separated entries).
ENV_API_KEYS = "AUTELLIX_API_KEYS"
#: Environment variable of admin keys (same form; their tenant names are only labels).
ENV_ADMIN_KEYS = "AUTELLIX_ADMIN_KEYS"
#: Shortest accepted key: anything shorter is guessable (``openssl rand -hex 24`` makes 48).
MIN_KEY_LENGTH = 16
#: Tenant names: what a Kubernetes Secret's data keys allow, and safe in metrics labels and logs.
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class KeysError(ValueError):
    """A key source is missing, empty or malformed: the gateway must not start (or keeps its old keys)."""


def key_digest(key: str) -> str:
    """The stored form of a key (SHA-256, hex). Only digests are compared, so a
    lookup's timing says nothing about the key."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who a call is: the tenant its key belongs to. Sessions, limits and
    accounting are per tenant, so a tenant's keys can be rotated without losing
    its sessions."""

    name: str


def parse_entries(entries: Iterable[str], source: str, *, tenant: str | None = None) -> dict[str, str]:
    """Digest -> tenant name of the keys in ``entries`` (lines of a file, items
    of the environment variable). ``tenant`` names the tenant of every entry (a
    Secret's data key); then an entry is a bare key."""
    keys: dict[str, str] = {}
    for number, raw in enumerate(entries, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if tenant is not None:
            if len(parts) != 1:
                raise KeysError(f"{source}: entry {number}: expected one key per line")
            name, key = tenant, parts[0]
        elif len(parts) == 1:
            name, key = None, parts[0]
        elif len(parts) == 2:
            name, key = parts
        else:
            raise KeysError(f"{source}: entry {number}: expected 'KEY' or 'TENANT KEY'")
        if len(key) < MIN_KEY_LENGTH:
            raise KeysError(f"{source}: entry {number}: keys must be at least {MIN_KEY_LENGTH} characters")
        if name is not None and not TENANT_NAME.match(name):
            raise KeysError(f"{source}: entry {number}: tenant name {name!r} must match {TENANT_NAME.pattern}")
        digest = key_digest(key)
        name = name or f"key-{digest[:8]}"
        if keys.get(digest, name) != name:
            raise KeysError(f"{source}: entry {number}: the same key is given to two tenants")
        keys[digest] = name
    return keys


@dataclass(frozen=True)
class KeySource:
    """Where keys come from: exactly one of ``path`` (a file or a mounted
    Secret's directory) or ``env`` (a variable's name, read from ``environ``)."""

    path: Path | None = None
    env: str | None = None

    def describe(self) -> str:
        return str(self.path) if self.path is not None else f"${self.env}"

    def signature(self) -> tuple[tuple[str, int, int], ...]:
        """What changes when the source's content may have changed (files' mtimes
        and sizes, read through Kubernetes' ``..data`` link); () for the environment."""
        if self.path is None:
            return ()
        try:
            if self.path.is_dir():
                return tuple((p.name, *_stamp(p)) for p in _secret_files(self.path))
            return (("", *_stamp(self.path)),)
        except OSError:
            return (("missing", 0, 0),)

    def read(self, environ: Mapping[str, str]) -> dict[str, str]:
        """Digest -> tenant of this source's keys; ``KeysError`` when it has none."""
        what = self.describe()
        if self.path is None:
            raw = environ.get(self.env or "", "")
            keys = parse_entries(raw.split(","), what)
        else:
            try:
                if self.path.is_dir():
                    keys = {}
                    for file in _secret_files(self.path):
                        if not TENANT_NAME.match(file.name):
                            raise KeysError(f"{what}: tenant name {file.name!r} must match {TENANT_NAME.pattern}")
                        found = parse_entries(file.read_text().splitlines(), f"{what}/{file.name}",
                                              tenant=file.name)
                        if not found:
                            raise KeysError(f"{what}/{file.name}: no key (empty or only comments)")
                        _merge(keys, found, what)
                else:
                    keys = parse_entries(self.path.read_text().splitlines(), what)
            except OSError as exc:
                raise KeysError(f"{what}: cannot read: {exc.strerror or exc}") from None
        if not keys:
            raise KeysError(f"{what}: no key (empty or only comments); refusing to run with auth off")
        return keys


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()  # follows the Secret's ..data symlink
    return st.st_mtime_ns, st.st_size


def _secret_files(directory: Path) -> list[Path]:
    """A mounted Secret's data files (its ``..data`` bookkeeping entries are hidden)."""
    return sorted(p for p in directory.iterdir() if not p.name.startswith(".") and p.is_file())


def _merge(into: dict[str, str], found: Mapping[str, str], source: str) -> None:
    for digest, tenant in found.items():
        if into.get(digest, tenant) != tenant:
            raise KeysError(f"{source}: the same key is given to two tenants ({into[digest]}, {tenant})")
        into[digest] = tenant


def sources_from(paths: Iterable[Path], env: str, environ: Mapping[str, str]) -> list[KeySource]:
    """The configured sources: each path, plus the variable ``env`` when it is set
    (set but empty counts as configured: it fails closed)."""
    sources = [KeySource(path=Path(p)) for p in paths]
    if env in environ:
        sources.append(KeySource(env=env))
    return sources


@dataclass
class KeyRing:
    """The keys of one plane (tenants' or admin's), reloadable.

    ``enabled`` is False only when no source is configured. ``identify`` maps a
    presented key to its tenant; the caller turns None into a 401."""

    sources: list[KeySource]
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    _keys: dict[str, str] = field(default_factory=dict, init=False)
    _signatures: list[tuple[tuple[str, int, int], ...]] = field(default_factory=list, init=False)
    #: The last reload's error (the old keys stay in force), None when the last reload worked.
    last_error: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._keys = self._read_all()  # raises: a bad source stops the start
        self._signatures = [s.signature() for s in self.sources]

    def _read_all(self) -> dict[str, str]:
        keys: dict[str, str] = {}
        for source in self.sources:
            _merge(keys, source.read(self.environ), source.describe())
        return keys

    @property
    def enabled(self) -> bool:
        return bool(self.sources)

    @property
    def tenants(self) -> set[str]:
        return set(self._keys.values())

    def __len__(self) -> int:
        return len(self._keys)

    def refresh(self) -> bool:
        """Reload when a file's mtime or size changed; True when the keys changed.
        A source that broke keeps the last good keys and sets ``last_error``."""
        signatures = [s.signature() for s in self.sources]
        if signatures == self._signatures:
            return False
        try:
            keys = self._read_all()
        except KeysError as exc:
            self.last_error = str(exc)
            return False  # signatures not taken: the next refresh tries again
        self._signatures, self.last_error = signatures, None
        changed = keys != self._keys
        self._keys = keys
        return changed

    def tenant_of(self, key: str) -> Tenant | None:
        name = self._keys.get(key_digest(key))
        return Tenant(name) if name is not None else None

    def identify(self, authorization: str | None) -> Tenant | None:
        """The tenant of an ``Authorization: Bearer KEY`` header; None when it
        names no key of this ring (missing, malformed or unknown)."""
        scheme, _, key = (authorization or "").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return None
        return self.tenant_of(key)


__all__ = ["ENV_ADMIN_KEYS", "ENV_API_KEYS", "MIN_KEY_LENGTH", "KeyRing", "KeySource", "KeysError", "Tenant",
           "key_digest", "parse_entries", "sources_from"]
