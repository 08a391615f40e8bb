"""Sandbox records over a store only this gateway writes: reads come from memory after a write,
and a row moved behind the cache's back (a lost compare-and-swap) is read again, never lost."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from warmshell.core.errors import NotFoundError, UnavailableError
from warmshell.core.ids import SandboxId
from warmshell.core.models import SandboxRecord
from warmshell.gateway.events import EventBus
from warmshell.gateway.records import KIND_SANDBOX, SandboxRecords
from warmshell.gateway.store.base import StoredObject
from warmshell.gateway.store.sqlite import SqliteStore, open_sqlite_store


class CountingStore:
    """The real store, counting the reads that reach it."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.reads = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def get(self, kind: str, id: str) -> StoredObject | None:
        self.reads += 1
        return await self.store.get(kind, id)


async def test_reads_after_writes_come_from_memory_and_lost_races_are_read_again(tmp_path: Path) -> None:
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    counting = CountingStore(store)
    try:
        records = SandboxRecords(counting, EventBus(), exclusive=True)  # type: ignore[arg-type]
        sid = SandboxId("sb-1")
        await records.insert(SandboxRecord(id=sid, name="one"))
        changed = await records.mutate(sid, lambda r: r.labels.update(a="1"))
        assert changed.resource_version == 2
        fetched = await records.get(sid)
        assert fetched is not None
        assert fetched.labels == {"a": "1"}
        assert counting.reads == 0
        # Someone else moved the row (here: straight through the store): the next mutation's CAS
        # fails on the cached version, the row is read again and the change applies on top.
        row = await store.get(KIND_SANDBOX, sid)
        assert row is not None
        behind = SandboxRecord.model_validate_json(row.payload)
        behind.labels["b"] = "2"
        await store.update(kind=KIND_SANDBOX, id=sid, expected_version=2, payload=behind.model_dump_json())
        changed = await records.mutate(sid, lambda r: r.labels.update(c="3"))
        assert changed.labels == {"a": "1", "b": "2", "c": "3"}
        assert changed.resource_version == 4
        assert counting.reads == 1
        await records.remove(sid)
        assert await records.get(sid) is None
    finally:
        await store.aclose()


async def test_a_shared_store_is_read_every_time(tmp_path: Path) -> None:
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    counting = CountingStore(store)
    try:
        records = SandboxRecords(counting, EventBus())  # type: ignore[arg-type]
        sid = SandboxId("sb-1")
        await records.insert(SandboxRecord(id=sid, name="one"))
        await records.get(sid)
        await records.get(sid)
        assert counting.reads == 2
    finally:
        await store.aclose()


class NameCountingStore(CountingStore):
    """Also counts the lookups by name that reach the store."""

    def __init__(self, store: SqliteStore) -> None:
        super().__init__(store)
        self.name_reads = 0

    async def get_by_name(self, kind: str, workspace: str, name: str) -> StoredObject | None:
        self.name_reads += 1
        return await self.store.get_by_name(kind, workspace, name)


async def test_lookups_by_name_come_from_memory_until_the_sandbox_is_removed(tmp_path: Path) -> None:
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    counting = NameCountingStore(store)
    try:
        records = SandboxRecords(counting, EventBus(), exclusive=True)  # type: ignore[arg-type]
        first = await records.insert(SandboxRecord(id=SandboxId("sb-1"), name="one"))
        await records.mutate(first.id, lambda r: r.labels.update(a="1"))
        found = await records.get_by_name("default", "one")
        assert (found.id, found.labels, found.resource_version) == ("sb-1", {"a": "1"}, 2)
        assert counting.name_reads == 0
        await records.remove(first.id)
        with pytest.raises(NotFoundError, match="default/one"):
            await records.get_by_name("default", "one")
        assert counting.name_reads == 1
        # The name is free again: a new sandbox takes it, and the lookup finds the new one.
        await records.insert(SandboxRecord(id=SandboxId("sb-2"), name="one"))
        assert (await records.get_by_name("default", "one")).id == "sb-2"
        assert counting.name_reads == 1
        # A gateway sharing its store (replicas) reads every time.
        shared = SandboxRecords(counting, EventBus(), exclusive=False)  # type: ignore[arg-type]
        assert (await shared.get_by_name("default", "one")).id == "sb-2"
        assert counting.name_reads == 2
    finally:
        await store.aclose()


class WriteCountingStore(CountingStore):
    """Also counts the updates that reach the store."""

    def __init__(self, store: SqliteStore) -> None:
        super().__init__(store)
        self.updates = 0

    async def update(self, *, kind: str, id: str, expected_version: int, payload: str) -> StoredObject:
        self.updates += 1
        return await self.store.update(kind=kind, id=id, expected_version=expected_version, payload=payload)


