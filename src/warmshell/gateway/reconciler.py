"""Keeps stored sandboxes in step with the backend: follows the driver's watch, relists
periodically, repairs what a crash left half-done, and settles orphans after a grace period.

With several replicas on one store, the record-writing work (folding backend events, the relist,
orphans and deadlines) is the leader's alone; every replica still passes progress lines to its own
watchers (and those only it saw to the other replicas'), and at start clears only the sessions no
live replica holds."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable

from warmshell.core import phases
from warmshell.core.errors import WarmshellError
from warmshell.core.ids import SandboxId
from warmshell.core.models import Phase, SandboxRecord, now_ms
from warmshell.drivers.base import CachedLister, DriverSandbox, ProgressLine, Suspender
from warmshell.gateway import metrics
from warmshell.gateway.manager import SandboxManager

__all__ = ["Reconciler"]

log = logging.getLogger(__name__)

WATCH_RETRY_SECONDS = 1.0
# A relist between two live ones judges from the driver's cached objects (Kubernetes: LISTing
# and joining every Sandbox, pod and claim cost the gateway 6.5 ms of CPU a pass with a pool of
# 40 members, the informers' views 0.5). The live one bounds how long a watch that stopped
# delivering without an error (a connection a proxy holds open, dead) could hide a change.
LIVE_LIST_SECONDS = 60.0


class Reconciler:
    """Background loops of one gateway."""

    def __init__(
        self,
        manager: SandboxManager,
        *,
        interval_seconds: float,
        orphan_grace_seconds: float,
        leading: Callable[[], bool] = lambda: True,
        share_progress: Callable[[SandboxId, ProgressLine], None] | None = None,
    ) -> None:
        """`share_progress`: with replicas, passes each progress line of the driver's to the
        other replicas' watchers (`gateway.progressfeed`)."""
        self._manager = manager
        self._share_progress = share_progress
        self._interval = interval_seconds
        self._grace_ms = orphan_grace_seconds * 1000
        self._leading = leading
        self._listed_live_at = -math.inf  # monotonic; the first pass (a start's repair) lists live

    async def startup(self, *, live_owners: frozenset[str] = frozenset()) -> None:
        """Before serving: sessions from a previous run are gone, Deleting rows finish deleting.
        Sessions held by `live_owners` (other replicas, alive) are theirs, and left alone."""
        for record in await self._manager.records.list():
            if record.status.phase == Phase.DELETING:
                if self._leading():
                    with contextlib.suppress(WarmshellError):
                        await self._manager.finish_delete(record.id)
            elif record.status.supervisor_connected and record.status.session_owner not in live_owners:
                await self._manager.records.mutate(record.id, _clear_session)

    async def run_watch(self) -> None:
        """Follow the driver's events, reopening the stream when it ends."""
        while True:
            try:
                async for event in self._manager.driver.watch():
                    if not self._leading():
                        # Another replica writes what the backend says; progress is for our watchers.
                        if event.progress is None:
                            continue
                        event = dataclasses.replace(event, sandbox=None, deleted=False)
                    await self._manager.on_driver_event(event)
                    if event.progress is not None and self._share_progress is not None:
                        self._share_progress(event.sandbox_id, event.progress)
            except WarmshellError as exc:
                log.warning("driver watch failed; retrying: %s", exc)
            await asyncio.sleep(WATCH_RETRY_SECONDS)

    async def run_relist(self) -> None:
        """Relist every interval; compare store and backend. Every replica (leading or not)
        also writes the closes of its sessions that the store missed."""
        while True:
            try:
                await self.record_closes()
                if self._leading():
                    await self.reconcile_once()
            except WarmshellError as exc:
                log.warning("reconcile failed; retrying: %s", exc)
            await asyncio.sleep(self._interval)

    async def record_closes(self) -> None:
        """Write the session closes the store missed (it was unreachable when they happened):
        until then the records name this replica as their sessions' holder, and the other
        replicas refuse those supervisors' reconnects (a Postgres restart left them out for
        minutes: only a retry that the balancer happened to send here was accepted)."""
        for sandbox_id, session_id in self._manager.sessions.unrecorded_closes():
            await self._manager.on_session(sandbox_id, connected=False, session_id=session_id)

    async def reconcile_once(self) -> None:
        """One pass: apply backend views, settle vanished backends and orphans, update gauges."""
        manager = self._manager
        backend = {view.sandbox_id: view for view in await self._backend_views()}
        records = await manager.records.list()
        known = {r.id for r in records}
        by_phase: dict[str, int] = dict.fromkeys((p.value for p in Phase), 0)
        for record in records:
            by_phase[record.status.phase.value] += 1
            view = backend.get(record.id)
            if record.status.phase == Phase.DELETING:
                await self._retry_delete(record)
                continue
            if record.status.phase == Phase.PROVISIONING:
                await manager.enforce_deadline(record)
            if view is not None and record.status.phase == Phase.PAUSED and not view.suspended:
                await self._suspend_again(record)
            if view is not None:
                if view.state.value != record.status.backend_state:
                    await manager.on_driver_event_view(view)
            elif record.status.phase not in phases.TERMINAL:
                await self._maybe_vanished(record)
        for sandbox_id in backend.keys() - known:
            log.info("deleting backend sandbox %s: no record of it", sandbox_id)
            try:
                await manager.driver.delete(sandbox_id)
            except WarmshellError as exc:
                log.warning("could not delete orphan backend sandbox %s: %s", sandbox_id, exc)
        for phase, count in by_phase.items():
            metrics.SANDBOXES.labels(phase=phase).set(count)
        for pool in manager.driver.pools():
            metrics.POOL_MEMBERS.labels(pool=pool.name, state="desired").set(pool.desired)
            metrics.POOL_MEMBERS.labels(pool=pool.name, state="ready").set(pool.ready)
            metrics.POOL_MEMBERS.labels(pool=pool.name, state="idle").set(pool.idle)

    async def _backend_views(self) -> list[DriverSandbox]:
        """The backend's sandboxes, from the driver's cache when it has a current one and a live
        list was made within `LIVE_LIST_SECONDS`, else listed live. A cached view decides nothing
        irreversible alone: a backend missing from it is read live before its record is marked
        vanished (`_maybe_vanished`), and an orphan's delete finds its object under its uid.
        Read before the records, as a live list is: a backend object exists only after its
        record was inserted, so one seen without a record is an orphan, or already deleted."""
        driver, now = self._manager.driver, time.monotonic()
        if isinstance(driver, CachedLister) and now - self._listed_live_at < LIVE_LIST_SECONDS:
            cached = driver.cached_list()
            if cached is not None:
                return cached
        views = await driver.list()
        self._listed_live_at = now
        return views

    async def _suspend_again(self, record: SandboxRecord) -> None:
        """A Paused record whose backend still runs it: a suspend that failed, or a gateway that
        stopped between a resume's write and its record (which stayed Paused). The record is the
        truth; the backend follows it."""
        driver = self._manager.driver
        if not isinstance(driver, Suspender):
            return
        log.info("sandbox %s/%s is Paused and its backend runs it: suspending it", record.workspace, record.name)
        try:
            await driver.suspend(record.id)
        except WarmshellError as exc:
            log.warning("sandbox %s/%s: could not suspend it: %s", record.workspace, record.name, exc)

    async def _retry_delete(self, record: SandboxRecord) -> None:
        with contextlib.suppress(WarmshellError):
            await self._manager.finish_delete(record.id)

    async def _maybe_vanished(self, record: SandboxRecord) -> None:
        seen = max(record.created_at_ms, record.status.backend_seen_ms)
        if now_ms() - seen < self._grace_ms:
            return
        # Re-check directly: a list can race a create that has not shown up yet.
        if await self._manager.driver.get(record.id) is not None:
            return
        log.warning("sandbox %s/%s: backend vanished; marking Error", record.workspace, record.name)
        await self._manager.records.mutate(
            record.id,
            lambda r: phases.mark_backend_vanished(r.status, "the backend no longer has this sandbox"),
        )


def _clear_session(record: SandboxRecord) -> None:
    record.status.session_id, record.status.session_owner = "", ""
    phases.mark_session(record.status, False)
