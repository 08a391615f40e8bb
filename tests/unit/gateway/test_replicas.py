"""Replicas on one store: who is alive (judged on the observer's clock), releasing a dead replica's
sessions, the session owner in the record, and where the forwarder sends a call."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from warmshell.core import phases
from warmshell.core.errors import UnavailableError
from warmshell.core.ids import SandboxId
from warmshell.core.models import SandboxRecord
from warmshell.drivers.fake import FakeDriver
from warmshell.gateway.auth import Authenticator
from warmshell.gateway.events import EventBus
from warmshell.gateway.forwarding import Forwarder, Target, relayed_status
from warmshell.gateway.manager import SandboxManager
from warmshell.gateway.reconciler import Reconciler
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.replicas import (
    KIND_REPLICA,
    MISSED_HEARTBEATS,
    SESSION_SCAN_SECONDS,
    Replica,
    ReplicaDirectory,
    join_problems,
    session_scan_due,
    stale_sessions,
)
from warmshell.gateway.secretvault import SecretVault
from warmshell.gateway.sessions import SessionTable
from warmshell.gateway.store.base import Store
from warmshell.gateway.store.sqlite import open_sqlite_store

HEARTBEAT = 1.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await open_sqlite_store(tmp_path / "warmshell.db")
    try:
        yield opened
    finally:
        await opened.aclose()


def directory(store: Store, name: str, clock: Clock) -> ReplicaDirectory:
    return ReplicaDirectory(store, replica_id=name, address=f"{name}:7443", heartbeat_seconds=HEARTBEAT, clock=clock)


async def test_a_replica_is_dead_once_its_row_stood_still_for_three_heartbeats(store: Store) -> None:
    clock = Clock()
    a, b = directory(store, "a", clock), directory(store, "b", clock)
    await a.announce()
    await b.refresh()
    assert b.alive_ids() == {"a", "b"}
    seen = await b.live_replica("a")
    assert seen is not None
    assert seen.address == "a:7443"
    clock.now += 2.5
    await a.announce()  # renewed: the row changed
    await b.refresh()
    clock.now += 2.9
    await b.refresh()
    assert "a" in b.alive_ids()
    clock.now += 0.2  # 3.1 s without a change
    await b.refresh()
    assert b.alive_ids() == {"b"}
    assert await b.live_replica("a") is None
    await a.announce()
    await b.refresh()
    assert "a" in b.alive_ids()


async def test_after_the_store_was_unreachable_nobody_is_presumed_dead(store: Store) -> None:
    """Nobody could renew during an outage: liveness is judged afresh once the store is back."""
    clock = Clock()
    a, b = directory(store, "a", clock), directory(store, "b", clock)
    await a.announce()
    await b.refresh()

    async def down(*_: Any, **__: Any) -> Any:
        raise UnavailableError("the store is unreachable")

    real = store.list
    store.list = down  # type: ignore[method-assign]
    with pytest.raises(UnavailableError):
        await b.refresh()
    clock.now += 60
    store.list = real  # type: ignore[method-assign]
    await b.refresh()
    assert "a" in b.alive_ids()


async def test_an_outage_met_first_by_the_renewal_presumes_nobody_dead(store: Store) -> None:
    """The heartbeat's own write fails first when the store goes away (so its re-read never runs):
    once the store is back, the leader must not release the sessions of replicas that could not
    renew meanwhile (it did, and a live replica's sandboxes stayed disconnected)."""
    clock = Clock()
    a, leader = directory(store, "a", clock), directory(store, "b", clock)
    records = SandboxRecords(store, EventBus())
    await records.insert(connected(SandboxRecord(id="sb-1", name="sb-1", workspace="default"), "a"))
    await a.announce()
    await leader.beat(leading=True, records=records)

    async def down(*_: Any, **__: Any) -> Any:
        raise UnavailableError("the store is unreachable")

    real = store.get
    store.get = down  # type: ignore[method-assign]
    with pytest.raises(UnavailableError):
        await leader.beat(leading=True, records=records)
    clock.now += 10 * HEARTBEAT
    store.get = real  # type: ignore[method-assign]
    await leader.beat(leading=True, records=records)
    assert "a" in leader.alive_ids()
    stored = await records.get(SandboxId("sb-1"))
    assert stored is not None
    assert stored.status.supervisor_connected
    assert stored.status.session_owner == "a"
    clock.now += (MISSED_HEARTBEATS + 0.5) * HEARTBEAT  # a really silent now: released
    await leader.beat(leading=True, records=records)
    released = await records.get(SandboxId("sb-1"))
    assert released is not None
    assert not released.status.supervisor_connected


def connected(record: SandboxRecord, owner: str) -> SandboxRecord:
    record.status.session_owner, record.status.session_id = owner, f"{owner}/s1"
    phases.mark_session(record.status, True, f"{owner}/s1")
    return record


async def test_the_leader_releases_only_dead_replicas_sessions_and_their_rows(store: Store) -> None:
    clock = Clock()
    records = SandboxRecords(store, EventBus())
    a, b, leader = (directory(store, n, clock) for n in ("a", "b", "leader"))
    for replica in (a, b):
        await replica.announce()
    for name, owner in (("on-a", "a"), ("on-b", "b"), ("on-leader", "leader")):
        await records.insert(connected(SandboxRecord(id=name, name=name, workspace="default"), owner))
    await leader.refresh()
    clock.now += 5
    await b.announce()  # b lives, a went silent
    assert await leader.release_stale_sessions(records) == 1
    released = await records.get(SandboxId("on-a"))
    assert released is not None
    assert not released.status.supervisor_connected
    assert released.status.session_owner == ""
    for kept in ("on-b", "on-leader"):
        record = await records.get(SandboxId(kept))
        assert record is not None
        assert record.status.supervisor_connected
    assert {row.id for row in await store.list(KIND_REPLICA)} == {"b"}


async def test_the_leader_reads_every_record_only_when_who_is_alive_changed(store: Store) -> None:
    clock = Clock()
    records = SandboxRecords(store, EventBus())
    passes: list[int] = []
    real_list = records.list

    async def counted() -> list[SandboxRecord]:
        passes.append(1)
        return await real_list()

    records.list = counted  # type: ignore[method-assign]
    a, leader = directory(store, "a", clock), directory(store, "leader", clock)
    await records.insert(connected(SandboxRecord(id="on-a", name="on-a", workspace="default"), "a"))
    await a.announce()
    await leader.beat(leading=True, records=records)
    assert len(passes) == 1  # the first beat as leader: a full pass
    for _ in range(MISSED_HEARTBEATS - 1):  # a keeps renewing: nobody died, nothing read
        clock.now += HEARTBEAT
        await a.announce()
        await leader.beat(leading=True, records=records)
    assert len(passes) == 1
    clock.now += (MISSED_HEARTBEATS + 0.5) * HEARTBEAT  # a went silent: a pass, and its session released
    await leader.beat(leading=True, records=records)
    assert len(passes) == 2
    released = await records.get(SandboxId("on-a"))
    assert released is not None
    assert not released.status.supervisor_connected
    await leader.beat(leading=True, records=records)
    assert len(passes) == 2
    clock.now += SESSION_SCAN_SECONDS  # the safety net
    await leader.beat(leading=True, records=records)
    assert len(passes) == 3
    await leader.beat(leading=False, records=records)  # a follower reads no records ...
    assert len(passes) == 3
    await leader.beat(leading=True, records=records)  # ... and leading again starts with a pass
    assert len(passes) == 4


def test_a_session_pass_is_due_first_on_a_change_of_the_living_or_after_the_period() -> None:
    alive = frozenset({"a", "b"})
    assert session_scan_due(alive, None, 0.0)
    assert not session_scan_due(alive, (alive, 0.0), SESSION_SCAN_SECONDS - 0.1)
    assert session_scan_due(frozenset({"a"}), (alive, 0.0), 1.0)
    assert session_scan_due(frozenset({"a", "b", "c"}), (alive, 0.0), 1.0)
    assert session_scan_due(alive, (alive, 0.0), SESSION_SCAN_SECONDS)


def test_stale_sessions_is_every_connected_record_no_live_replica_holds() -> None:
    records = [
        connected(SandboxRecord(id="1", name="1", workspace="w"), "gone"),
        connected(SandboxRecord(id="2", name="2", workspace="w"), "live"),
        connected(SandboxRecord(id="3", name="3", workspace="w"), "me"),
        SandboxRecord(id="4", name="4", workspace="w"),  # no session at all
    ]
    assert [r.id for r in stale_sessions(records, {"live"}, me="me")] == ["1"]


async def test_a_session_closing_on_one_replica_does_not_undo_a_newer_one_elsewhere(store: Store) -> None:
    """The supervisor reconnected to replica b before replica a noticed its stream had ended."""
    records = SandboxRecords(store, EventBus())
    on = {
        name: SandboxManager(
            records=records,
            driver=FakeDriver(),
            bus=EventBus(),
            sessions=SessionTable(owner=name),
            vault=SecretVault(store, bytes(32)),
        )
        for name in ("a", "b")
    }
    await records.insert(SandboxRecord(id="sb", name="sb", workspace="default"))
    sandbox = SandboxId("sb")
    await on["a"].on_session(sandbox, connected=True, session_id="a/s1")
    await on["b"].on_session(sandbox, connected=True, session_id="b/s1")
    await on["a"].on_session(sandbox, connected=False, session_id="a/s1")
    record = await records.get(sandbox)
    assert record is not None
    assert (record.status.supervisor_connected, record.status.session_owner, record.status.session_id) == (
        True,
        "b",
        "b/s1",
    )
    await on["b"].on_session(sandbox, connected=False, session_id="b/s1")
    record = await records.get(sandbox)
    assert record is not None
    assert (record.status.supervisor_connected, record.status.session_owner) == (False, "")


class Unreachable(SandboxRecords):
    """Records whose writes fail while `down` (the store restarting)."""

    down = False

    async def mutate(self, sandbox_id: SandboxId, change: Any) -> SandboxRecord:
        if self.down:
            raise UnavailableError("the store is unreachable")
        return await super().mutate(sandbox_id, change)


async def a_close_the_store_missed(store: Store) -> tuple[Unreachable, SessionTable, SandboxManager, SandboxId]:
    """Replica a's session on `sb` opened and recorded, then closed while the store was down
    (which stays down: the caller brings it back)."""
    records = Unreachable(store, EventBus())
    sessions = SessionTable(owner="a")
    manager = SandboxManager(
        records=records, driver=FakeDriver(), bus=EventBus(), sessions=sessions, vault=SecretVault(store, bytes(32))
    )
    await records.insert(SandboxRecord(id="sb", name="sb", workspace="default"))
    sandbox = SandboxId("sb")
    await manager.on_session(sandbox, connected=True, session_id="a/s1")
    records.down = True
    with pytest.raises(UnavailableError):
        await manager.on_session(sandbox, connected=False, session_id="a/s1")
    return records, sessions, manager, sandbox


async def test_a_session_close_the_store_missed_is_written_by_the_next_reconcile_pass(store: Store) -> None:
    """Until it is, the record says replica a holds a live session, and b refuses the
    supervisor's reconnect (a Postgres restart left sandboxes unreachable for minutes)."""
    records, sessions, manager, sandbox = await a_close_the_store_missed(store)
    reconciler = Reconciler(manager, interval_seconds=1.0, orphan_grace_seconds=0)
    with pytest.raises(UnavailableError):  # still down: kept for the next pass
        await reconciler.record_closes()
    assert sessions.unrecorded_closes() == [(sandbox, "a/s1")]
    records.down = False
    await reconciler.record_closes()
    record = await records.get(sandbox)
    assert record is not None
    assert (record.status.supervisor_connected, record.status.session_owner) == (False, "")
    assert sessions.unrecorded_closes() == []


async def test_a_missed_close_written_late_leaves_a_newer_session_alone(store: Store) -> None:
    records, sessions, manager, sandbox = await a_close_the_store_missed(store)
    records.down = False
    await manager.on_session(sandbox, connected=True, session_id="a/s2")  # it reconnected here first
    await Reconciler(manager, interval_seconds=1.0, orphan_grace_seconds=0).record_closes()
    record = await records.get(sandbox)
    assert record is not None
    assert (record.status.supervisor_connected, record.status.session_id) == (True, "a/s2")
    assert sessions.unrecorded_closes() == []


class Context:
    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)

    def invocation_metadata(self) -> Any:
        return self._metadata


