"""With replicas, the relist (vanished backends, orphans) is singleton work under the Lease: a
replica that does not lead neither lists the backend nor deletes what has no record; the replica
that takes the Lease over does."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from warmshell.gateway.reconciler import Reconciler
from warmshell.gateway.sessions import SessionTable


class Backend:
    """A driver holding one sandbox that no record knows of."""

    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.listed = 0

    async def list(self) -> list[Any]:
        self.listed += 1
        return [SimpleNamespace(sandbox_id="orphan-1")]

    async def delete(self, sandbox_id: str) -> None:
        self.deleted.append(sandbox_id)

    def pools(self) -> list[Any]:
        return []


class NoRecords:
    async def list(self) -> list[Any]:
        return []


async def relist_for_a_while(leading: list[bool], backend: Backend, seconds: float = 0.2) -> None:
    manager = SimpleNamespace(driver=backend, records=NoRecords(), sessions=SessionTable())
    reconciler = Reconciler(
        manager,  # type: ignore[arg-type]
        interval_seconds=0.01,
        orphan_grace_seconds=0,
        leading=lambda: leading[0],
    )
    task = asyncio.create_task(reconciler.run_relist())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_replica_that_does_not_lead_neither_lists_nor_deletes_orphans() -> None:
    backend = Backend()
    await relist_for_a_while([False], backend)
    assert backend.listed == 0
    assert backend.deleted == []


async def test_the_replica_that_becomes_leader_deletes_the_orphan() -> None:
    backend, leading = Backend(), [False]
    await relist_for_a_while(leading, backend, seconds=0.05)
    assert backend.deleted == []
    leading[0] = True
    await relist_for_a_while(leading, backend, seconds=0.05)
    assert backend.listed > 0
    assert set(backend.deleted) == {"orphan-1"}
