"""When a registration bound to an existing sandbox may be activated again: never while its
session is live; for the same instance, only for a later incarnation than the one that last
connected (a restarted container), or when no session was opened since the last activation."""

from __future__ import annotations

from pathlib import Path

from warmshell.core.ids import InstanceId, SandboxId
from warmshell.core.models import SandboxRecord, SandboxStatus
from warmshell.drivers.base import Bound, SupervisorIdentity
from warmshell.drivers.fake import FakeDriver
from warmshell.gateway.activation import reactivation_refused
from warmshell.gateway.events import EventBus
from warmshell.gateway.manager import SandboxManager
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.secretvault import SecretVault
from warmshell.gateway.sessions import SessionTable
from warmshell.gateway.store.sqlite import open_sqlite_store


def identity(instance: str = "pod-1", incarnation: int = 0) -> SupervisorIdentity:
    return SupervisorIdentity(
        "kubernetes", InstanceId(instance), "p", "default", Bound(SandboxId("s"), "x"), incarnation
    )


def status(instance: str = "pod-1", activated: int = -1, connected: int = -1) -> SandboxStatus:
    return SandboxStatus(instance_id=instance, activated_incarnation=activated, connected_incarnation=connected)


def test_a_first_registration_is_activated() -> None:
    assert reactivation_refused(identity(), status(instance=""), session_live=False) == ""
    assert reactivation_refused(identity(), None, session_live=False) == ""


def test_never_while_the_session_is_live() -> None:
    assert "live supervisor session" in reactivation_refused(identity(incarnation=9), status(), session_live=True)


def test_a_replay_by_the_same_incarnation_is_refused() -> None:
    why = reactivation_refused(identity(incarnation=0), status(activated=0, connected=0), session_live=False)
    assert why == "was already activated for incarnation 0 of this supervisor"


def test_a_restarted_container_is_activated_again() -> None:
    assert reactivation_refused(identity(incarnation=1), status(activated=0, connected=0), session_live=False) == ""


def test_an_activation_lost_before_any_session_may_be_retried() -> None:
    assert reactivation_refused(identity(incarnation=0), status(activated=0, connected=-1), session_live=False) == ""


def test_another_instance_of_the_sandbox_is_not_compared() -> None:
    # A pod recreated for the same Sandbox has another uid, and restart counts of its own.
    assert reactivation_refused(identity("pod-2"), status("pod-1", activated=3, connected=3), session_live=False) == ""


async def test_a_session_records_its_token_incarnation_when_the_activation_write_was_lost(tmp_path: Path) -> None:
    # A gateway that crashed between an activation and the session it opened never wrote the
    # activated incarnation: the session's write takes it from the token, so a replay of that
    # incarnation's credential is refused all the same.
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    try:
        records = SandboxRecords(store, EventBus(), exclusive=True)
        manager = SandboxManager(
            records=records,
            driver=FakeDriver(),
            bus=EventBus(),
            sessions=SessionTable(),
            vault=SecretVault(store, bytes(32)),
        )
        sid = SandboxId("s")
        await records.insert(SandboxRecord(id=sid, name="one", status=status(activated=-1)))
        await manager.on_session(sid, connected=True, session_id="sess-1", incarnation=2)
        stored = await records.get(sid)
        assert stored is not None
        assert stored.status.connected_incarnation == 2
        why = reactivation_refused(identity(incarnation=2), stored.status, session_live=False)
        assert why == "was already activated for incarnation 2 of this supervisor"
        assert reactivation_refused(identity(incarnation=3), stored.status, session_live=False) == ""
    finally:
        await store.aclose()
