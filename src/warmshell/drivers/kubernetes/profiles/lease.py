"""Leader election over a `coordination.k8s.io/v1` Lease, so that only one gateway replica runs the
cluster-wide reconcilers (the profile reconciler) while every replica serves requests.

The rules follow client-go's elector: a candidate creates the Lease or takes over one whose holder
has not renewed for `leaseDurationSeconds`, and the holder renews every retry period; every write is
a compare-and-swap on the Lease's resourceVersion. Expiry is judged on *this* process's clock from
when it last saw the Lease change — never from the timestamps the holder wrote — so clock skew
between nodes cannot make two leaders. A holder that cannot renew within the renew deadline (shorter
than the lease duration) stops leading before anyone else may start. The decision is pure
(`observe`, `decide`); `Elector` drives it with an injectable clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NoReturn, Protocol

from warmshell.core.backoff import doubling_delay
from warmshell.core.config import KubernetesDriverConfig
from warmshell.drivers.kubernetes import kube
from warmshell.drivers.kubernetes.clock import Clock, SystemClock
from warmshell.drivers.kubernetes.objects import Obj

__all__ = [
    "Action",
    "Elector",
    "LeaseApi",
    "LeaseRecord",
    "Observation",
    "decide",
    "elector_for",
    "observe",
    "record_of",
]

log = logging.getLogger(__name__)


# The longest pause before restarting a leader task that keeps failing.
MAX_RESTART_DELAY = 60.0


class LeaseApi(Protocol):
    """The three calls the elector makes (`kube.Kube`)."""

    async def get(self, resource: kube.Resource, namespace: str, name: str) -> Obj: ...

    async def create(self, resource: kube.Resource, namespace: str, body: Obj) -> Obj: ...

    async def replace(self, resource: kube.Resource, namespace: str, name: str, body: Obj) -> Obj: ...


# -- the pure part --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says (an empty holder: released)."""

    holder: str
    duration_seconds: int
    transitions: int
    acquire_time: str
    resource_version: str


@dataclass(frozen=True)
class Observation:
    """A Lease as one candidate saw it, and when (its monotonic clock) it last saw it change."""

    record: LeaseRecord
    observed_at: float


class Action(enum.Enum):
    """What a candidate should do next."""

    CREATE = "create"  # there is no Lease
    RENEW = "renew"  # we hold it
    TAKE_OVER = "take-over"  # released, or its holder stopped renewing
    WAIT = "wait"  # someone else holds it


def record_of(lease: Obj) -> LeaseRecord:
    """The fields of a Lease object the election reads."""
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        transitions=int(spec.get("leaseTransitions") or 0),
        acquire_time=str(spec.get("acquireTime") or ""),
        resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
    )


def observe(previous: Observation | None, record: LeaseRecord, now: float) -> Observation:
    """Remember `record`; the expiry clock restarts only when the Lease changed (a renewal
    writes a new resourceVersion, so a live holder keeps pushing expiry away)."""
    if previous is not None and previous.record.resource_version == record.resource_version:
        return previous
    return Observation(record, now)


def decide(identity: str, seen: Observation | None, now: float) -> Action:
    """The next step for `identity`, given the Lease it last saw (None: there is none)."""
    if seen is None:
        return Action.CREATE
    record = seen.record
    if record.holder == identity:
        return Action.RENEW
    if not record.holder or now >= seen.observed_at + record.duration_seconds:
        return Action.TAKE_OVER
    return Action.WAIT


def micro_time(wall: float) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- the elector ----------------------------------------------------------------------------------


