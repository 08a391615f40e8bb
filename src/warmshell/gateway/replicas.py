"""Which gateway replicas share this store, and where each is reached: one row per replica in the
objects table (kind "replica"), renewed every heartbeat.

A replica that has not renewed for `MISSED_HEARTBEATS` heartbeats is presumed dead. The forwarder
reads the directory to find a session owner's address (and refuses to dial a dead one); the
leader marks the sessions a dead replica held as disconnected, so phase and forwarding stop
naming it while its supervisors reconnect to the survivors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from warmshell.core import phases
from warmshell.core.errors import AlreadyExistsError, ConflictError, NotFoundError, WarmshellError
from warmshell.core.models import SandboxRecord, now_ms
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.store.base import Store

__all__ = ["KIND_REPLICA", "MISSED_HEARTBEATS", "Replica", "ReplicaDirectory", "stale_sessions"]

log = logging.getLogger(__name__)

KIND_REPLICA = "replica"
MISSED_HEARTBEATS = 3
_WORKSPACE = ""  # replicas belong to no workspace


@dataclass(frozen=True)
class Replica:
    """One replica as the store last heard of it."""

    id: str
    address: str
    seen_ms: int


def stale_sessions(records: list[SandboxRecord], alive: set[str], *, me: str) -> list[SandboxRecord]:
    """Records whose session is held by a replica that is neither this one nor alive."""
    return [
        r
        for r in records
        if r.status.supervisor_connected and r.status.session_owner not in alive and r.status.session_owner != me
    ]


class ReplicaDirectory:
    """This replica's row, and a cached view of everyone's."""

    def __init__(
        self,
        store: Store,
        *,
        replica_id: str,
        address: str,
        heartbeat_seconds: float,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.replica_id = replica_id
        self.address = address
        self._store = store
        self._heartbeat = heartbeat_seconds
        self._clock = clock
        self._known: dict[str, Replica] = {}

    def _payload(self) -> str:
        return json.dumps({"address": self.address, "seen_ms": self._clock()})

    async def announce(self) -> None:
        """Write (or renew) this replica's row."""
        row = await self._store.get(KIND_REPLICA, self.replica_id)
        if row is None:
            with contextlib.suppress(AlreadyExistsError):
                await self._store.create(
                    kind=KIND_REPLICA,
                    id=self.replica_id,
                    name=self.replica_id,
                    workspace=_WORKSPACE,
                    payload=self._payload(),
                )
                return
            row = await self._store.get(KIND_REPLICA, self.replica_id)
            if row is None:
                return
        with contextlib.suppress(ConflictError):  # only this replica writes its row
            await self._store.update(
                kind=KIND_REPLICA, id=self.replica_id, expected_version=row.resource_version, payload=self._payload()
            )

    async def withdraw(self) -> None:
        """Remove this replica's row (a graceful stop: its sessions are closed already)."""
        await self._store.delete(KIND_REPLICA, self.replica_id)

    async def refresh(self) -> dict[str, Replica]:
        """Re-read every replica's row; returns them by id."""
        known: dict[str, Replica] = {}
        for row in await self._store.list(KIND_REPLICA):
            data = json.loads(row.payload)
            known[row.id] = Replica(row.id, str(data.get("address") or ""), int(data.get("seen_ms") or 0))
        self._known = known
        return known

    def alive_ids(self) -> set[str]:
        """Replicas heard from within MISSED_HEARTBEATS heartbeats (this one always)."""
        horizon = self._clock() - int(MISSED_HEARTBEATS * self._heartbeat * 1000)
        return {r.id for r in self._known.values() if r.seen_ms >= horizon} | {self.replica_id}

    async def address_of(self, replica_id: str) -> str | None:
        """Where to reach a live replica; None when it is unknown or presumed dead."""
        if replica_id not in self._known or replica_id not in self.alive_ids():
            await self.refresh()
        if replica_id not in self.alive_ids():
            return None
        replica = self._known.get(replica_id)
        return replica.address if replica is not None and replica.address else None

    async def release_stale_sessions(self, records: SandboxRecords) -> int:
        """Mark the sessions of dead replicas disconnected (leader work); returns how many."""
        await self.refresh()
        alive = self.alive_ids()
        released = 0
        for record in stale_sessions(await records.list(), alive, me=self.replica_id):
            owner = record.status.session_owner

            def change(r: SandboxRecord, owner: str = owner) -> bool:
                if not r.status.supervisor_connected or r.status.session_owner != owner:
                    return False  # reconnected meanwhile
                r.status.session_id, r.status.session_owner = "", ""
                phases.mark_session(r.status, False)
                return True

            with contextlib.suppress(NotFoundError):
                await records.mutate(record.id, change)
                released += 1
                log.info("sandbox %s: session held by replica %s, presumed dead, released", record.id, owner)
        return released

    async def run(self, *, leading: Callable[[], bool], records: SandboxRecords) -> None:
        """Renew this replica's row every heartbeat; while leading, release dead replicas' sessions."""
        while True:
            try:
                await self.announce()
                if leading():
                    await self.release_stale_sessions(records)
            except WarmshellError as exc:
                log.warning("replica heartbeat failed; retrying: %s", exc)
            await asyncio.sleep(self._heartbeat)
