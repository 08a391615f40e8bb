"""The expiry reconciler: deletes sandboxes whose lifetime has ended (TTL passed, or idle past
their idle timeout). Expiry is read from the stored records on every pass, so it holds across
gateway restarts; the decision is `core.lifetimes.due`, the deletion the manager's own.

Exec activity is kept in memory by the manager (an exec costs no store write); each pass stores
the latest activity of sandboxes that have an idle timeout, so a restart loses at most one
interval of it. A command still running counts as activity.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from warmshell.core import lifetimes, phases
from warmshell.core.errors import NotFoundError, WarmshellError
from warmshell.core.models import Phase, SandboxRecord, now_ms
from warmshell.gateway import metrics
from warmshell.gateway.events import Progress
from warmshell.gateway.manager import SandboxManager

__all__ = ["ExpiryReconciler"]

log = logging.getLogger(__name__)

_MESSAGES = {
    "TtlExpired": "its ttl of {ttl} s ended",
    "IdleTimeout": "no exec for {idle} s (its idle timeout)",
}


class ExpiryReconciler:
    """One loop per gateway. With replicas, only the leader expires sandboxes; every replica
    stores the exec activity it saw, so the leader judges idleness on all of it."""

    def __init__(
        self, manager: SandboxManager, *, interval_seconds: float, leading: Callable[[], bool] = lambda: True
    ) -> None:
        self._manager = manager
        self._interval = interval_seconds
        self._leading = leading

    async def run(self) -> None:
        """Check every interval until cancelled."""
        while True:
            try:
                await self.expire_once(expire=self._leading())
            except WarmshellError as exc:
                log.warning("expiry pass failed; retrying: %s", exc)
            await asyncio.sleep(self._interval)

    async def expire_once(self, *, expire: bool = True) -> None:
        """One pass over every stored sandbox (`expire=False`: only store exec activity)."""
        for record in await self._manager.records.list():
            if record.status.phase == Phase.DELETING:
                continue
            last = self._last_activity(record)
            reason = lifetimes.due(record.lifetime, last_activity_ms=last, now_ms=now_ms()) if expire else None
            if reason is not None:
                await self._expire(record, reason)
            elif record.lifetime.idle_timeout_seconds and last > record.lifetime.last_activity_ms:
                await self._store_activity(record, last)

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
        message = _MESSAGES[reason].format(ttl=lifetime.ttl_seconds, idle=lifetime.idle_timeout_seconds)
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
