"""Which gateway replicas share this store, and where each is reached: one row per replica in the
objects table (kind "replica"), renewed every heartbeat.

A replica whose row this replica has seen unchanged for `MISSED_HEARTBEATS` heartbeats is presumed
dead. Judged on this replica's own clock from when it last saw the row change (never from times
another host wrote), and only over a stretch in which it could read the store: after an outage of
the store every replica starts with a clean slate, since nobody could renew then. The forwarder
reads the directory to find a session owner's address (and refuses to dial a dead one); the
leader marks the sessions a dead replica held as disconnected, so phase and forwarding stop
naming it while its supervisors reconnect to the survivors. That takes reading every sandbox
record, so the leader's heartbeat does it only when the set of live replicas has changed since
its last pass (or `SESSION_SCAN_SECONDS` have gone by), not on every beat.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from warmshell.core import phases
from warmshell.core.errors import AlreadyExistsError, ConflictError, NotFoundError, WarmshellError
from warmshell.core.models import SandboxRecord, now_ms
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.store.base import Store

__all__ = [
    "KIND_REPLICA",
    "MISSED_HEARTBEATS",
    "SESSION_SCAN_SECONDS",
    "Replica",
    "ReplicaDirectory",
    "join_problems",
    "session_scan_due",
    "stale_sessions",
]

log = logging.getLogger(__name__)

KIND_REPLICA = "replica"
MISSED_HEARTBEATS = 3
# The leader's pass over every record for dead replicas' sessions also runs this often with no
# change in who is alive: a safety net for sessions written in ways the change rule cannot see.
SESSION_SCAN_SECONDS = 30.0
_WORKSPACE = ""  # replicas belong to no workspace


@dataclass(frozen=True)
class Replica:
    """One replica as the store last showed it."""

    id: str
    address: str
    resource_version: int
    token_digest: str = ""  # of the replica token it uses ("" from a replica that did not say)


def join_problems(*, address: str, token_digest: str, others: list[Replica]) -> list[str]:
    """What keeps a replica from working beside `others` (the live replicas on its store): they
    forward calls for the sessions it holds to its address, and it must accept their replica
    token. Without an address it cannot serve beside others; the token matters once there are."""
    problems = []
    if not address:
        problems.append(
            "it has no address the other replicas can reach: set [replicas] address (host:port of its gRPC) or"
            " listen_tcp"
        )
    differing = sorted(r.id for r in others if r.token_digest and r.token_digest != token_digest)
    if differing:
        problems.append(
            f"its replica token is not that of {', '.join(differing)}: give every replica the same"
            " [replicas] token_file"
        )
    return problems


def stale_sessions(records: list[SandboxRecord], alive: set[str], *, me: str) -> list[SandboxRecord]:
    """Records whose session is held by a replica that is neither this one nor alive."""
    return [
        r
        for r in records
        if r.status.supervisor_connected and r.status.session_owner not in alive and r.status.session_owner != me
    ]


def session_scan_due(alive: frozenset[str], last: tuple[frozenset[str], float] | None, now: float) -> bool:
    """Whether the leader reads every record for dead replicas' sessions now: on its first beat as
    leader, when the live replicas differ from those of its last pass (one died, or came back),
    or `SESSION_SCAN_SECONDS` after that pass. A session names a replica that was alive when it
    was written, so with the same replicas alive as at the last pass no new stale one exists."""
    return last is None or last[0] != alive or now - last[1] >= SESSION_SCAN_SECONDS


class ReplicaDirectory:
    """This replica's row, and a cached view of everyone's."""

    def __init__(
        self,
        store: Store,
        *,
        replica_id: str,
        address: str,
        heartbeat_seconds: float,
        token_digest: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`token_digest` identifies the replica token this replica accepts (never the token)."""
        self.replica_id = replica_id
        self.address = address
        self.token_digest = token_digest
        self._store = store
        self._heartbeat = heartbeat_seconds
        self._clock = clock
        self._known: dict[str, Replica] = {}
        self._changed_at: dict[str, float] = {}  # when this replica saw each row change
        self._scanned: tuple[frozenset[str], float] | None = None  # the live set and time of the last pass

    def _payload(self) -> str:
        # The wall time is for people reading the table; liveness comes from the row changing.
        return json.dumps({"address": self.address, "token": self.token_digest, "renewed_ms": now_ms()})

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
        """Re-read every replica's row; returns them by id. A failed read forgets what was
        observed: liveness is judged afresh once the store answers again."""
        try:
            rows = await self._store.list(KIND_REPLICA)
        except WarmshellError:
            self._changed_at.clear()
            raise
        now = self._clock()
        known: dict[str, Replica] = {}
        for row in rows:
            data = json.loads(row.payload)
            address, digest = str(data.get("address") or ""), str(data.get("token") or "")
            known[row.id] = Replica(row.id, address, row.resource_version, digest)
            previous = self._known.get(row.id)
            if previous is None or previous.resource_version != row.resource_version or row.id not in self._changed_at:
                self._changed_at[row.id] = now
        self._known = known
        return known

    def alive_ids(self) -> set[str]:
        """Replicas whose row changed within MISSED_HEARTBEATS heartbeats (this one always)."""
        horizon = self._clock() - MISSED_HEARTBEATS * self._heartbeat
        return {i for i in self._known if self._changed_at.get(i, horizon) > horizon} | {self.replica_id}

    async def wait_presumed_dead(self, replica_id: str) -> bool:
        """Whether `replica_id` is (or, within the time it takes to be presumed so, becomes)
        dead; False when it is still renewing its row after that."""
        deadline = self._clock() + (MISSED_HEARTBEATS + 1) * self._heartbeat
        while replica_id in self.alive_ids():
            if self._clock() >= deadline:
                return False
            await asyncio.sleep(self._heartbeat / 2)
            await self.refresh()
        return True

    async def live_replica(self, replica_id: str) -> Replica | None:
        """A live replica's row (its address may be ""); None when it is unknown or presumed dead."""
        if replica_id not in self._known or replica_id not in self.alive_ids():
            await self.refresh()
        if replica_id not in self.alive_ids():
            return None
        return self._known.get(replica_id)

    async def live_others_with(self, problems: Callable[[list[Replica]], list[str]]) -> list[Replica]:
        """The other replicas that are alive, waited for only when `problems` finds any beside
        them: a row seen for the first time counts as alive, so one left by a replica that crashed
        (a restart under a new id) must first be seen standing still before it is ignored."""
        await self.refresh()
        others = [r for r in self._known.values() if r.id != self.replica_id]
        if not others or not problems(others):
            return others
        dead = await asyncio.gather(*(self.wait_presumed_dead(r.id) for r in others))
        return [r for r, gone in zip(others, dead, strict=True) if not gone]

    async def release_stale_sessions(self, records: SandboxRecords) -> int:
        """Mark the sessions of dead replicas disconnected (leader work); returns how many."""
        await self.refresh()
        return await self._release(records, self.alive_ids())

    async def _release(self, records: SandboxRecords, alive: set[str]) -> int:
        started = self._clock()
        for gone in self._known.keys() - alive:
            # Its row goes too (a replica that was only cut off writes it again when it is back).
            with contextlib.suppress(ConflictError):
                await self._store.delete(KIND_REPLICA, gone, self._known[gone].resource_version)
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
        self._scanned = (frozenset(alive), started)  # only a pass that ran to the end counts
        return released

    async def beat(self, *, leading: bool, records: SandboxRecords) -> None:
        """One heartbeat: renew this replica's row and re-read the others'; the leader also
        releases dead replicas' sessions when `session_scan_due`. A failure anywhere in it forgets
        what was observed, as a failed `refresh` does: an outage is usually met first by the
        renewal, and observations from before it must not judge replicas that could not renew
        during it."""
        try:
            await self.announce()
            await self.refresh()  # who is alive, for forwarding and session checks
            if not leading:
                self._scanned = None  # leading again later starts with a full pass
                return
            alive = self.alive_ids()
            if session_scan_due(frozenset(alive), self._scanned, self._clock()):
                await self._release(records, alive)
        except WarmshellError:
            self._changed_at.clear()
            self._scanned = None
            raise

    async def run(self, *, leading: Callable[[], bool], records: SandboxRecords) -> None:
        """A heartbeat every `heartbeat_seconds` until cancelled (failures are logged and retried)."""
        while True:
            try:
                await self.beat(leading=leading(), records=records)
            except WarmshellError as exc:
                log.warning("replica heartbeat failed; retrying: %s", exc)
            await asyncio.sleep(self._heartbeat)
