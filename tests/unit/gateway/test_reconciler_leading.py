"""With replicas, the relist (vanished backends, orphans) is singleton work under the Lease: a
replica that does not lead neither lists the backend nor deletes what has no record; the replica
that takes the Lease over does. Between live lists, a driver that caches its objects is judged
from its cache."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from warmshell.gateway import reconciler as reconciler_module
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


class CachingBackend(Backend):
    """A driver that can also say what a list would from its cache (`CachedLister`)."""

    def __init__(self, cached: list[Any] | None) -> None:
        super().__init__()
        self.cached = cached

    def cached_list(self) -> list[Any] | None:
        return self.cached


async def relist_passes(backend: Backend, passes: int) -> None:
    manager = SimpleNamespace(driver=backend, records=NoRecords(), sessions=SessionTable())
    reconciler = Reconciler(manager, interval_seconds=0.01, orphan_grace_seconds=0)  # type: ignore[arg-type]
    for _ in range(passes):
        await reconciler.reconcile_once()


async def test_the_relist_lists_live_first_then_judges_from_the_cache() -> None:
    backend = CachingBackend([SimpleNamespace(sandbox_id="orphan-2")])
    await relist_passes(backend, 3)
    assert backend.listed == 1  # the first pass (a start's repair) reads the backend itself
    assert backend.deleted == ["orphan-1", "orphan-2", "orphan-2"]  # each pass judges what it read


async def test_the_relist_lists_live_while_the_cache_is_not_current() -> None:
    backend = CachingBackend(None)
    await relist_passes(backend, 3)
    assert backend.listed == 3


async def test_the_relist_lists_live_again_after_live_list_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconciler_module, "LIVE_LIST_SECONDS", 0.0)
    backend = CachingBackend([])
    await relist_passes(backend, 3)
    assert backend.listed == 3
