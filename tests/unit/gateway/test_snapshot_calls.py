"""The snapshot calls on a driver that cannot snapshot (Kubernetes, the fake driver): refused with
FAILED_PRECONDITION naming the driver, before anything is made."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.unit.gateway.test_manager import manager_for, new
from warmshell.core.errors import FailedPreconditionError
from warmshell.drivers.base import Snapshotter
from warmshell.drivers.fake import FakeDriver
from warmshell.gateway.events import EventBus
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.snapshot_calls import SnapshotCalls
from warmshell.gateway.store.sqlite import open_sqlite_store


@pytest.fixture
async def records(tmp_path: Path) -> AsyncIterator[SandboxRecords]:
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    yield SandboxRecords(store, EventBus())
    await store.aclose()


async def test_a_driver_that_cannot_snapshot_refuses_snapshot_fork_and_pause(records: SandboxRecords) -> None:
    driver = FakeDriver()
    assert not isinstance(driver, Snapshotter)
    calls = SnapshotCalls()
    calls._manager = manager_for(records, driver)
    await calls._manager.create(new("plain"))
    for verb, done in (("snapshot", "snapshotted"), ("fork", "forked"), ("pause", "paused")):
        with pytest.raises(FailedPreconditionError, match=f"the {driver.name} driver cannot {verb} a sandbox"):
            await calls._ready_parent("", "plain", verb, done)