async def test_the_forwarder_sends_a_call_to_the_live_owner_only(store: Store) -> None:
    clock = Clock()
    me, other = directory(store, "me", clock), directory(store, "other", clock)
    await other.announce()
    auth = Authenticator(api_token="api", issuer=None, identity=None, replica_token="replica")  # type: ignore[arg-type]
    forwarder = Forwarder(me, auth, token="replica")
    client = Context("api")
    record = SandboxRecord(id="sb", name="sb", workspace="default")
    assert await forwarder.target(record, client) is None  # type: ignore[arg-type]  # no session
    assert await forwarder.target(connected(record, "me"), client) is None  # type: ignore[arg-type]
    target = await forwarder.target(connected(record, "other"), client)  # type: ignore[arg-type]
    assert target is not None
    assert (target.replica_id, target.address) == ("other", "other:7443")
    # Forwarded to us already: answered here, never passed on (two replicas cannot loop).
    assert await forwarder.target(record, Context("replica")) is None  # type: ignore[arg-type]
    clock.now += 10  # the owner went silent
    with pytest.raises(
        UnavailableError, match=r"replica other, which has stopped renewing its place in the store \(presumed dead\)"
    ):
        await forwarder.target(record, client)  # type: ignore[arg-type]
    await forwarder.aclose()


