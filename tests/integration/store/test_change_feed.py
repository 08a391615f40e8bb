"""The change feed of a real Postgres between two replicas' records: each notification says the
version written, a replica's own write comes back as no news to its watchers, and another's
makes the kept row go so the next watcher's read asks the store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from tests.helpers.postgres import DevPostgres
from tests.integration.store.conftest import SETTINGS
from warmshell.core.ids import SandboxId
from warmshell.core.models import SandboxRecord
from warmshell.gateway.events import EventBus
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.replication import follow
from warmshell.gateway.store import postgres

SID = SandboxId("sb-1")


@dataclass
class Replica:
    """One replica's store, records and bus, its feed followed; what it heard, in order."""

    store: postgres.PostgresStore
    records: SandboxRecords
    bus: EventBus
    heard: list[postgres.Change] = field(default_factory=list)
    told: list[SandboxId | None] = field(default_factory=list)  # its watchers' changes (bus.on_change)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_heard(self, op: str, sandbox_id: str) -> postgres.Change:
        """The first change heard of `op` on `sandbox_id` (waiting for it)."""
        while True:
            for change in self.heard:
                if change.op == op and change.id == sandbox_id:
                    return change
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 10)


@asynccontextmanager
async def replica(url: str, password: str) -> AsyncIterator[Replica]:
    store = await postgres.open_postgres_store(url, password=password, config=SETTINGS)
    bus = EventBus()
    records = SandboxRecords(store, bus, exclusive=False)
    one = Replica(store, records, bus)
    bus.on_change(one.told.append)
    to_bus = follow(bus, records)

    def changed(change: postgres.Change) -> None:
        to_bus(change)
        one.heard.append(change)
        one.arrived.set()

    listening = asyncio.Event()
    task = asyncio.create_task(store.follow_changes(changed, None, listening, on_listening=records.feed_listening))
    try:
        await asyncio.wait_for(listening.wait(), 10)
        yield one
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await store.aclose()


def _labelled(**labels: str) -> Callable[[SandboxRecord], None]:
    return lambda record: record.labels.update(labels)


async def test_the_feed_says_each_version_and_a_replicas_own_echo_is_no_news(
    dev_postgres: DevPostgres, postgres_url: str
) -> None:
    async with replica(postgres_url, dev_postgres.password) as one, replica(postgres_url, dev_postgres.password) as two:
        await one.records.insert(SandboxRecord(id=SID, name="one"))
        await one.wait_heard("INSERT", SID)
        await two.wait_heard("INSERT", SID)
        one.told.clear()
        two.told.clear()
        written = await one.records.mutate(SID, _labelled(a="1"))
        assert (await two.wait_heard("UPDATE", SID)).version == written.resource_version == 2
        assert (await one.wait_heard("UPDATE", SID)).version == 2
        assert [c.version for c in one.heard if c.id == SID] == [1, 2]
        # Each replica's watchers were told of the update once: on the writer, by the write's
        # answer or its echo, whichever came first; on the other, heard.
        assert one.told == [SID]
        assert two.told == [SID]
        await one.records.remove(SID)
        assert (await two.wait_heard("DELETE", SID)).version == 0


async def test_another_replicas_write_makes_the_kept_row_go(dev_postgres: DevPostgres, postgres_url: str) -> None:
    async with replica(postgres_url, dev_postgres.password) as one, replica(postgres_url, dev_postgres.password) as two:
        await one.records.insert(SandboxRecord(id=SID, name="one"))
        await two.wait_heard("INSERT", SID)
        kept = await two.records.get(SID, may_lag=True)
        assert kept is not None
        assert await two.records.get(SID, may_lag=True) is kept  # kept: no second read
        await one.records.mutate(SID, _labelled(a="1"))
        await two.wait_heard("UPDATE", SID)
        latest = await two.records.get(SID, may_lag=True)
        assert latest is not None
        assert (latest.resource_version, latest.labels) == (2, {"a": "1"})
        # Its own mutation starts from the row it keeps; the other replica's next one from a lagging
        # row loses its swap and reads the store, and nothing is lost either way.
        await two.records.mutate(SID, _labelled(b="2"))
        final = await one.records.mutate(SID, _labelled(c="3"))
        assert (final.resource_version, final.labels) == (4, {"a": "1", "b": "2", "c": "3"})
