"""Sandbox records over a store shared by replicas: a watcher's re-read is answered from the rows
the change feed keeps current, a decision's read and a swap that lost go to the store, and
nothing is kept while the feed is lost."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.unit.gateway.test_records import CountingStore
from warmshell.core.ids import SandboxId
from warmshell.core.models import SandboxRecord
from warmshell.gateway.events import EventBus
from warmshell.gateway.records import KIND_SANDBOX, SandboxRecords
from warmshell.gateway.store.sqlite import open_sqlite_store

SID = SandboxId("sb-1")


@asynccontextmanager
async def shared_records(tmp_path: Path) -> AsyncIterator[tuple[CountingStore, SandboxRecords]]:
    """A record `SID` on a store this gateway shares, its change feed listening."""
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    counting = CountingStore(store)
    try:
        records = SandboxRecords(counting, EventBus(), exclusive=False)  # type: ignore[arg-type]
        records.feed_listening(True)
        await records.insert(SandboxRecord(id=SID, name="one"))
        yield counting, records
    finally:
        await store.aclose()


async def _written_elsewhere(counting: CountingStore, **labels: str) -> int:
    """Another replica's write (straight to the store, not yet heard); its version."""
    row = await counting.store.get(KIND_SANDBOX, SID)
    assert row is not None
    record = SandboxRecord.model_validate_json(row.payload)
    record.labels.update(labels)
    written = await counting.store.update(
        kind=KIND_SANDBOX, id=SID, expected_version=row.resource_version, payload=record.model_dump_json()
    )
    return written.resource_version


async def test_a_watchers_reread_comes_from_memory_until_a_change_is_heard(tmp_path: Path) -> None:
    async with shared_records(tmp_path) as (counting, records):
        first = await records.get(SID, may_lag=True)
        assert first is not None
        assert counting.reads == 0
        assert await records.get(SID, may_lag=True) is first  # one decode, shared
        fresh = await records.get(SID)  # a decision's read asks the store
        assert fresh is not None
        assert counting.reads == 1
        version = await _written_elsewhere(counting, a="1")
        lagging = await records.get(SID, may_lag=True)
        assert lagging is not None
        assert lagging.labels == {}
        assert records.heard_changed(SID, version)  # news: the watchers are told, and read it
        heard = await records.get(SID, may_lag=True)
        assert heard is not None
        assert heard.labels == {"a": "1"}
        assert counting.reads == 2


async def test_this_replicas_own_write_is_kept_and_its_echo_is_no_news(tmp_path: Path) -> None:
    async with shared_records(tmp_path) as (counting, records):
        written = await records.mutate(SID, lambda r: r.labels.update(a="1"))
        assert not records.heard_changed(SID, written.resource_version)
        assert await records.get(SID, may_lag=True) is written
        assert counting.reads == 0


async def test_a_mutation_started_from_a_lagging_row_loses_its_swap_and_reads_the_store(tmp_path: Path) -> None:
    async with shared_records(tmp_path) as (counting, records):
        await _written_elsewhere(counting, a="1")
        changed = await records.mutate(SID, lambda r: r.labels.update(b="2"))
        assert changed.labels == {"a": "1", "b": "2"}
        assert (changed.resource_version, counting.reads) == (3, 1)


async def test_nothing_to_write_is_decided_on_the_stores_record(tmp_path: Path) -> None:
    async with shared_records(tmp_path) as (counting, records):
        await _written_elsewhere(counting, go="yes")

        def follow_go(record: SandboxRecord) -> bool:
            if "go" not in record.labels:
                return False
            record.labels["went"] = "yes"
            return True

        changed = await records.mutate(SID, follow_go)
        assert changed.labels == {"go": "yes", "went": "yes"}
        assert counting.reads == 1


async def test_nothing_is_kept_while_the_feed_is_lost(tmp_path: Path) -> None:
    async with shared_records(tmp_path) as (counting, records):
        records.feed_listening(False)
        await records.get(SID, may_lag=True)
        await records.mutate(SID, lambda r: r.labels.update(a="1"))
        await records.get(SID, may_lag=True)
        assert counting.reads == 3
        records.feed_listening(True)  # back: anything may have changed meanwhile
        await records.get(SID, may_lag=True)
        await records.get(SID, may_lag=True)
        assert counting.reads == 4


async def test_a_delete_heard_forgets_the_row(tmp_path: Path) -> None:
    async with shared_records(tmp_path) as (counting, records):
        await counting.store.delete(KIND_SANDBOX, SID)
        records.heard_removed(SID)
        assert await records.get(SID, may_lag=True) is None
        assert counting.reads == 1