async def test_an_owner_alive_without_an_address_is_named_as_such(store: Store) -> None:
    clock = Clock()
    me = directory(store, "me", clock)
    silent = ReplicaDirectory(store, replica_id="nowhere", address="", heartbeat_seconds=HEARTBEAT, clock=clock)
    await silent.announce()
    auth = Authenticator(api_token="api", issuer=None, identity=None, replica_token="replica")  # type: ignore[arg-type]
    forwarder = Forwarder(me, auth, token="replica")
    record = connected(SandboxRecord(id="sb", name="sb", workspace="default"), "nowhere")
    with pytest.raises(UnavailableError, match="replica nowhere, which is alive but gave no address"):
        await forwarder.target(record, Context("api"))  # type: ignore[arg-type]
    await forwarder.aclose()


def test_a_failed_forward_says_when_the_owner_was_not_reached_or_refused_the_token() -> None:
    target = Target("gw-1", "10.0.0.7:7443")
    refused = "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.7:7443: Connection refused"
    code, details = relayed_status(grpc.StatusCode.UNAVAILABLE, refused, target)
    assert code is grpc.StatusCode.UNAVAILABLE
    assert details.startswith(
        "gateway replica gw-1, which holds this sandbox's session, is not reachable at 10.0.0.7:7443"
    )
    code, details = relayed_status(grpc.StatusCode.UNAUTHENTICATED, "bad token", target)
    assert (code, "same [replicas] token_file" in details) == (grpc.StatusCode.UNAUTHENTICATED, True)
    # The owner's own answers pass unchanged, an Unavailable of its own included.
    for answer in ((grpc.StatusCode.UNAVAILABLE, "gateway stopping"), (grpc.StatusCode.NOT_FOUND, "no file /x")):
        assert relayed_status(*answer, target) == answer


