"""The SQLite store: compare-and-swap, uniqueness, persistence, permissions."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest

from warmshell.core.errors import AlreadyExistsError, ConflictError, UnavailableError
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


async def test_writes_that_arrive_together_share_transactions_and_fail_alone(tmp_path: Path) -> None:
    store = await open_sqlite_store(tmp_path / "s.db")
    try:
        await store.create(kind="sandbox", id="taken", name="n-7", workspace="default", payload="{}")
        before = store.batches
        results = await asyncio.gather(
            *(
                store.create(kind="sandbox", id=str(i), name=f"n-{i}", workspace="default", payload="{}")
                for i in range(50)
            ),
            return_exceptions=True,
        )
        failed = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
        assert failed == [7]  # the duplicate name alone
        assert isinstance(results[7], AlreadyExistsError)
        assert len(await store.list("sandbox")) == 50  # "taken" and the 49 others
        assert store.batches - before < 50  # coalesced into fewer transactions than writes
        # A lost compare-and-swap in a batch fails alone too; the other updates land.
        updates = await asyncio.gather(
            *(
                store.update(kind="sandbox", id=str(10 + i), expected_version=1 if i != 3 else 9, payload='{"u":1}')
                for i in range(10)
            ),
            return_exceptions=True,
        )
        assert [i for i, r in enumerate(updates) if isinstance(r, BaseException)] == [3]
        assert isinstance(updates[3], ConflictError)
        assert [r.resource_version for r in await store.list("sandbox") if r.payload == '{"u":1}'] == [2] * 9
    finally:
        await store.aclose()


async def test_a_cancelled_caller_does_not_break_the_store(tmp_path: Path) -> None:
    store = await open_sqlite_store(tmp_path / "s.db")
    try:
        task = asyncio.create_task(store.create(kind="sandbox", id="1", name="a", workspace="default", payload="{}"))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The write may or may not have landed; the store answers either way.
        assert len(await store.list("sandbox")) in (0, 1)
        await store.create(kind="sandbox", id="2", name="b", workspace="default", payload="{}")
        assert (await store.get("sandbox", "2")) is not None
    finally:
        await store.aclose()


async def test_a_failing_operation_leaves_the_worker_serving(tmp_path: Path) -> None:
    store = await open_sqlite_store(tmp_path / "s.db")
    try:
        with pytest.raises(UnavailableError, match="no such table"):
            await store._fetch("SELECT * FROM missing", ())

        def broken(conn: object) -> None:
            raise TypeError("a bug in an operation")

        with pytest.raises(TypeError):
            await store._submit(broken, write=True)
        await store.create(kind="sandbox", id="1", name="a", workspace="default", payload="{}")
        assert (await store.get("sandbox", "1")) is not None
    finally:
        await store.aclose()
