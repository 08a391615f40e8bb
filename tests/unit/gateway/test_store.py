"""The SQLite store: compare-and-swap, uniqueness, persistence, permissions."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from warmshell.core.errors import AlreadyExistsError, ConflictError
from warmshell.gateway.store.sqlite import open_sqlite_store


async def test_cas_update_and_conflict(tmp_path: Path) -> None:
    store = await open_sqlite_store(tmp_path / "s.db")
    try:
        row = await store.create(kind="sandbox", id="1", name="a", workspace="default", payload="{}")
        assert row.resource_version == 1
        updated = await store.update(kind="sandbox", id="1", expected_version=1, payload='{"x":1}')
        assert updated.resource_version == 2
        with pytest.raises(ConflictError):
            await store.update(kind="sandbox", id="1", expected_version=1, payload="{}")
        with pytest.raises(ConflictError):
            await store.delete("sandbox", "1", expected_version=1)
        assert await store.delete("sandbox", "1", expected_version=2)
        assert not await store.delete("sandbox", "1")
    finally:
        await store.aclose()


async def test_names_are_unique_per_workspace(tmp_path: Path) -> None:
    store = await open_sqlite_store(tmp_path / "s.db")
    try:
        await store.create(kind="sandbox", id="1", name="a", workspace="default", payload="{}")
        await store.create(kind="sandbox", id="2", name="a", workspace="other", payload="{}")
        with pytest.raises(AlreadyExistsError):
            await store.create(kind="sandbox", id="3", name="a", workspace="default", payload="{}")
        assert [r.id for r in await store.list("sandbox")] == ["1", "2"]
        assert [r.id for r in await store.list("sandbox", "other")] == ["2"]
        found = await store.get_by_name("sandbox", "other", "a")
        assert found is not None
        assert found.id == "2"
    finally:
        await store.aclose()


async def test_survives_reopen_with_owner_only_permissions(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = await open_sqlite_store(path)
    await store.create(kind="sandbox", id="1", name="a", workspace="default", payload='{"kept":true}')
    await store.aclose()
    reopened = await open_sqlite_store(path)
    try:
        row = await reopened.get("sandbox", "1")
        assert row is not None
        assert row.payload == '{"kept":true}'
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        await reopened.aclose()