def test_join_problems_name_the_missing_address_and_a_differing_token() -> None:
    others = [Replica("a", "a:1", 1, "t1"), Replica("b", "b:1", 1, "t2"), Replica("old", "o:1", 1, "")]
    assert join_problems(address="me:1", token_digest="t1", others=others[:1]) == []
    assert join_problems(address="me:1", token_digest="t1", others=[others[2]]) == []  # says no token: not judged
    (token,) = join_problems(address="me:1", token_digest="t1", others=others)
    assert token.startswith("its replica token is not that of b:")
    address, token = join_problems(address="", token_digest="t3", others=others)
    assert "no address the other replicas can reach" in address
    assert "not that of a, b:" in token
    assert len(join_problems(address="", token_digest="t", others=[])) == 1  # alone: told, not refused


async def test_a_joining_replica_waits_out_a_row_left_by_a_crash_only_when_it_matters(store: Store) -> None:
    quick = 0.1
    crashed = ReplicaDirectory(store, replica_id="crashed", address="c:1", heartbeat_seconds=quick, token_digest="x")
    await crashed.announce()
    joining = ReplicaDirectory(store, replica_id="new", address="", heartbeat_seconds=quick, token_digest="x")

    def problems(others: list[Replica]) -> list[str]:
        return join_problems(address=joining.address, token_digest=joining.token_digest, others=others)

    assert await joining.live_others_with(problems) == []  # stood still: presumed dead, not a reason to refuse
    joining.address = "n:1"
    assert [r.id for r in await joining.live_others_with(problems)] == ["crashed"]  # no problem: no wait


async def test_waiting_for_a_silent_replica_ends_when_it_is_presumed_dead(store: Store) -> None:
    """A supervisor reconnecting after its replica died waits that long, not a retry's backoff."""
    quick = 0.2
    owner = ReplicaDirectory(store, replica_id="owner", address="o:1", heartbeat_seconds=quick)
    waiter = ReplicaDirectory(store, replica_id="waiter", address="w:1", heartbeat_seconds=quick)
    await owner.announce()
    await waiter.refresh()
    assert await waiter.wait_presumed_dead("owner")

    async def renew() -> None:
        while True:
            await owner.announce()
            await asyncio.sleep(quick / 2)

    await owner.announce()
    renewing = asyncio.create_task(renew())
    try:
        await waiter.refresh()  # sees the row change again
        assert not await waiter.wait_presumed_dead("owner")  # alive: the session stays where it is
    finally:
        renewing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewing
