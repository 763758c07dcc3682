"""API keys as tenants, loaded fail-closed and reloaded without a restart.

Sources (any mix; ``KeyRing.load`` reads them all):

* a file: one entry per line, ``KEY`` or ``TENANT KEY`` (whitespace apart),
  or ``TENANT weight=W``: the tenant's share of the engines when they are
  contended (``autellix.core.TenantShares``; a positive number, default 1);
  blank lines and lines whose first non-blank character is ``#`` are comments
  (an indented ``# ...`` is a comment too, never a key);
* the environment: comma-separated entries of the same form
  (``AUTELLIX_API_KEYS=team-a k1,k2``);
* a mounted Kubernetes Secret (a directory): each data key is a tenant name,
  its value that tenant's keys in the file form, one per line, and optionally
  a line ``weight=W`` (``kubectl create secret generic autellix-tenant-keys
  --from-literal=team-a="$(openssl rand -hex 24)"$'\n'weight=3``).
  Kubernetes swaps the ``..data`` link when the Secret changes, so the
  directory's files are read through it and hidden entries are skipped.

Fail closed: a source that is configured but yields no key, an unreadable
source, a key given to two tenants, two weights for one tenant or a malformed
entry is an error
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
import math
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


#: How an entry sets its tenant's weight (``TENANT weight=W``; in a Secret's value, ``weight=W``).
WEIGHT_PREFIX = "weight="


@dataclass
class Entries:
    """What a key source says: digest -> tenant name, and the tenants' weights it sets."""

    keys: dict[str, str] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)

    def merge(self, other: Entries, source: str) -> None:
        for digest, tenant in other.keys.items():
            if self.keys.get(digest, tenant) != tenant:
                raise KeysError(f"{source}: the same key is given to two tenants ({self.keys[digest]}, {tenant})")
            self.keys[digest] = tenant
        for tenant, weight in other.weights.items():
            _set_weight(self.weights, tenant, weight, source)


def _set_weight(weights: dict[str, float], tenant: str, weight: float, where: str) -> None:
    if weights.get(tenant, weight) != weight:
        raise KeysError(f"{where}: tenant {tenant!r} is given two weights ({weights[tenant]:g}, {weight:g})")
    weights[tenant] = weight


def _weight(text: str, where: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        weight = math.nan
    if not 0 < weight < math.inf:
        raise KeysError(f"{where}: weight must be a positive number, got {text!r}")
    return weight


def parse_entries(entries: Iterable[str], source: str, *, tenant: str | None = None) -> Entries:
    """The keys (digest -> tenant name) and weights in ``entries`` (lines of a
    file, items of the environment variable). ``tenant`` names the tenant of
    every entry (a Secret's data key); then an entry is a bare key or ``weight=W``."""
    found = Entries()
    keys = found.keys
    for number, raw in enumerate(entries, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        where = f"{source}: entry {number}"
        if parts[-1].startswith(WEIGHT_PREFIX) and len(parts) == (1 if tenant is not None else 2):
            name = tenant if tenant is not None else parts[0]
            if not TENANT_NAME.match(name):
                raise KeysError(f"{where}: tenant name {name!r} must match {TENANT_NAME.pattern}")
            _set_weight(found.weights, name, _weight(parts[-1].removeprefix(WEIGHT_PREFIX), where), where)
            continue
        if tenant is not None:
            if len(parts) != 1:
                raise KeysError(f"{source}: entry {number}: expected one key per line")
            name, key = tenant, parts[0]
        elif len(parts) == 1:
            name, key = None, parts[0]
        elif len(parts) == 2:
            name, key = parts
        else:
            raise KeysError(f"{where}: expected 'KEY', 'TENANT KEY' or 'TENANT weight=W'")
        if len(key) < MIN_KEY_LENGTH:
            raise KeysError(f"{source}: entry {number}: keys must be at least {MIN_KEY_LENGTH} characters")
        if name is not None and not TENANT_NAME.match(name):
            raise KeysError(f"{source}: entry {number}: tenant name {name!r} must match {TENANT_NAME.pattern}")
        digest = key_digest(key)
        name = name or f"key-{digest[:8]}"
        if keys.get(digest, name) != name:
            raise KeysError(f"{source}: entry {number}: the same key is given to two tenants")
        keys[digest] = name
    for name in found.weights:
        if name not in keys.values():
            raise KeysError(f"{source}: tenant {name!r} has a weight but no key")
    return found


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

    def read(self, environ: Mapping[str, str]) -> Entries:
        """This source's keys and weights; ``KeysError`` when it has no key."""
        what = self.describe()
        if self.path is None:
            raw = environ.get(self.env or "", "")
            found = parse_entries(raw.split(","), what)
        else:
            try:
                if self.path.is_dir():
                    found = Entries()
                    for file in _secret_files(self.path):
                        if not TENANT_NAME.match(file.name):
                            raise KeysError(f"{what}: tenant name {file.name!r} must match {TENANT_NAME.pattern}")
                        entries = parse_entries(file.read_text().splitlines(), f"{what}/{file.name}",
                                                tenant=file.name)
                        if not entries.keys:
                            raise KeysError(f"{what}/{file.name}: no key (empty or only comments)")
                        found.merge(entries, what)
                else:
                    found = parse_entries(self.path.read_text().splitlines(), what)
            except OSError as exc:
                raise KeysError(f"{what}: cannot read: {exc.strerror or exc}") from None
        if not found.keys:
            raise KeysError(f"{what}: no key (empty or only comments); refusing to run with auth off")
        return found


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()  # follows the Secret's ..data symlink
    return st.st_mtime_ns, st.st_size


def _secret_files(directory: Path) -> list[Path]:
    """A mounted Secret's data files (its ``..data`` bookkeeping entries are hidden)."""
    return sorted(p for p in directory.iterdir() if not p.name.startswith(".") and p.is_file())


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
    _weights: dict[str, float] = field(default_factory=dict, init=False)
    _signatures: list[tuple[tuple[str, int, int], ...]] = field(default_factory=list, init=False)
    #: The last reload's error (the old keys stay in force), None when the last reload worked.
    last_error: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        found = self._read_all()  # raises: a bad source stops the start
        self._keys, self._weights = found.keys, found.weights
        self._signatures = [s.signature() for s in self.sources]

    def _read_all(self) -> Entries:
        found = Entries()
        for source in self.sources:
            found.merge(source.read(self.environ), source.describe())
        return found

    @property
    def enabled(self) -> bool:
        return bool(self.sources)

    @property
    def tenants(self) -> set[str]:
        return set(self._keys.values())

    @property
    def weights(self) -> dict[str, float]:
        """Every tenant's weight (1 where none is set)."""
        return {tenant: self._weights.get(tenant, 1.0) for tenant in self.tenants}

    def __len__(self) -> int:
        return len(self._keys)

    def refresh(self) -> bool:
        """Reload when a file's mtime or size changed; True when the keys changed.
        A source that broke keeps the last good keys and sets ``last_error``."""
        signatures = [s.signature() for s in self.sources]
        if signatures == self._signatures:
            return False
        try:
            found = self._read_all()
        except KeysError as exc:
            self.last_error = str(exc)
            return False  # signatures not taken: the next refresh tries again
        self._signatures, self.last_error = signatures, None
        changed = (found.keys, found.weights) != (self._keys, self._weights)
        self._keys, self._weights = found.keys, found.weights
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


__all__ = ["ENV_ADMIN_KEYS", "ENV_API_KEYS", "MIN_KEY_LENGTH", "WEIGHT_PREFIX", "Entries", "KeyRing", "KeySource",
           "KeysError", "Tenant", "key_digest", "parse_entries", "sources_from"]
