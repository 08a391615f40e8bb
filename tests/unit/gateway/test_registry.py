"""The registration registry: sessions, replacement, tombstones."""

from __future__ import annotations

import pytest

from warmshell.core.errors import AlreadyExistsError, ConflictError, NotFoundError, UnavailableError
from warmshell.core.ids import Fingerprint, InstanceId
from warmshell.drivers.base import SupervisorIdentity, WarmPending
from warmshell.gateway.registry import Registry, Replaced


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def identity(instance: str = "i-1") -> SupervisorIdentity:
    return SupervisorIdentity("local", InstanceId(instance), instance, "default", WarmPending(Fingerprint("fp")))


async def test_activation_reaches_the_stream_and_tombstones() -> None:
    registry: Registry[str] = Registry()
    reg = registry.register(identity())
    registry.activate_if_session(InstanceId("i-1"), reg.session_id, "activation")
    assert await reg.next_outcome() == "activation"
    with pytest.raises(AlreadyExistsError):
        registry.pending(InstanceId("i-1"))


async def test_newer_registration_replaces_and_notifies_older() -> None:
    registry: Registry[str] = Registry()
    old = registry.register(identity())
    new = registry.register(identity())
    assert isinstance(await old.next_outcome(), Replaced)
    assert registry.pending(InstanceId("i-1")) is new
    with pytest.raises(ConflictError):
        registry.activate_if_session(InstanceId("i-1"), old.session_id, "stale")


async def test_dropped_stream_removes_only_its_own_session() -> None:
    registry: Registry[str] = Registry()
    old = registry.register(identity())
    new = registry.register(identity())
    registry.remove_if_session(InstanceId("i-1"), old.session_id)
    assert registry.pending(InstanceId("i-1")) is new
    registry.remove_if_session(InstanceId("i-1"), new.session_id)
    with pytest.raises(NotFoundError):
        registry.pending(InstanceId("i-1"))


async def test_closed_stream_rolls_back_the_tombstone() -> None:
    registry: Registry[str] = Registry()
    reg = registry.register(identity())
    reg.closed = True  # the stream went away after pending() was read
    with pytest.raises(UnavailableError):
        registry.activate_if_session(InstanceId("i-1"), reg.session_id, "lost")
    assert not registry.is_tombstoned(InstanceId("i-1"))
    fresh = registry.register(identity())
    registry.activate_if_session(InstanceId("i-1"), fresh.session_id, "again")
    assert await fresh.next_outcome() == "again"


async def test_tombstone_expires_and_reregistration_supersedes_it() -> None:
    clock = Clock()
    registry: Registry[str] = Registry(tombstone_ttl_seconds=10, clock=clock)
    reg = registry.register(identity())
    registry.activate_if_session(InstanceId("i-1"), reg.session_id, "a")
    assert registry.is_tombstoned(InstanceId("i-1"))
    clock.now = 11
    assert not registry.is_tombstoned(InstanceId("i-1"))
    reg2 = registry.register(identity())
    registry.activate_if_session(InstanceId("i-1"), reg2.session_id, "b")
    registry.register(identity())  # after a restart: supersedes the fresh tombstone
    assert not registry.is_tombstoned(InstanceId("i-1"))


async def test_generation_wakes_waiters() -> None:
    registry: Registry[str] = Registry()
    generation = registry.generation
    registry.register(identity("i-2"))
    assert await registry.wait_changed(generation) > generation


async def test_close_all_ends_parked_streams_as_unavailable() -> None:
    registry: Registry[str] = Registry()
    reg = registry.register(identity())
    registry.close_all("gateway shutting down")
    outcome = await reg.next_outcome()
    assert isinstance(outcome, UnavailableError)
    assert registry.pending_count() == 0


async def test_tombstones_expire_oldest_first_and_only_when_due() -> None:
    clock = Clock()
    registry: Registry[str] = Registry(tombstone_ttl_seconds=10, clock=clock)
    for at, instance in ((0.0, "i-1"), (5.0, "i-2"), (7.0, "i-3")):
        clock.now = at
        reg = registry.register(identity(instance))
        registry.activate_if_session(InstanceId(instance), reg.session_id, "a")
    clock.now = 10.0  # i-1 is due (laid at 0, TTL 10), the others are not
    assert not registry.is_tombstoned(InstanceId("i-1"))
    assert registry.is_tombstoned(InstanceId("i-2"))
    assert registry.is_tombstoned(InstanceId("i-3"))
    clock.now = 15.5
    assert not registry.is_tombstoned(InstanceId("i-2"))
    with pytest.raises(AlreadyExistsError):
        registry.pending(InstanceId("i-3"))
    clock.now = 17.0
    with pytest.raises(NotFoundError):
        registry.pending(InstanceId("i-3"))