SID = SandboxId("sb-1")


@asynccontextmanager
async def one_record(
    tmp_path: Path, bus: EventBus, *, exclusive: bool = True
) -> AsyncIterator[tuple[WriteCountingStore, SandboxRecords]]:
    """A store counting its updates, and the records over it holding one sandbox, SID ("one")."""
    counting = WriteCountingStore(await open_sqlite_store(tmp_path / "db.sqlite"))
    try:
        records = SandboxRecords(counting, bus, exclusive=exclusive)  # type: ignore[arg-type]
        await records.insert(SandboxRecord(id=SID, name="one"))
        yield counting, records
    finally:
        await counting.store.aclose()


async def stored_labels(counting: WriteCountingStore) -> dict[str, str]:
    row = await counting.store.get(KIND_SANDBOX, SID)
    assert row is not None
    return SandboxRecord.model_validate_json(row.payload).labels


async def test_a_held_record_folds_its_mutations_into_one_write_and_reads_see_them(tmp_path: Path) -> None:
    bus = EventBus()
    async with one_record(tmp_path, bus) as (counting, records), bus.subscribe(SID, replay_output=False) as queue:
        records.hold(SID)
        returned = await records.mutate(SID, lambda r: r.labels.update(activated="1"))
        await records.mutate(SID, lambda r: r.labels.update(session="1"))
        assert returned.labels == {"activated": "1", "session": "1"}
        assert counting.updates == 0
        assert queue.empty()
        seen = await records.get(SID)
        by_name = await records.get_by_name("default", "one")
        assert seen is not None
        assert seen.labels == by_name.labels == {"activated": "1", "session": "1"}
        assert await stored_labels(counting) == {}  # untouched until the release
        written = await records.release(SID, lambda r: r.labels.update(created="1"))
        assert written is not None
        assert written.resource_version == 2
        assert counting.updates == 1
        assert queue.qsize() == 1
        assert await stored_labels(counting) == {"activated": "1", "session": "1", "created": "1"}
        # Released: the next mutation is written at once again.
        await records.mutate(SID, lambda r: r.labels.update(later="1"))
        assert counting.updates == 2


async def test_a_release_with_nothing_folded_writes_nothing_and_a_remove_ends_the_hold(tmp_path: Path) -> None:
    async with one_record(tmp_path, EventBus()) as (counting, records):
        records.hold(SID)
        assert await records.release(SID) is None
        assert counting.updates == 0
        records.hold(SID)
        await records.mutate(SID, lambda r: r.labels.update(a="1"))
        await records.remove(SID)
        with pytest.raises(NotFoundError):
            await records.mutate(SID, lambda r: r.labels.update(b="1"))
        assert await records.get(SID) is None


async def test_holding_is_a_no_op_on_a_store_shared_by_replicas(tmp_path: Path) -> None:
    async with one_record(tmp_path, EventBus(), exclusive=False) as (counting, records):
        records.hold(SID)
        await records.mutate(SID, lambda r: r.labels.update(a="1"))
        assert counting.updates == 1
        written = await records.release(SID, lambda r: r.labels.update(b="1"))
        assert written is not None
        assert written.labels == {"a": "1", "b": "1"}
        assert counting.updates == 2


async def test_reads_share_one_decode_per_version_and_a_failed_change_leaves_it_alone(tmp_path: Path) -> None:
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    try:
        records = SandboxRecords(store, EventBus(), exclusive=True)
        sid = SandboxId("sb-shared")
        await records.insert(SandboxRecord(id=sid, name="shared"))
        first = await records.get(sid)
        assert first is not None
        # Readers share the decode of a version: by id, by name and in a listing.
        assert await records.get(sid) is first
        assert await records.get_by_name("default", "shared") is first
        assert next(r for r in await records.list() if r.id == sid) is first

        def fails(record: SandboxRecord) -> None:
            record.labels["half"] = "made"
            raise RuntimeError("the change gave up")

        # A change works on a copy of its own: one that fails leaves the readers' record as it was.
        with pytest.raises(RuntimeError):
            await records.mutate(sid, fails)
        assert first.labels == {}
        changed = await records.mutate(sid, lambda r: r.labels.update(a="1"))
        assert first.labels == {}
        assert first.resource_version == 1
        assert await records.get(sid) is changed
        assert changed.labels == {"a": "1"}
        assert changed.resource_version == 2
    finally:
        await store.aclose()


