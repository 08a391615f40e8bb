"""Sealed secrets in a real SQLite store: they open with the same key after a restart, never for
another sandbox id or with another key, and nothing in the database file holds the value."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from warmshell.core.errors import FailedPreconditionError
from warmshell.core.ids import SandboxId
from warmshell.drivers.keyfiles import load_or_create_key as load_or_create_secrets_key
from warmshell.gateway import statedir
from warmshell.gateway.secretvault import KIND_SECRETS, SecretVault
from warmshell.gateway.store.sqlite import open_sqlite_store

VALUE = "s3cr3t-in-the-vault"


async def test_sealed_secrets_survive_a_restart_and_open_only_for_their_sandbox(tmp_path: Path) -> None:
    with statedir.private_umask():
        key = load_or_create_secrets_key(tmp_path / "secrets.key")
    assert stat.S_IMODE((tmp_path / "secrets.key").stat().st_mode) == 0o600
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    vault = SecretVault(store, key)
    assert vault.sealed(SandboxId("empty"), "default", {}) == ()
    await store.create(
        kind="sandbox",
        id="a",
        name="a",
        workspace="default",
        payload="{}",
        beside=vault.sealed(SandboxId("a"), "default", {"API_KEY": VALUE}),
    )
    row = await store.get(KIND_SECRETS, "a")
    assert row is not None
    # The blob copied under another sandbox's id does not open.
    await store.create(kind=KIND_SECRETS, id="b", name="b", workspace="default", payload=row.payload)
    with pytest.raises(FailedPreconditionError):
        await SecretVault(store, key).get(SandboxId("b"))
    await store.aclose()
    for path in tmp_path.iterdir():
        data = path.read_bytes()
        assert VALUE.encode() not in data
        assert base64.b64encode(VALUE.encode()) not in data

    store = await open_sqlite_store(tmp_path / "db.sqlite")
    reopened = SecretVault(store, load_or_create_secrets_key(tmp_path / "secrets.key"))
    assert await reopened.get(SandboxId("a")) == {"API_KEY": VALUE}
    assert await reopened.get(SandboxId("none")) == {}
    with pytest.raises(FailedPreconditionError):
        await SecretVault(store, bytes(32)).get(SandboxId("a"))
    assert await store.delete("sandbox", "a", beside=reopened.rows(SandboxId("a")))
    assert await reopened.get(SandboxId("a")) == {}
    await store.aclose()


def test_a_configured_key_file_may_hold_base64_as_a_kubernetes_secret_does(tmp_path: Path) -> None:
    raw = bytes(range(32))
    (tmp_path / "k").write_bytes(base64.b64encode(raw) + b"\n")
    assert load_or_create_secrets_key(tmp_path / "k") == raw
    (tmp_path / "short").write_bytes(b"too short")
    with pytest.raises(FailedPreconditionError, match="32-byte key"):
        load_or_create_secrets_key(tmp_path / "short")
