"""API keys load fail-closed, name tenants, and reload by mtime without a restart."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autellix.control.keys import ENV_API_KEYS, KeyRing, KeysError, KeySource, Tenant, sources_from

KEY_A, KEY_B, KEY_C = "a" * 24, "b" * 24, "c" * 24


def bearer(key: str) -> str:
    return f"Bearer {key}"


def test_file_entries_name_tenants_and_comments_never_become_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"# team keys\n   # an indented comment\n{KEY_A}\nteam-b {KEY_B}\n\n")
    ring = KeyRing([KeySource(path=keys)], environ={})
    assert ring.identify(bearer(KEY_B)) == Tenant("team-b")
    assert ring.identify(bearer(KEY_A)).name.startswith("key-")  # a bare key: named after its digest
    assert ring.identify("Bearer # an indented comment") is None
    assert ring.identify("Bearer   # an indented comment") is None
    assert ring.identify(None) is None and ring.identify(KEY_A) is None and ring.identify("Basic " + KEY_A) is None
    assert len(ring) == 2


@pytest.mark.parametrize("content", ["", "\n\n", "# only\n  # comments\n"])
def test_an_empty_or_all_comment_file_is_an_error_not_auth_off(tmp_path: Path, content: str) -> None:
    keys = tmp_path / "keys"
    keys.write_text(content)
    with pytest.raises(KeysError, match="no key"):
        KeyRing([KeySource(path=keys)], environ={})


@pytest.mark.parametrize(("content", "match"), [
    ("short\n", "at least 16"),
    (f"team a {KEY_A}\n", "expected 'KEY', 'TENANT KEY' or 'TENANT weight=W'"),
    (f"team-a {KEY_A}\nteam-a weight=0\n", "positive number"),
    (f"team-a {KEY_A}\nteam-a weight=lots\n", "positive number"),
    (f"team-a {KEY_A}\nteam-a weight=2\nteam-a weight=3\n", "two weights"),
    (f"team-a {KEY_A}\nteam-b weight=2\n", "has a weight but no key"),
    (f"team/a {KEY_A}\n", "tenant name"),
    (f"team-a {KEY_A}\nteam-b {KEY_A}\n", "two tenants"),
])
def test_malformed_entries_are_errors(tmp_path: Path, content: str, match: str) -> None:
    keys = tmp_path / "keys"
    keys.write_text(content)
    with pytest.raises(KeysError, match=match):
        KeyRing([KeySource(path=keys)], environ={})


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KeysError, match="cannot read"):
        KeyRing([KeySource(path=tmp_path / "absent")], environ={})


def test_environment_set_but_empty_fails_closed_and_unset_means_no_source() -> None:
    assert sources_from([], ENV_API_KEYS, {}) == []
    assert not KeyRing([], environ={}).enabled
    with pytest.raises(KeysError, match="no key"):
        KeyRing(sources_from([], ENV_API_KEYS, {ENV_API_KEYS: " , "}), environ={ENV_API_KEYS: " , "})
    environ = {ENV_API_KEYS: f"team-a {KEY_A}, {KEY_B}"}
    ring = KeyRing(sources_from([], ENV_API_KEYS, environ), environ=environ)
    assert ring.identify(bearer(KEY_A)) == Tenant("team-a") and ring.identify(bearer(KEY_B)) is not None


def mount_secret(directory: Path, data: dict[str, str], version: int) -> None:
    """Lay out a Secret as the kubelet does: files are links through ``..data`` to a versioned folder."""
    directory.mkdir(exist_ok=True)
    folder = directory / f"..2026_12_01_{version}"
    folder.mkdir()
    for name, value in data.items():
        (folder / name).write_text(value)
    tmp_link = directory / "..data_tmp"
    tmp_link.symlink_to(folder.name)
    os.replace(tmp_link, directory / "..data")  # the atomic swap the kubelet makes
    for name in data:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")


def test_a_mounted_secret_names_tenants_by_data_key_and_reloads_on_change(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    mount_secret(secret, {"team-a": KEY_A + "\n", "team-b": KEY_B}, 1)
    ring = KeyRing([KeySource(path=secret)], environ={})
    assert ring.tenants == {"team-a", "team-b"}
    assert ring.identify(bearer(KEY_A)) == Tenant("team-a")
    assert ring.refresh() is False  # nothing changed

    # rotate team-a's key: the kubelet swaps ..data; the new key works, the old one stops
    mount_secret(secret, {"team-a": KEY_C, "team-b": KEY_B}, 2)
    assert ring.refresh() is True
    assert ring.identify(bearer(KEY_C)) == Tenant("team-a") and ring.identify(bearer(KEY_A)) is None


def test_a_broken_reload_keeps_the_last_good_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"team-a {KEY_A}\n")
    ring = KeyRing([KeySource(path=keys)], environ={})
    keys.write_text("# emptied by mistake\n")
    os.utime(keys, ns=(1, 1))  # a different mtime even on a coarse clock
    assert ring.refresh() is False
    assert ring.last_error is not None and "no key" in ring.last_error
    assert ring.identify(bearer(KEY_A)) == Tenant("team-a")  # neither locked out nor auth off
    keys.write_text(f"team-a {KEY_A}\nteam-b {KEY_B}\n")
    assert ring.refresh() is True and ring.last_error is None
    assert ring.identify(bearer(KEY_B)) == Tenant("team-b")


def test_weights_come_from_the_file_the_environment_and_a_secret_and_reload(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"team-a {KEY_A}\nteam-a weight=3\n{KEY_B}\n")
    ring = KeyRing([KeySource(path=keys)], environ={})
    bare = ring.identify(bearer(KEY_B))
    assert bare is not None and ring.weights == {"team-a": 3.0, bare.name: 1.0}
    keys.write_text(f"team-a {KEY_A}\nteam-a weight=0.5\n{KEY_B}\n")
    os.utime(keys, ns=(2, 2))
    assert ring.refresh() is True and ring.weights["team-a"] == 0.5  # a weight change is a change

    environ = {ENV_API_KEYS: f"team-a {KEY_A},team-a weight=2"}
    assert KeyRing(sources_from([], ENV_API_KEYS, environ), environ=environ).weights == {"team-a": 2.0}

    secret = tmp_path / "secret"
    mount_secret(secret, {"team-a": f"{KEY_A}\nweight=4\n", "team-b": KEY_B}, 1)
    assert KeyRing([KeySource(path=secret)], environ={}).weights == {"team-a": 4.0, "team-b": 1.0}
    mount_secret(secret, {"team-a": "weight=4\n", "team-b": KEY_B}, 2)
    with pytest.raises(KeysError, match="no key"):  # a weight alone is not a tenant
        KeyRing([KeySource(path=secret)], environ={})
