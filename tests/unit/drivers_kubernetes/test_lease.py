"""The Lease elector: the pure decision with explicit times, and the loop on a fake clock and an
in-memory Lease with real compare-and-swap semantics."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from warmshell.drivers.kubernetes import kube
from warmshell.drivers.kubernetes.profiles import lease

from .clocks import FakeClock, settle

Obj = dict[str, Any]
NS = "warmshell"
NAME = "warmshell-profiles"


def record(holder: str = "a", *, rv: str = "1", duration: int = 10) -> lease.LeaseRecord:
    return lease.LeaseRecord(
        holder=holder, duration_seconds=duration, transitions=0, acquire_time="", resource_version=rv
    )


# -- the pure decision ------------------------------------------------------------------------------


def test_no_lease_means_create() -> None:
    assert lease.decide("me", None, 0.0) is lease.Action.CREATE


def test_our_own_lease_is_renewed() -> None:
    assert lease.decide("me", lease.Observation(record("me"), 0.0), 100.0) is lease.Action.RENEW


def test_a_live_holder_is_waited_for_until_the_duration_passes_on_our_clock() -> None:
    seen = lease.Observation(record("other", duration=10), 50.0)
    assert lease.decide("me", seen, 59.9) is lease.Action.WAIT
    assert lease.decide("me", seen, 60.0) is lease.Action.TAKE_OVER


def test_a_released_lease_is_taken_at_once() -> None:
    assert lease.decide("me", lease.Observation(record(""), 50.0), 50.0) is lease.Action.TAKE_OVER


def test_expiry_restarts_only_when_the_lease_changes() -> None:
    first = lease.observe(None, record("other", rv="1"), 10.0)
    same = lease.observe(first, record("other", rv="1"), 15.0)
    renewed = lease.observe(same, record("other", rv="2"), 18.0)
    assert same.observed_at == 10.0
    assert renewed.observed_at == 18.0


def test_record_of_reads_a_lease_object() -> None:
    obj = {
        "metadata": {"resourceVersion": "7"},
        "spec": {"holderIdentity": "x", "leaseDurationSeconds": 15, "leaseTransitions": 2, "acquireTime": "t"},
    }
    assert lease.record_of(obj) == lease.LeaseRecord("x", 15, 2, "t", "7")


def test_micro_time_is_rfc3339_with_microseconds() -> None:
    assert lease.micro_time(0.5) == "1970-01-01T00:00:00.500000Z"


# -- the loop -----------------------------------------------------------------------------------------


class LeaseStore:
    """One Lease with compare-and-swap on resourceVersion, as the API server keeps it."""

    def __init__(self) -> None:
        self.lease: Obj | None = None
        self.version = 0
        self.down = False
        self.writes: list[str] = []

    def _check(self) -> None:
        if self.down:
            raise kube.Temporary(503, "ServiceUnavailable", "down")

    def _stored(self, body: Obj) -> Obj:
        self.version += 1
        body = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        self.lease = body
        self.writes.append(str(body["spec"].get("holderIdentity") or ""))
        return body

    async def get(self, resource: kube.Resource, namespace: str, name: str) -> Obj:
        self._check()
        if self.lease is None:
            raise kube.NotFound(404, "NotFound", "no lease")
        return self.lease

    async def create(self, resource: kube.Resource, namespace: str, body: Obj) -> Obj:
        self._check()
        if self.lease is not None:
            raise kube.AlreadyExists(409, "AlreadyExists", "exists")
        return self._stored(body)

    async def replace(self, resource: kube.Resource, namespace: str, name: str, body: Obj) -> Obj:
        self._check()
        assert self.lease is not None
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise kube.Conflict(409, "Conflict", "the object has been modified")
        return self._stored(body)

    @property
    def holder(self) -> str:
        return str(((self.lease or {}).get("spec") or {}).get("holderIdentity") or "")


class Candidate:
    """An elector whose leader task counts the times it ran and whether it is running."""

    def __init__(self, store: LeaseStore, clock: FakeClock, identity: str) -> None:
        self.elector = lease.Elector(
            store,
            name=NAME,
            namespace=NS,
            identity=identity,
            lease_duration=10,
            renew_deadline=6,
            retry_period=2,
            clock=clock,
        )
        self.leading = False
        self.terms = 0
        self.task: asyncio.Task[None] | None = None

    async def _lead(self) -> None:
        self.leading = True
        self.terms += 1
        try:
            await asyncio.Event().wait()
        finally:
            self.leading = False

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run(self._lead))

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@pytest.fixture
async def scene() -> AsyncIterator[tuple[LeaseStore, FakeClock, Candidate, Candidate]]:
    store, clock = LeaseStore(), FakeClock()
    a, b = Candidate(store, clock, "a"), Candidate(store, clock, "b")
    yield store, clock, a, b
    for candidate in (a, b):
        if candidate.task is not None and not candidate.task.done():
            await candidate.stop()


async def test_one_candidate_acquires_and_the_other_waits(
    scene: tuple[LeaseStore, FakeClock, Candidate, Candidate],
) -> None:
    store, clock, a, b = scene
    a.start()
    await settle()
    b.start()
    await clock.advance(30)
    assert (a.leading, b.leading) == (True, False)
    assert store.holder == "a"
    assert set(store.writes) == {"a"}  # renewals only; b never wrote


async def test_release_on_shutdown_lets_the_other_take_over_within_a_retry_period(
    scene: tuple[LeaseStore, FakeClock, Candidate, Candidate],
) -> None:
    store, clock, a, b = scene
    a.start()
    await settle()
    b.start()
    await clock.advance(5)
    await a.stop()
    assert store.holder == ""
    await clock.advance(2)
    assert b.leading
    assert store.holder == "b"


async def test_a_crashed_holder_is_replaced_after_the_lease_duration(
    scene: tuple[LeaseStore, FakeClock, Candidate, Candidate],
) -> None:
    store, clock, a, b = scene
    a.start()
    await settle()
    b.start()
    await clock.advance(5)
    # A crash: the task dies without releasing (is_leader cleared so release() does nothing).
    a.elector.is_leader = False
    await a.stop()
    assert store.holder == "a"
    crashed_at = clock.now
    # Its last renewal was at t=4: the Lease is not b's before t=14.
    await clock.advance(7.5)
    assert not b.leading, "taken over before the lease duration passed"
    await clock.advance(4)
    assert b.leading
    assert store.holder == "b"
    assert clock.now - crashed_at <= 10 + 2 + 1  # duration + one retry period (+ step)


async def test_a_holder_that_cannot_renew_stops_leading_before_the_lease_expires(
    scene: tuple[LeaseStore, FakeClock, Candidate, Candidate],
) -> None:
    store, clock, a, _ = scene
    a.start()
    await clock.advance(3)
    assert a.leading
    store.down = True  # at t=3; the last renewal was at t=2, the deadline is 6 s
    await clock.advance(4)
    assert a.leading, "a short outage within the renew deadline keeps the leader"
    await clock.advance(2)
    assert not a.leading
    store.down = False
    await clock.advance(3)
    assert a.leading, "it campaigns again and wins its own Lease back"
    assert a.terms == 2


async def test_a_holder_overtaken_by_another_stops_leading(
    scene: tuple[LeaseStore, FakeClock, Candidate, Candidate],
) -> None:
    store, clock, a, _ = scene
    a.start()
    await clock.advance(3)
    assert store.lease is not None
    stolen = {**store.lease, "spec": {**store.lease["spec"], "holderIdentity": "intruder"}}
    await store.replace(kube.LEASES, NS, NAME, stolen)
    await clock.advance(3)
    assert not a.leading


async def test_only_one_of_two_simultaneous_candidates_wins() -> None:
    store, clock = LeaseStore(), FakeClock()
    a, b = Candidate(store, clock, "a"), Candidate(store, clock, "b")
    a.start()
    b.start()
    try:
        await clock.advance(20)
        assert [a.leading, b.leading].count(True) == 1
    finally:
        await a.stop()
        await b.stop()
