"""What a gateway has only as one of several replicas on a shared (Postgres) store, in one
component: the replica directory (who is alive, where), the forwarder (calls needing another
replica's session), the change feed (other replicas' writes and progress lines, heard here) and
the session takeover rule (a supervisor session held by a live replica is not taken from it).

`Replication.wiring` is what the rest of the gateway takes from it; a lone gateway takes
`ReplicaWiring()`, whose defaults are a lone gateway's. `running` is entered once the gateway
listens, and left before its servers have finished stopping."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from warmshell.core.config import ReplicasConfig
from warmshell.core.errors import FailedPreconditionError, WarmshellError
from warmshell.core.ids import SandboxId
from warmshell.drivers.base import ProgressLine
from warmshell.gateway import listening
from warmshell.gateway.auth import Authenticator
from warmshell.gateway.events import Changed, EventBus
from warmshell.gateway.forwarding import Forwarder
from warmshell.gateway.loops import Loops
from warmshell.gateway.progressfeed import ProgressFeed
from warmshell.gateway.records import KIND_SANDBOX, SandboxRecords
from warmshell.gateway.replicas import Replica, ReplicaDirectory, join_problems
from warmshell.gateway.store.postgres import Change, PostgresStore

__all__ = ["ReplicaWiring", "Replication", "follow"]

log = logging.getLogger(__name__)


def follow(bus: EventBus, records: SandboxRecords) -> Callable[[Change], None]:
    """Another replica's write, told to this replica's records and watchers (this replica's
    own writes come back too: its watchers were told of them when they were written)."""

    def changed(change: Change) -> None:
        if not change.kind:
            bus.changed_everywhere()
        elif change.kind == KIND_SANDBOX:
            sandbox_id = SandboxId(change.id)
            if change.op == "DELETE":
                records.heard_removed(sandbox_id)
                bus.forget(sandbox_id)
            elif records.heard_changed(sandbox_id, change.version):
                bus.publish(sandbox_id, Changed())

    return changed


async def _reachable_address(listen: str, port: int) -> str:
    """Where other replicas reach this one: the listening host, or for a wildcard listener (a
    pod's 0.0.0.0) the address the hostname resolves to (the pod IP, from /etc/hosts)."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = await asyncio.to_thread(socket.gethostbyname, socket.gethostname())
    return f"{host}:{port}"


def token_digest(token: str) -> str:
    """What a replica's row says of the token it accepts: enough to tell two tokens apart, nothing
    to forge one with."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ReplicaWiring:
    """What the other parts of a gateway take from replication; the defaults are a lone
    gateway's (no session owner name, nothing forwarded, no progress shared)."""

    owner: str = ""  # the name this replica writes on the sessions it holds
    directory: ReplicaDirectory | None = None  # for the session takeover rule
    forwarder: Forwarder | None = None
    share_progress: Callable[[SandboxId, ProgressLine], None] | None = None
    # Client connections this old are told to go away (GOAWAY), so they spread over the replicas.
    max_connection_age_seconds: float = 0.0


class Replication:
    """This replica among the others: built with the gateway's parts (no I/O), then `running`."""

    def __init__(
        self,
        store: PostgresStore,
        *,
        config: ReplicasConfig,
        replica_id: str,
        token: str,
        auth: Authenticator,
        bus: EventBus,
        connect_timeout_seconds: float,
    ) -> None:
        """`token`: the credential the replicas share (forwarded calls carry it)."""
        self.replica_id = replica_id
        self.directory = ReplicaDirectory(
            store,
            replica_id=replica_id,
            address=config.address,
            heartbeat_seconds=config.heartbeat_seconds,
            token_digest=token_digest(token),
        )
        self._token_file = config.token_file
        self.forwarder = Forwarder(self.directory, auth, token=token)
        self.feed = ProgressFeed(replica_id, bus, store.notify_progress)
        self.drain_seconds = config.drain_seconds
        self.loops = Loops()
        self._store = store
        self._bus = bus
        self._connect_timeout = connect_timeout_seconds

    @property
    def wiring(self) -> ReplicaWiring:
        """What the other parts take from this replica."""
        return ReplicaWiring(
            owner=self.replica_id,
            directory=self.directory,
            forwarder=self.forwarder,
            share_progress=self.feed.share,
            max_connection_age_seconds=self.drain_seconds / 2,
        )

    async def live_others(self) -> frozenset[str]:
        """The other replicas alive now (their sessions are theirs, not stale)."""
        await self.directory.refresh()
        return frozenset(self.directory.alive_ids() - {self.replica_id})

    @contextlib.asynccontextmanager
    async def running(
        self, *, listen_tcp: str, tcp_port: int, leading: Callable[[], bool], records: SandboxRecords
    ) -> AsyncIterator[None]:
        """Announce this replica, hear the others' writes and progress, and renew the row every
        heartbeat; on the way out stop those, close the channels to other replicas (calls in
        flight through them get as long to finish as the gateway's own calls) and withdraw the
        row."""
        try:
            await self._start(listen_tcp=listen_tcp, tcp_port=tcp_port, records=records)
            self.loops.start(self.directory.run(leading=leading, records=records), name="replica-heartbeat")
            yield
        finally:
            await self.loops.aclose()
            await self.forwarder.aclose(grace=listening.SHUTDOWN_GRACE_SECONDS)
            with contextlib.suppress(WarmshellError):
                await self.directory.withdraw()

    async def _start(self, *, listen_tcp: str, tcp_port: int, records: SandboxRecords) -> None:
        if not self.directory.address and tcp_port:
            self.directory.address = await _reachable_address(listen_tcp, tcp_port)
        await self._check_joining()
        await self.directory.announce()
        # Listening before serving: another replica's progress lines said before then would
        # never reach this replica's watchers (record changes are re-read on a watch anyway).
        heard_from = asyncio.Event()
        changes = self._store.follow_changes(
            follow(self._bus, records), self.feed.heard, heard_from, on_listening=records.feed_listening
        )
        self.loops.start(changes, name="store-changes")
        self.loops.start(self.feed.run(), name="progress-feed")
        with contextlib.suppress(TimeoutError):  # the feed retries on its own; do not hang the start
            await asyncio.wait_for(heard_from.wait(), self._connect_timeout)

    async def _check_joining(self) -> None:
        """Refuse to serve beside live replicas that could not forward calls to this one (no
        address, another replica token): its sessions would fail every call that reaches another
        replica, long after a start that looked fine. A replica alone is told what a second one
        would need, and starts."""

        def problems(others: list[Replica]) -> list[str]:
            address, digest = self.directory.address, self.directory.token_digest
            return join_problems(address=address, token_digest=digest, others=others)

        others = await self.directory.live_others_with(problems)
        found = problems(others)
        if found and others:
            names = ", ".join(sorted(r.id for r in others))
            raise FailedPreconditionError(
                f"gateway replica {self.replica_id} cannot serve beside the live replicas {names} on this store: "
                + "; ".join(found)
            )
        for problem in found:
            log.warning(
                "gateway replica %s: %s; a second replica on this store could not forward to it",
                self.replica_id,
                problem,
            )
        if not self._token_file and not others:
            log.warning(
                "gateway replica %s: no [replicas] token_file, so its replica token is its own; every replica on"
                " this store must be given the same file",
                self.replica_id,
            )
