"""What an expiry pass reads: after one listing at start, only the sandboxes that can expire (a
TTL or an idle timeout), learnt from this gateway's own writes; with a store other replicas also
write, a listing again every `resync_seconds` and on becoming the leader. Over a real SQLite
store, counting the listings and reads that reach it; the manager is a stand-in with just what
the reconciler uses."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from warmshell.core.ids import SandboxId
from warmshell.core.models import Lifetime, SandboxRecord, now_ms
from warmshell.gateway.events import Changed, EventBus
from warmshell.gateway.expiry import ExpiryReconciler
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.store.base import StoredObject
from warmshell.gateway.store.sqlite import SqliteStore, open_sqlite_store


class CountingStore:
    """The real store, counting the listings and reads that reach it."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.listings = 0
        self.reads = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def list(self, kind: str, workspace: str | None = None) -> list[StoredObject]:
        self.listings += 1
        return await self.store.list(kind, workspace)

    async def get(self, kind: str, id: str) -> StoredObject | None:
        self.reads += 1
        return await self.store.get(kind, id)


@dataclass
class Manager:
    """What the reconciler uses of the SandboxManager."""

    records: SandboxRecords
    bus: EventBus = field(default_factory=EventBus)
    activity: dict[SandboxId, int] = field(default_factory=dict)
    sessions: dict[SandboxId, object] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)

    async def delete(self, workspace: str, name: str) -> None:
        record = await self.records.get_by_name(workspace, name)
        await self.records.remove(record.id)
        self.deleted.append(name)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[CountingStore]:
    sqlite = await open_sqlite_store(tmp_path / "db.sqlite")
    try:
        yield CountingStore(sqlite)
    finally:
        await sqlite.aclose()


def record(name: str, **lifetime: int) -> SandboxRecord:
    return SandboxRecord(id=SandboxId(f"sb-{name}"), name=name, lifetime=Lifetime(**lifetime))


def replica_on_a_shared_store(
    store: CountingStore,
) -> tuple[SandboxRecords, SandboxRecords, Manager, ExpiryReconciler]:
    """This replica's records, manager and expiry pass (one bus, as in the gateway) on a store
    another replica's records (the second) write too."""
    bus = EventBus()
    ours = SandboxRecords(store, bus)  # type: ignore[arg-type]
    manager = Manager(ours, bus=bus)
    expiry = ExpiryReconciler(manager, interval_seconds=1, resync_seconds=3600)  # type: ignore[arg-type]
    return ours, SandboxRecords(store.store, EventBus()), manager, expiry


async def test_with_a_store_of_its_own_a_pass_reads_only_what_can_expire(store: CountingStore) -> None:
    records = SandboxRecords(store, EventBus(), exclusive=True)  # type: ignore[arg-type]
    manager = Manager(records)
    for i in range(50):
        await records.insert(record(f"forever-{i}"))
    await records.insert(record("old-ttl", expires_at_ms=now_ms() + 3_600_000))
    expiry = ExpiryReconciler(manager, interval_seconds=1)  # type: ignore[arg-type]
    await expiry.expire_once()  # the first pass lists every record, once
    assert store.listings == 1
    assert expiry.watched == {SandboxId("sb-old-ttl")}
    # Made after it: heard of from the write, not from a listing.
    await records.insert(record("brief", expires_at_ms=now_ms() - 1))
    await records.insert(record("idle", idle_timeout_seconds=3600, last_activity_ms=now_ms()))
    later = await records.insert(record("later"))
    await records.mutate(later.id, lambda r: setattr(r.lifetime, "expires_at_ms", now_ms() + 3_600_000))
    for _ in range(3):
        await expiry.expire_once()
    assert store.listings == 1
    assert manager.deleted == ["brief"]
    assert expiry.watched == {SandboxId("sb-old-ttl"), SandboxId("sb-idle"), SandboxId("sb-later")}
    # A refresh that takes the limit away takes it off the list.
    await records.mutate(later.id, lambda r: setattr(r.lifetime, "expires_at_ms", 0))
    assert SandboxId("sb-later") not in expiry.watched


async def test_with_a_shared_store_it_lists_again_every_resync_and_on_becoming_the_leader(
    store: CountingStore,
) -> None:
    ours = SandboxRecords(store, EventBus())  # type: ignore[arg-type]
    theirs = SandboxRecords(store.store, EventBus())  # another replica on the same store
    manager = Manager(ours)
    leading = [False]
    expiry = ExpiryReconciler(manager, interval_seconds=1, leading=lambda: leading[0], resync_seconds=3600)  # type: ignore[arg-type]
    await expiry.expire_once(expire=False)
    assert store.listings == 1
    await theirs.insert(record("theirs", expires_at_ms=now_ms() - 1))
    await expiry.expire_once(expire=False)
    assert (store.listings, manager.deleted) == (1, [])  # not heard of, and not the leader anyway
    await expiry.expire_once(expire=True)  # just became the leader: it lists, and finds it
    assert (store.listings, manager.deleted) == (2, ["theirs"])
    await theirs.insert(record("theirs-too", expires_at_ms=now_ms() - 1))
    await expiry.expire_once(expire=True)
    assert (store.listings, manager.deleted) == (2, ["theirs"])  # until the resync is due
    # As if resync_seconds had passed (not 0.0: a freshly booted host's monotonic clock is younger).
    expiry._listed_at = time.monotonic() - 3600
    await expiry.expire_once(expire=True)
    assert (store.listings, manager.deleted) == (3, ["theirs", "theirs-too"])


async def test_with_a_shared_store_activity_served_here_is_stored_before_a_listing_finds_it(
    store: CountingStore,
) -> None:
    ours = SandboxRecords(store, EventBus())  # type: ignore[arg-type]
    theirs = SandboxRecords(store.store, EventBus())
    manager = Manager(ours)
    expiry = ExpiryReconciler(manager, interval_seconds=1, resync_seconds=3600)  # type: ignore[arg-type]
    await expiry.expire_once(expire=False)
    made = await theirs.insert(record("idle", idle_timeout_seconds=3600, last_activity_ms=1))
    manager.activity[made.id] = now_ms()  # an exec served by this replica
    await expiry.expire_once(expire=False)
    stored = await theirs.get(made.id)
    assert stored is not None
    assert stored.lifetime.last_activity_ms == manager.activity[made.id]
    assert store.listings == 1


async def test_with_a_shared_store_a_replica_not_leading_reads_only_the_sandboxes_it_served_execs_of(
    store: CountingStore,
) -> None:
    ours, _, manager, expiry = replica_on_a_shared_store(store)
    made = [await ours.insert(record(f"ttl-{i}", expires_at_ms=now_ms() + 3_600_000)) for i in range(20)]
    idle = await ours.insert(record("idle", idle_timeout_seconds=3600, last_activity_ms=1))
    await expiry.expire_once(expire=False)  # the first pass lists
    reads = store.reads
    manager.activity[idle.id] = now_ms()  # an exec served here
    for _ in range(3):
        await expiry.expire_once(expire=False)
    # The one sandbox with activity (read, read again to store its activity, read once more
    # after that write, then kept); not the 20 others.
    assert store.reads - reads == 3
    assert expiry.watched == {m.id for m in made} | {idle.id}  # kept for when it leads
    stored = await ours.get(idle.id)
    assert stored is not None
    assert stored.lifetime.last_activity_ms == manager.activity[idle.id]
    await expiry.expire_once(expire=True)  # become the leader: one listing
    reads = store.reads
    await expiry.expire_once(expire=True)  # the leader reads every candidate it has not kept
    assert store.reads - reads == 20


async def test_with_a_shared_store_a_listing_forgets_what_another_replica_deleted(store: CountingStore) -> None:
    ours, theirs, _, expiry = replica_on_a_shared_store(store)
    gone = await ours.insert(record("gone", expires_at_ms=now_ms() + 3_600_000))
    kept = await ours.insert(record("kept", expires_at_ms=now_ms() + 3_600_000))
    await expiry.expire_once(expire=False)
    assert expiry.watched == {gone.id, kept.id}
    await theirs.remove(gone.id)  # deleted through another replica: nothing heard here
    await expiry.expire_once(expire=False)
    assert expiry.watched == {gone.id, kept.id}  # not read by a replica that is not leading
    expiry._listed_at = time.monotonic() - 3600  # the resync is due
    await expiry.expire_once(expire=False)
    assert expiry.watched == {kept.id}