class Elector:
    """Campaigns for one Lease and runs `lead()` while holding it.

    `run(lead)` never returns: it acquires, starts `lead` as a task, renews, and cancels `lead` when
    the Lease is lost (then campaigns again). Cancelling `run` cancels `lead` and releases the
    Lease, so a successor need not wait for it to expire.
    """

    def __init__(
        self,
        api: LeaseApi,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration: int,
        renew_deadline: float,
        retry_period: float,
        clock: Clock | None = None,
    ) -> None:
        self._api = api
        self._name = name
        self._namespace = namespace
        self.identity = identity
        self._duration = lease_duration
        self._renew_deadline = min(renew_deadline, lease_duration)
        self._retry = retry_period
        self._clock = clock or SystemClock()
        self._seen: Observation | None = None
        self.is_leader = False

    # -- one step ---------------------------------------------------------------------------

    async def try_acquire_or_renew(self) -> bool:
        """Read the Lease and act on it once; whether we hold it afterwards."""
        try:
            lease: Obj | None = await self._api.get(kube.LEASES, self._namespace, self._name)
        except kube.NotFound:
            lease = None
        now = self._clock.monotonic()
        self._seen = observe(self._seen, record_of(lease), now) if lease is not None else None
        action = decide(self.identity, self._seen, now)
        if action is Action.WAIT:
            return False
        try:
            written = await self._write(action)
        except (kube.AlreadyExists, kube.Conflict):
            return False  # another candidate wrote first; we see its Lease next time
        self._seen = observe(self._seen, record_of(written), self._clock.monotonic())
        return True

    async def _write(self, action: Action) -> Obj:
        stamp = micro_time(self._clock.wall())
        spec: Obj = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self._duration,
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": 0,
        }
        if action is Action.CREATE:
            return await self._api.create(kube.LEASES, self._namespace, self._body(spec, ""))
        assert self._seen is not None
        record = self._seen.record
        if action is Action.RENEW:
            spec["acquireTime"] = record.acquire_time or stamp
            spec["leaseTransitions"] = record.transitions
        else:
            spec["leaseTransitions"] = record.transitions + 1
        return await self._api.replace(
            kube.LEASES, self._namespace, self._name, self._body(spec, record.resource_version)
        )

    def _body(self, spec: Obj, resource_version: str) -> Obj:
        metadata: Obj = {"name": self._name, "namespace": self._namespace}
        if resource_version:
            metadata["resourceVersion"] = resource_version  # compare-and-swap
        return {"apiVersion": kube.LEASES.api_version, "kind": kube.LEASES.kind, "metadata": metadata, "spec": spec}

    async def release(self) -> None:
        """Give the Lease up (holder cleared, 1 s duration) if we hold it, so a successor takes
        over at once; a failure only costs the successor one lease duration."""
        if not self.is_leader or self._seen is None or self._seen.record.holder != self.identity:
            return
        self.is_leader = False
        record = self._seen.record
        stamp = micro_time(self._clock.wall())
        spec: Obj = {
            "leaseDurationSeconds": 1,
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": record.transitions,
        }
        try:
            await self._api.replace(kube.LEASES, self._namespace, self._name, self._body(spec, record.resource_version))
        except kube.ApiError as exc:
            log.warning("lease %s/%s: release failed (%s)", self._namespace, self._name, exc)
            return
        log.info("lease %s/%s released by %s", self._namespace, self._name, self.identity)

    # -- the loop ---------------------------------------------------------------------------

    async def run(self, lead: Callable[[], Awaitable[None]]) -> NoReturn:
        """Campaign, lead while holding the Lease, campaign again when it is lost; until cancelled."""
        try:
            while True:
                await self._wait_acquired()
                await self._lead_while_held(lead)
        finally:
            # Shielded: release must reach the server even though we are being cancelled.
            await asyncio.shield(self.release())

    async def _wait_acquired(self) -> None:
        while not await self._attempt():
            await self._clock.sleep(self._retry)
        self.is_leader = True
        log.info("lease %s/%s acquired by %s", self._namespace, self._name, self.identity)

    async def _attempt(self) -> bool:
        try:
            return await self.try_acquire_or_renew()
        except kube.ApiError as exc:
            log.debug("lease %s/%s: %s", self._namespace, self._name, exc)
            return False

    async def _lead_while_held(self, lead: Callable[[], Awaitable[None]]) -> None:
        task = asyncio.create_task(self._keep_leading(lead), name=f"lease-holder:{self._name}")
        try:
            await self._renew_until_lost()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.is_leader = False
        log.warning("lease %s/%s lost by %s; stopped leading", self._namespace, self._name, self.identity)

    async def _renew_until_lost(self) -> None:
        renewed = self._clock.monotonic()
        while True:
            await self._clock.sleep(self._retry)
            if await self._attempt():
                renewed = self._clock.monotonic()
                continue
            if self._seen is not None and self._seen.record.holder not in ("", self.identity):
                return  # someone else holds it now
            if self._clock.monotonic() - renewed >= self._renew_deadline:
                return  # stop before our Lease may expire for others

    async def _keep_leading(self, lead: Callable[[], Awaitable[None]]) -> None:
        """`lead` is meant to run until cancelled; when it ends or fails it is restarted after a
        pause that doubles while it keeps failing quickly (leadership is kept: the failure is the
        reconciler's, not the election's), so a persistent fault logs rarely."""
        failures = 0
        while True:
            started = self._clock.monotonic()
            try:
                await lead()
                failures = 0
            except Exception as exc:
                if self._clock.monotonic() - started >= MAX_RESTART_DELAY:
                    failures = 0
                failures += 1
                log.warning("leader task of lease %s failed (%r); restart %d", self._name, exc, failures)
            await self._clock.sleep(doubling_delay(failures, first=self._retry, cap=MAX_RESTART_DELAY))


def elector_for(api: LeaseApi, config: KubernetesDriverConfig, *, clock: Clock | None = None) -> Elector:
    """The elector the driver's configuration describes."""
    election = config.leader_election
    return Elector(
        api,
        name=election.lease_name,
        namespace=election.lease_namespace or config.namespace,
        identity=election.identity,
        lease_duration=election.lease_duration_seconds,
        renew_deadline=election.renew_deadline_seconds,
        retry_period=election.retry_period_seconds,
        clock=clock,
    )
