"""The expiry reconciler: deletes sandboxes whose lifetime has ended (TTL passed, idle past
their idle timeout, or Exited for longer than `[lifetimes] exited_retention_seconds`). Expiry is
read from the stored records on every pass, so it holds across gateway restarts; the decision
is `core.lifetimes.due`, the deletion the manager's own.

Exec activity is kept in memory by the manager (an exec costs no store write); each pass stores
the latest activity of sandboxes that have an idle timeout, so a restart loses at most one
interval of it. A command still running counts as activity.

A pass looks only at what can expire: the sandboxes with a TTL or an idle timeout (and, with a
retention, the Exited ones), found by one listing of every record at start and then kept up to
date from the records this gateway writes (`SandboxRecords.observe`). With a store shared by
replicas the others' writes are not heard of, so every `resync_seconds`, and whenever this
replica becomes the leader, a pass lists every record again (a sandbox created on another
replica with a TTL is expired that much later at most); each candidate is read again before it
is judged, so a TTL refreshed elsewhere holds. A replica that is not the leader reads only the
sandboxes whose execs it served (their activity is all it stores). With a shared store a record
read and found not due is kept and not read again until a change to it is heard (this replica's
writes, the others' through the change feed, or all of them when the feed missed some) or it
falls due as kept: every decision to expire is still taken on a fresh read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from warmshell.core import lifetimes, phases
from warmshell.core.errors import NotFoundError, WarmshellError
from warmshell.core.ids import SandboxId
from warmshell.core.models import Phase, SandboxRecord, now_ms
from warmshell.gateway import metrics
from warmshell.gateway.events import Progress
from warmshell.gateway.manager import SandboxManager

__all__ = ["ExpiryReconciler"]

log = logging.getLogger(__name__)

_MESSAGES = {
    "TtlExpired": "its ttl of {ttl} s ended",
    "IdleTimeout": "no exec for {idle} s (its idle timeout)",
    "ExitedRetention": "its workload exited over {retention} s ago ([lifetimes] exited_retention_seconds)",
}


class ExpiryReconciler:
    """One loop per gateway. With replicas, only the leader expires sandboxes; every replica
    stores the exec activity it saw, so the leader judges idleness on all of it."""

    def __init__(
        self,
        manager: SandboxManager,
        *,
        interval_seconds: float,
        leading: Callable[[], bool] = lambda: True,
        resync_seconds: float = 60.0,
        exited_retention_seconds: int = 0,
    ) -> None:
        self._manager = manager
        self._retention = exited_retention_seconds
        self._interval = interval_seconds
        self._leading = leading
        self._resync = resync_seconds
        # The sandboxes that can expire (a TTL or an idle timeout), as far as this gateway knows.
        self._watched: set[SandboxId] = set()
        self._listed_at: float | None = None  # time.monotonic() of the last listing of every record
        self._led = False
        # With a shared store: each candidate's record as last read, while no change to it has
        # been heard since (`_reading`: read, its answer not back yet, nothing heard meanwhile).
        self._read: dict[SandboxId, SandboxRecord] = {}
        self._reading: set[SandboxId] = set()
        manager.records.observe(self._learn)
        manager.bus.on_change(self._changed)

    def _can_expire(self, record: SandboxRecord) -> bool:
        lifetime = record.lifetime
        exited = bool(self._retention) and record.status.phase == Phase.EXITED
        return exited or bool(lifetime.expires_at_ms or lifetime.idle_timeout_seconds)

    def _learn(self, record: SandboxRecord) -> None:
        if self._can_expire(record):
            self._watched.add(record.id)
        else:
            self._watched.discard(record.id)

    def _changed(self, sandbox_id: SandboxId | None) -> None:
        if sandbox_id is None:
            self._read.clear()
            self._reading.clear()
        else:
            self._read.pop(sandbox_id, None)
            self._reading.discard(sandbox_id)

    def _nothing_to_do(self, sandbox_id: SandboxId, expire: bool) -> bool:
        """Whether the record as last read, unchanged since, is not due (`expire`) and has no
        newer exec activity to store: then the pass need not read it again. With a shared store
        a read is a query and a decode, and a leader read every live sandbox every second."""
        record = self._read.get(sandbox_id)
        if record is None:
            return False
        last = self._last_activity(record)
        if expire and self._due(record, last) is not None:
            return False  # due as last read: read again before it is judged
        return not (record.lifetime.idle_timeout_seconds and last > record.lifetime.last_activity_ms)

    async def _reread(self, sandbox_id: SandboxId, expire: bool) -> SandboxRecord | None:
        """The record from the store, kept for later passes when no change was heard meanwhile;
        with a shared store, the record the change feed keeps current when it is not due as
        kept (`expire`: the leader judges it), since one that is due is judged on the store's."""
        self._read.pop(sandbox_id, None)
        records = self._manager.records
        if records.sees_every_write:
            return await records.get(sandbox_id)
        kept = records.kept(sandbox_id)
        if kept is not None and not (expire and self._due(kept, self._last_activity(kept)) is not None):
            # (Another replica's write of the last milliseconds may not be in it: its notice
            # comes, and this pass's successor reads it again.)
            self._read[sandbox_id] = kept
            return kept
        self._reading.add(sandbox_id)
        try:
            record = await self._manager.records.get(sandbox_id)
        finally:
            unchanged = sandbox_id in self._reading
            self._reading.discard(sandbox_id)
        if record is not None and unchanged:
            self._read[sandbox_id] = record
        return record

    @property
    def watched(self) -> frozenset[SandboxId]:
        """The sandboxes a pass looks at (for tests)."""
        return frozenset(self._watched)

    def _list_all_now(self, expire: bool) -> bool:
        """Whether this pass lists every record: the first, a replica that just became the
        leader, and with a shared store every `resync_seconds`."""
        became_leader, self._led = expire and not self._led, expire
        if self._listed_at is None or became_leader:
            return True
        return not self._manager.records.sees_every_write and time.monotonic() - self._listed_at >= self._resync

    async def run(self) -> None:
        """Check every interval until cancelled."""
        while True:
            try:
                await self.expire_once(expire=self._leading())
            except WarmshellError as exc:
                log.warning("expiry pass failed; retrying: %s", exc)
            await asyncio.sleep(self._interval)

    async def _list_all(self) -> dict[SandboxId, SandboxRecord]:
        """Every record that can expire, from one listing; what is watched is brought up to
        date with it (a sandbox deleted through another replica is forgotten here, one made
        while the listing ran is kept)."""
        self._listed_at = time.monotonic()
        known = frozenset(self._watched)
        rows = await self._manager.records.list()
        listed = {r.id: r for r in rows if self._can_expire(r)}
        present = {r.id for r in rows}
        self._watched = (self._watched - known) | (known & present) | listed.keys()
        return listed

    def _candidates(self, expire: bool) -> set[SandboxId]:
        """The sandboxes this pass reads."""
        candidates = set(self._watched)
        if not self._manager.records.sees_every_write:
            # Execs served here on sandboxes another replica made: their activity must be stored
            # before the leader judges them idle, not only once a listing finds them.
            candidates |= self._manager.activity.keys()
        if not expire:
            # Not the leader: the pass only stores the exec activity served here, so a sandbox
            # without any is not read. With a shared store every read is a query and a decode:
            # three replicas each reading every live sandbox every second were a third of their
            # event loops' busy samples at 3 warm creates/s (~120 ms of CPU per create in all).
            candidates &= self._manager.activity.keys()
        return candidates

    async def expire_once(self, *, expire: bool = True) -> None:
        """One pass over the sandboxes that can expire (`expire=False`: only store exec activity)."""
        listed = await self._list_all() if self._list_all_now(expire) else {}
        for sandbox_id in self._candidates(expire):
            if sandbox_id not in listed and self._nothing_to_do(sandbox_id, expire):
                continue
            record = listed.get(sandbox_id) or await self._reread(sandbox_id, expire)
            if record is None or not self._can_expire(record):
                self._watched.discard(sandbox_id)
                self._read.pop(sandbox_id, None)
                continue
            self._watched.add(sandbox_id)
            if record.status.phase == Phase.DELETING:
                continue
            last = self._last_activity(record)
            reason = self._due(record, last) if expire else None
            if reason is not None:
                await self._expire(record, reason)
            elif record.lifetime.idle_timeout_seconds and last > record.lifetime.last_activity_ms:
                await self._store_activity(record, last)

    def _due(self, record: SandboxRecord, last_activity_ms: int) -> str | None:
        exited = record.status.timeline.exited_us // 1000 if record.status.phase == Phase.EXITED else 0
        return lifetimes.due(
            record.lifetime,
            last_activity_ms=last_activity_ms,
            now_ms=now_ms(),
            exited_at_ms=exited,
            exited_retention_seconds=self._retention,
        )

    def _last_activity(self, record: SandboxRecord) -> int:
        session = self._manager.sessions.get(record.id)
        if session is not None and session.execs:
            return now_ms()  # a command is running: not idle
        return self._manager.activity.get(record.id, 0)

    async def _store_activity(self, record: SandboxRecord, last: int) -> None:
        def change(r: SandboxRecord) -> bool:
            if last <= r.lifetime.last_activity_ms:
                return False
            r.lifetime.last_activity_ms = last
            return True

        with contextlib.suppress(NotFoundError):
            await self._manager.records.mutate(record.id, change)

    async def _expire(self, record: SandboxRecord, reason: str) -> None:
        lifetime = record.lifetime
        message = _MESSAGES[reason].format(
            ttl=lifetime.ttl_seconds, idle=lifetime.idle_timeout_seconds, retention=self._retention
        )
        log.info("sandbox %s/%s expired: %s", record.workspace, record.name, message)
        self._manager.bus.publish(record.id, Progress(now_ms(), reason, f"deleting: {message}", warning=True))

        def mark(r: SandboxRecord) -> None:
            phases.mark_expired(r.status, reason, message)

        try:
            await self._manager.records.mutate(record.id, mark)
            await self._manager.delete(record.workspace, record.name)
        except NotFoundError:
            return  # deleted meanwhile (by a user, or by another replica)
        metrics.SANDBOXES_EXPIRED.labels(reason=reason).inc()