async def test_with_a_shared_store_a_record_found_not_due_is_read_again_only_once_it_changed(
    store: CountingStore,
) -> None:
    ours, theirs, manager, expiry = replica_on_a_shared_store(store)
    made = [await ours.insert(record(f"ttl-{i}", expires_at_ms=now_ms() + 3_600_000)) for i in range(20)]
    await expiry.expire_once()  # lists
    await expiry.expire_once()  # reads each once
    reads = store.reads
    for _ in range(3):
        await expiry.expire_once()
    assert store.reads == reads  # nothing changed, nothing due: nothing read
    # Another replica shortens one's TTL; the change feed tells this replica's bus of it.
    await theirs.mutate(made[0].id, lambda r: setattr(r.lifetime, "expires_at_ms", now_ms() - 1))
    manager.bus.publish(made[0].id, Changed())
    await expiry.expire_once()
    assert manager.deleted == ["ttl-0"]
    # A write of this replica's own is heard as it is written.
    await ours.mutate(made[1].id, lambda r: setattr(r.lifetime, "expires_at_ms", now_ms() - 1))
    await expiry.expire_once()
    assert manager.deleted == ["ttl-0", "ttl-1"]
    # The feed missed writes: every record is read again.
    reads = store.reads
    manager.bus.changed_everywhere()
    await expiry.expire_once()
    assert store.reads - reads == 18 + 1  # (and ttl-1, deleted by the pass before, found gone)


async def test_a_record_kept_is_read_again_once_it_falls_due_as_kept(store: CountingStore) -> None:
    ours, theirs, manager, expiry = replica_on_a_shared_store(store)
    soon = await ours.insert(record("soon", expires_at_ms=now_ms() + 3_600_000))
    await expiry.expire_once()
    await expiry.expire_once()  # read and kept: not due
    # Refreshed elsewhere and the notice lost: the kept record falls due (as the clock moves on),
    # so it is read again before it is judged, and the refresh holds.
    await theirs.mutate(soon.id, lambda r: setattr(r.lifetime, "expires_at_ms", now_ms() + 7_200_000))
    expiry._read[soon.id].lifetime.expires_at_ms = now_ms() - 1
    reads = store.reads
    await expiry.expire_once()
    assert store.reads - reads == 1
    assert manager.deleted == []


async def test_with_the_change_feed_kept_records_are_screened_unread_and_one_due_is_judged_on_the_store(
    store: CountingStore,
) -> None:
    ours, theirs, manager, expiry = replica_on_a_shared_store(store)
    ours.feed_listening(True)  # what the replica's change feed says once it listens
    made = [await ours.insert(record(f"ttl-{i}", expires_at_ms=now_ms() + 3_600_000)) for i in range(5)]
    for _ in range(3):
        await expiry.expire_once()
    assert store.reads == 0  # the rows it wrote are kept: none read
    # Another replica shortens one's TTL; once heard (as the feed's `follow` tells the bus), the
    # row kept is gone and the pass reads the store's.
    shortened = await theirs.mutate(made[0].id, lambda r: setattr(r.lifetime, "expires_at_ms", now_ms() - 1))
    assert ours.heard_changed(made[0].id, shortened.resource_version)
    manager.bus.publish(made[0].id, Changed())
    await expiry.expire_once()
    assert manager.deleted == ["ttl-0"]
    assert store.reads == 1
    # One due as kept (this replica shortened it, another has refreshed it since, not heard yet)
    # is read from the store before it is judged.
    await ours.mutate(made[1].id, lambda r: setattr(r.lifetime, "expires_at_ms", now_ms() - 1))
    await theirs.mutate(made[1].id, lambda r: setattr(r.lifetime, "expires_at_ms", now_ms() + 7_200_000))
    kept = ours.kept(made[1].id)
    assert kept is not None
    assert kept.lifetime.expires_at_ms < now_ms()
    await expiry.expire_once()
    assert manager.deleted == ["ttl-0"]
    assert store.reads == 3  # it, and ttl-0 (deleted by the pass before) found gone