class GatedStore(CountingStore):
    """The real store, whose writes reach it only once `gate` is set (a worker thread that has not
    got the GIL yet); `fail_next` fails the next write as an unreachable store would."""

    def __init__(self, store: SqliteStore) -> None:
        super().__init__(store)
        self.gate = asyncio.Event()
        self.fail_next = False
        self.sent: list[int] = []

    async def update(self, *, kind: str, id: str, expected_version: int, payload: str) -> StoredObject:
        self.sent.append(expected_version)
        failing, self.fail_next = self.fail_next, False
        await self.gate.wait()
        if failing:
            raise UnavailableError("the store is unreachable")
        return await self.store.update(kind=kind, id=id, expected_version=expected_version, payload=payload)


async def test_a_mutation_is_sent_behind_a_write_in_flight_instead_of_after_it(tmp_path: Path) -> None:
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    gated = GatedStore(store)
    try:
        records = SandboxRecords(gated, EventBus(), exclusive=True)  # type: ignore[arg-type]
        sid = SandboxId("sb-1")
        gated.gate.set()
        await records.insert(SandboxRecord(id=sid, name="one"))
        gated.gate.clear()
        first = asyncio.create_task(records.mutate(sid, lambda r: r.labels.update(a="1")))
        seen: list[dict[str, str]] = []
        second = asyncio.create_task(records.mutate(sid, lambda r: seen.append(dict(r.labels))))
        async with asyncio.timeout(5):
            while len(gated.sent) < 2:
                await asyncio.sleep(0)
        # Both sent while the first is still unanswered, the second on top of the first's change.
        assert gated.sent == [1, 2]
        assert seen == [{"a": "1"}]
        gated.gate.set()
        assert (await first).resource_version == 2
        assert (await second).resource_version == 3
        stored = await store.get(KIND_SANDBOX, sid)
        assert stored is not None
        assert stored.resource_version == 3
        assert SandboxRecord.model_validate_json(stored.payload).labels == {"a": "1"}
        assert gated.reads == 0
    finally:
        await store.aclose()


async def test_when_a_write_fails_the_ones_sent_behind_it_start_over_from_the_store(tmp_path: Path) -> None:
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    gated = GatedStore(store)
    try:
        records = SandboxRecords(gated, EventBus(), exclusive=True)  # type: ignore[arg-type]
        sid = SandboxId("sb-1")
        gated.gate.set()
        await records.insert(SandboxRecord(id=sid, name="one"))
        gated.gate.clear()
        gated.fail_next = True
        first = asyncio.create_task(records.mutate(sid, lambda r: r.labels.update(a="1")))
        second = asyncio.create_task(records.mutate(sid, lambda r: r.labels.update(b="2")))
        async with asyncio.timeout(5):
            while len(gated.sent) < 2:
                await asyncio.sleep(0)
        gated.gate.set()
        with pytest.raises(UnavailableError):
            await first
        written = await second
        # The second was sent on top of the first's change, lost its compare-and-swap, and was
        # applied again to what the store holds: the failed change is nowhere.
        assert written.labels == {"b": "2"}
        assert gated.sent == [1, 2, 1]
        stored = await store.get(KIND_SANDBOX, sid)
        assert stored is not None
        assert stored.resource_version == 2
        assert SandboxRecord.model_validate_json(stored.payload).labels == {"b": "2"}
        fetched = await records.get(sid)
        assert fetched is not None
        assert fetched.labels == {"b": "2"}
    finally:
        await store.aclose()


async def test_a_deferred_change_is_written_with_the_next_write_and_read_once_written(tmp_path: Path) -> None:
    bus = EventBus()
    async with one_record(tmp_path, bus) as (counting, records), bus.subscribe(SID, replay_output=False) as queue:
        seen = await records.get(SID)  # what a watcher keeps, to compare the next read with
        assert seen is not None
        await records.mutate_later(SID, lambda r: r.labels.update(activated="1"), within=60)
        await records.mutate_later(SID, lambda r: r.labels.update(backend="1"), within=60)
        assert counting.updates == 0
        assert queue.empty()
        unwritten = await records.get(SID)
        assert unwritten is not None
        assert unwritten.labels == {}
        assert await stored_labels(counting) == {}
        # A change with nothing of its own to write still writes what was deferred.
        written = await records.mutate(SID, lambda r: False)
        assert written.labels == {"activated": "1", "backend": "1"}
        assert counting.updates == 1
        assert queue.qsize() == 1
        assert await stored_labels(counting) == {"activated": "1", "backend": "1"}
        latest = await records.get(SID)
        by_name = await records.get_by_name("default", "one")
        assert latest is not None
        assert latest.labels == by_name.labels == {"activated": "1", "backend": "1"}
        # The record read before is left as it was: a watcher sees the write as a new version.
        assert (seen.labels, seen.resource_version) == ({}, 1)
        assert latest.resource_version == 2
        await records.mutate(SID, lambda r: r.labels.update(session="1"))
        assert counting.updates == 2


async def test_a_deferred_change_no_write_takes_is_written_alone_and_one_of_a_removed_record_never(
    tmp_path: Path,
) -> None:
    async with one_record(tmp_path, EventBus()) as (counting, records):
        await records.mutate_later(SID, lambda r: r.labels.update(activated="1"), within=0.01)
        async with asyncio.timeout(5):
            while await stored_labels(counting) != {"activated": "1"}:
                await asyncio.sleep(0.01)
        assert counting.updates == 1
        await records.mutate_later(SID, lambda r: r.labels.update(gone="1"), within=0.01)
        await records.remove(SID)
        await asyncio.sleep(0.05)
        assert counting.updates == 1
        assert await records.get(SID) is None


async def test_deferred_changes_are_written_when_flushed_and_at_once_on_a_shared_store(tmp_path: Path) -> None:
    async with one_record(tmp_path, EventBus()) as (counting, records):
        await records.mutate_later(SID, lambda r: r.labels.update(a="1"), within=60)
        await records.flush_deferred()
        assert counting.updates == 1
        assert await stored_labels(counting) == {"a": "1"}
    (tmp_path / "shared").mkdir()
    async with one_record(tmp_path / "shared", EventBus(), exclusive=False) as (counting, records):
        await records.mutate_later(SID, lambda r: r.labels.update(a="1"), within=60)
        assert counting.updates == 1
        assert await stored_labels(counting) == {"a": "1"}


async def test_a_hold_folds_in_what_was_deferred_before_it(tmp_path: Path) -> None:
    async with one_record(tmp_path, EventBus()) as (counting, records):
        await records.mutate_later(SID, lambda r: r.labels.update(view="1"), within=60)
        records.hold(SID)  # a resume of this record
        await records.mutate(SID, lambda r: r.labels.update(resuming="1"))
        written = await records.release(SID)
        assert written is not None
        assert counting.updates == 1
        assert await stored_labels(counting) == {"view": "1", "resuming": "1"}


class LateAnswerStore(CountingStore):
    """The real store, whose updates are done at once but answered only once `answer` is set (a
    loaded loop that runs the answer's task a turn after the store ran a delete sent behind it)."""

    def __init__(self, store: SqliteStore) -> None:
        super().__init__(store)
        self.written = asyncio.Event()
        self.answer = asyncio.Event()

    async def update(self, *, kind: str, id: str, expected_version: int, payload: str) -> StoredObject:
        row = await self.store.update(kind=kind, id=id, expected_version=expected_version, payload=payload)
        self.written.set()
        await self.answer.wait()
        return row


async def test_a_write_answered_after_the_remove_does_not_bring_the_record_back(tmp_path: Path) -> None:
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    late = LateAnswerStore(store)
    try:
        records = SandboxRecords(late, EventBus(), exclusive=True)  # type: ignore[arg-type]
        sid = SandboxId("sb-1")
        await records.insert(SandboxRecord(id=sid, name="one"))
        writing = asyncio.create_task(records.mutate(sid, lambda r: r.labels.update(a="1")))
        async with asyncio.timeout(5):
            await late.written.wait()
        assert await records.remove(sid) is True
        late.answer.set()
        assert (await writing).labels == {"a": "1"}  # it was written, before the remove
        assert await store.get(KIND_SANDBOX, sid) is None
        assert await records.get(sid) is None
        with pytest.raises(NotFoundError, match="default/one"):
            await records.get_by_name("default", "one")
        assert [r.id for r in await records.list()] == []
    finally:
        await store.aclose()


@pytest.mark.parametrize("exclusive", [True, False])
async def test_a_write_cancelled_before_it_was_sent_leaves_no_unawaited_store_call(
    tmp_path: Path, exclusive: bool
) -> None:
    """A mutation cancelled while its write waits for its first turn (a gateway stopping, a
    caller gone): the store's call it had made never runs, and is closed, not left for the
    collector to report as a coroutine never awaited."""
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    try:
        records = SandboxRecords(store, EventBus(), exclusive=exclusive)
        sid = SandboxId("sb-1")
        await records.insert(SandboxRecord(id=sid, name="one"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mutating = asyncio.create_task(records.mutate(sid, lambda r: r.labels.update(a="1")))
            await asyncio.sleep(0)  # to its wait for the write, which has not had a turn yet
            mutating.cancel()
            with pytest.raises(asyncio.CancelledError):
                await mutating
            gc.collect()
        assert not [w for w in caught if "never awaited" in str(w.message)]
    finally:
        await store.aclose()
