"""Sandbox lifecycle in the gateway: persist-then-provision creates, deletes, and folding what
drivers and supervisors report into the stored record (phase, conditions, timeline, metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter

from warmshell.core import allocation, deadlines, lifetimes, pausing, phases
from warmshell.core.deadlines import ProvisioningDeadlines
from warmshell.core.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    NotFoundError,
    UnavailableError,
    WarmshellError,
)
from warmshell.core.ids import SandboxId, new_sandbox_id, random_name
from warmshell.core.models import (
    DEFAULT_WORKSPACE,
    Allocation,
    Condition,
    Lifetime,
    Phase,
    SandboxRecord,
    SandboxSpec,
    SandboxStatus,
    now_ms,
    now_us,
)
from warmshell.core.specs import NewSandbox
from warmshell.drivers.base import (
    BackendState,
    ComputeDriver,
    CreateRequest,
    DriverEvent,
    DriverSandbox,
    Snapshotter,
    Suspender,
)
from warmshell.gateway import metrics
from warmshell.gateway.events import EventBus, Output, Progress
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.secretvault import SecretVault
from warmshell.gateway.sessions import SessionTable
from warmshell.gateway.tokens import new_activation_token

__all__ = ["SandboxManager"]

log = logging.getLogger(__name__)

# A create this recent may be one of a sequence: not yet a quiet moment.
QUIET_SECONDS = 0.25

_NAME_ATTEMPTS = 5
# What a deleted sandbox's supervisor is told as its session ends (it stops: `Shutdown`).
DELETED_REASON = "the sandbox was deleted"
# How stale a backend sighting may get before a view that repeats the record is written anyway.
_SEEN_REFRESH_MS = 1000
# Backend states a view may report without changing the phase (see `on_driver_event_view`), and
# how long such a view waits for another write to carry it.
_PROGRESS_STATES = (BackendState.PENDING, BackendState.RUNNING)
VIEW_WRITE_SECONDS = 1.0
_BACKEND_ORDER = {
    "": 0,
    BackendState.PENDING: 1,
    BackendState.RUNNING: 2,
    BackendState.EXITED: 3,
    BackendState.FAILED: 3,
}


def _apply_driver_view(record: SandboxRecord, view: DriverSandbox) -> None:
    status = record.status
    # A paused sandbox runs no instance: a pod on its way out (or one the reconciler is about to
    # suspend again) is not taken for it, nor, after the resume, the pod the pause retired.
    fresh = status.phase != Phase.PAUSED and not pausing.is_retired(status, view.instance_id)
    if view.instance_id and not status.instance_id and fresh:
        status.instance_id = view.instance_id
    if view.pool and not status.pool:
        # The create's result was lost in a crash (`SandboxManager._release_created`): the pool
        # decides a pod's egress policy and its profile's secret hosts, so it is taken back.
        status.allocation, status.pool = view.allocation, view.pool
    # Never step back (a late "Pending" from create must not undo a "Running" the watch saw).
    if _BACKEND_ORDER.get(view.state, 0) >= _BACKEND_ORDER.get(status.backend_state, 0):
        phases.mark_backend(status, view.state.value, message=view.message)
    else:
        status.backend_seen_ms = now_ms()
    for condition in view.conditions:
        status.set_condition(
            Condition(
                type=condition.type,
                status=condition.status,
                reason=condition.reason,
                message=condition.message,
            )
        )


def _view_fields(status: SandboxStatus) -> tuple[object, ...]:
    """What folding a backend view can change, `backend_seen_ms` aside (`_apply_driver_view`:
    the instance, the backend state, conditions, the phase they settle, a lost pool). A condition is
    replaced only when its status, reason or message differ (`set_condition`), so these say
    whether a view changed anything, for a fraction of two encodes of the whole status (a warm
    create folds ~3 views)."""
    conditions = tuple((c.type, c.status, c.reason, c.message) for c in status.conditions)
    return status.phase, status.instance_id, status.backend_state, conditions, status.pool


class SandboxManager:
    """Creates and deletes sandboxes and keeps their records in step with reality."""

    def __init__(
        self,
        *,
        records: SandboxRecords,
        driver: ComputeDriver,
        bus: EventBus,
        sessions: SessionTable,
        vault: SecretVault,
        limits: lifetimes.Limits | None = None,
        deadlines: ProvisioningDeadlines | None = None,
    ) -> None:
        self.records = records
        self.vault = vault
        self.driver = driver
        self.bus = bus
        self.sessions = sessions
        self.limits = limits or lifetimes.Limits()
        # Exec activity since it was last stored (unix ms), for idle timeouts; the expiry
        # reconciler persists it, so an exec costs no store write of its own.
        self.activity: dict[SandboxId, int] = {}
        self.deadlines = deadlines or ProvisioningDeadlines()
        self._misses: Counter[str] = Counter()
        self._deadline_timers: dict[SandboxId, asyncio.TimerHandle] = {}
        self._deadline_checks: set[asyncio.Task[None]] = set()
        self._creating = 0
        self._last_create = 0.0  # monotonic

    def busy(self) -> bool:
        """Whether a create is in flight or started within the last quarter second (the
        collector's full passes wait for a moment when neither holds)."""
        return self._creating > 0 or time.monotonic() - self._last_create < QUIET_SECONDS

    def miss_counts(self) -> dict[str, int]:
        """Creates that went cold since start, by reason."""
        return dict(self._misses)

    async def create(
        self, new: NewSandbox, *, wait_ready: bool = False, ready_timeout: float | None = None
    ) -> SandboxRecord:
        """Persist (Provisioning), then ask the driver; a driver failure leaves nothing. An unset
        TTL or idle timeout takes the serving pool's default (the driver reports it with the
        create), else the gateway's. `wait_ready`: the caller answers only once the sandbox is
        Ready (or never will be), within `ready_timeout` seconds (None: its deadline), which
        lets a warm create's result be written once, Ready (`_release_created`)."""
        self._creating += 1
        self._last_create = time.monotonic()
        try:
            return await self._create(new, wait_ready, ready_timeout)
        finally:
            self._creating -= 1

    async def _create(self, new: NewSandbox, wait_ready: bool, ready_timeout: float | None) -> SandboxRecord:
        requested = now_us()
        workspace, spec, labels = new.workspace, new.spec, new.labels
        spec = self.driver.validate(workspace, spec)
        asked = lifetimes.Requested(new.ttl_seconds, new.idle_timeout_seconds)
        lifetime = lifetimes.granted(asked, self.limits, now_ms=requested // 1000)
        proof, proof_hash = new_activation_token()
        record = await self._insert(new, spec, proof_hash, requested, lifetime)
        # What happens to the record until the driver returns is written with the create's result.
        self.records.hold(record.id)
        request = CreateRequest(
            sandbox_id=record.id,
            name=record.name,
            workspace=workspace,
            spec=spec,
            activation_proof=proof,
            labels=dict(labels),
        )
        try:
            # Its own activation (inside this call, for a warm create) takes them from memory.
            with self.vault.handover.offered(record.id, proof, new.secrets):
                view = await self.driver.create(request)
        except UnavailableError:
            # The outcome is unknown (the backend may have it): keep the Provisioning record for
            # the reconciler to settle rather than risk an untracked backend object.
            with contextlib.suppress(WarmshellError):
                await self.records.release(record.id)
            raise
        except BaseException:
            await self.records.remove(record.id, self.vault.rows(record.id) if new.secrets else ())
            raise
        if view.pool_ttl_seconds is not None or view.pool_idle_timeout_seconds is not None:
            defaults = lifetimes.Requested(view.pool_ttl_seconds, view.pool_idle_timeout_seconds)
            lifetime = lifetimes.granted(asked, self.limits, now_ms=requested // 1000, profile=defaults)
        warm_wait = wait_ready and view.allocation == Allocation.WARM
        hold = min(ready_timeout or math.inf, self.deadlines.warm_seconds) if warm_wait else 0.0
        record = await self._release_created(record.id, view, lifetime, hold)
        self._watch_deadline(record)
        reason = "" if view.allocation == Allocation.WARM else view.miss_reason or "Cold"
        metrics.CREATES.labels(path=view.allocation.value, reason=reason).inc()
        if reason:
            self._misses[reason] += 1
        return record

    async def _release_created(
        self, sandbox_id: SandboxId, view: DriverSandbox, lifetime: Lifetime, hold_seconds: float
    ) -> SandboxRecord:
        """Write the create's result, after holding the record up to `hold_seconds` more until
        it is Ready (or never will be). A caller that waits for Ready anyway reads nothing of the
        result before then, and a warm sandbox's activation and session follow within
        milliseconds: folded into the held record, the three are one write instead of two (a
        warm create's five writes become four; a store of our own only, see `records.hold`). A
        crash while held loses what a crash during `driver.create` would: the next start's
        relist restores the allocation and the pool (`_apply_driver_view`), the supervisor's
        reconnect the session."""
        try:
            if hold_seconds > 0 and self.records.holds(sandbox_id):
                await self.records.until_held(sandbox_id, lambda r: phases.settled(r.status), within=hold_seconds)
        finally:
            # Also when cancelled (the caller gone): the result is written before that propagates.
            created = await self.records.release(sandbox_id, lambda r: self._created(r, view, lifetime))
        assert created is not None  # a change was given: always written
        return created

    def _watch_deadline(self, record: SandboxRecord) -> None:
        """Check the sandbox once its provisioning deadline has passed (the reconciler's relist
        checks too, which covers a gateway restarted in between)."""
        warm = record.status.allocation == Allocation.WARM and record.status.timeline.claimed_us
        delay = self.deadlines.warm_seconds if warm else self.deadlines.cold_seconds

        async def check() -> None:
            with contextlib.suppress(WarmshellError):
                # As kept (with replicas it may lag another's write of the last milliseconds):
                # marking it timed out re-checks the store's record in its compare-and-swap.
                current = await self.records.get(record.id, may_lag=True)
                if current is not None:
                    await self.enforce_deadline(current)

        def due() -> None:
            self._deadline_timers.pop(record.id, None)
            task = asyncio.create_task(check())
            self._deadline_checks.add(task)
            task.add_done_callback(self._deadline_checks.discard)

        # A timer, not a sleeping task per create: nothing runs until it is due.
        self._deadline_timers[record.id] = asyncio.get_running_loop().call_later(delay + 0.05, due)

    async def enforce_deadline(self, record: SandboxRecord) -> None:
        """A Provisioning sandbox past its deadline goes Error (the reason names the stuck step)
        and its backend is removed; the record stays for the user to see and delete."""
        message = deadlines.overdue(record, now_us(), self.deadlines)
        if message is None:
            return
        changed = await self.records.mutate(record.id, lambda r: deadlines.mark_timed_out(r.status, message))
        ready = changed.status.condition("Ready")
        if ready is None or ready.reason != deadlines.REASON:
            return  # it left Provisioning meanwhile
        log.warning("sandbox %s/%s: %s", record.workspace, record.name, message)
        self.sessions.end(record.id, message)
        try:
            await self.driver.delete(record.id)
        except WarmshellError as exc:
            log.warning("backend delete of timed-out sandbox %s failed: %s", record.id, exc)

    def close(self) -> None:
        """Stop the deadline timers (the gateway is stopping)."""
        for timer in self._deadline_timers.values():
            timer.cancel()
        self._deadline_timers.clear()
        for task in self._deadline_checks:
            task.cancel()

    async def _insert(
        self, new: NewSandbox, spec: SandboxSpec, proof_hash: str, requested: int, lifetime: Lifetime
    ) -> SandboxRecord:
        """The Provisioning record, and its secrets sealed in the same write: before the driver
        runs (a cold sandbox may be activated before it returns), and never one without the
        other. One write, not two: the second (its commit, a store round trip and the loop's
        wake-up) was ~0.2 ms of the gateway's ~5-6 ms of CPU per warm create."""
        name, workspace = new.name, new.workspace
        for _ in range(_NAME_ATTEMPTS):
            record = SandboxRecord(
                id=new_sandbox_id(),
                name=name or random_name(),
                workspace=workspace,
                labels=dict(new.labels),
                spec=spec,
                lifetime=lifetime,
                activation_proof_hash=proof_hash,
            )
            record.status.timeline.requested_us = requested
            record.status.set_condition(Condition(type="Ready", status="False", reason="Provisioning"))
            try:
                # Sealed to this id (the associated data): sealed again if another is drawn.
                return await self.records.insert(record, self.vault.sealed(record.id, workspace, new.secrets))
            except AlreadyExistsError:
                if name:
                    raise AlreadyExistsError(f"sandbox {workspace}/{name} already exists") from None
        raise AlreadyExistsError("could not generate a unique sandbox name; pass --name")

    @staticmethod
    def _created(record: SandboxRecord, view: DriverSandbox, lifetime: Lifetime) -> None:
        record.lifetime = lifetime
        status = record.status
        status.allocation = view.allocation
        status.pool = view.pool
        status.timeline.backend_created_us = view.created_us or now_us()
        status.timeline.claimed_us = view.claimed_us
        status.injected_environment = list(view.injected_environment)
        if view.allocation == Allocation.WARM:
            message = view.pool
            if view.injected_environment:
                # Without its accepted keys this create would not have matched the pool.
                message += f" (accepted at activation: {', '.join(view.injected_environment)})"
            status.set_condition(Condition(type="Allocated", status="True", reason="PoolHit", message=message))
        else:
            status.set_condition(
                Condition(
                    type="Allocated",
                    status="True",
                    reason="PoolMiss",
                    message=view.miss_reason or "Cold",
                )
            )
        _apply_driver_view(record, view)
        allocation.mark_refilled(status)  # an activation folded in before the create's result

    async def resume(self, record: SandboxRecord) -> SandboxRecord:
        """Start a new backend for a Paused record, from the image its files were kept in (see
        `core.pausing`). Held as a create is: a crash before the driver answers leaves it Paused
        on disk, and a driver that refuses leaves it Paused as it was."""
        proof, proof_hash = new_activation_token()
        self.records.hold(record.id)
        try:
            image = ""

            def resuming(r: SandboxRecord) -> None:
                nonlocal image
                image = pausing.mark_resuming(r, proof_hash, now_ms=now_ms())

            held = await self.records.mutate(record.id, resuming)
            view = await self._start_resumed(held, image, proof)
        except BaseException:
            await self.records.release(record.id, lambda r: _restore(r, record))
            raise
        resumed = await self._release_resumed(record, view)
        self._watch_deadline(resumed)
        return resumed

    async def _release_resumed(self, record: SandboxRecord, view: DriverSandbox) -> SandboxRecord:
        """The resumed record, its backend's view written. A delete that came while the driver
        started the backend (the record is Deleting, or gone) may have found nothing to remove
        yet: what the resume started is removed here, and the resume answers that the sandbox
        is gone rather than with a record in phase Deleting."""
        try:
            if isinstance(self.driver, Suspender):  # the same backend object runs again
                resumed = await self.records.release(record.id, lambda r: _apply_driver_view(r, view))
            else:
                resumed = await self.records.release(record.id, lambda r: self._created(r, view, r.lifetime))
        except NotFoundError:
            resumed = None
        if resumed is not None and resumed.status.phase != Phase.DELETING:
            return resumed
        with contextlib.suppress(WarmshellError):  # else an orphan, which the reconciler settles later
            await self.driver.delete(record.id)
        raise NotFoundError(f"sandbox {record.workspace}/{record.name} was deleted while it was resuming")

    async def _start_resumed(self, held: SandboxRecord, image: str, proof: str) -> DriverSandbox:
        """A suspended backend run again, or a new one created from the image kept at the pause."""
        if isinstance(self.driver, Suspender):
            return await self.driver.unsuspend(held.id, proof)
        spec = self.driver.validate(held.workspace, held.spec.model_copy(update={"image": image}))
        request = CreateRequest(
            sandbox_id=held.id,
            name=held.name,
            workspace=held.workspace,
            spec=spec,
            activation_proof=proof,
            labels=dict(held.labels),
        )
        return await self.driver.create(request)

    async def refresh_ttl(self, workspace: str, name: str, ttl_seconds: int) -> SandboxRecord:
        """Let a sandbox live `ttl_seconds` from now (within the gateway's maximum)."""
        record = await self.records.get_by_name(workspace or DEFAULT_WORKSPACE, name)
        if record.status.phase == Phase.DELETING:
            raise FailedPreconditionError(f"sandbox {record.workspace}/{record.name} is being deleted")

        def change(r: SandboxRecord) -> None:
            r.lifetime = lifetimes.refreshed(r.lifetime, ttl_seconds, self.limits, now_ms=now_ms())

        return await self.records.mutate(record.id, change)

    def touch(self, sandbox_id: SandboxId) -> None:
        """Exec activity in a sandbox (it is not idle)."""
        self.activity[sandbox_id] = now_ms()

    async def delete(self, workspace: str, name: str) -> bool:
        """Mark Deleting, end the supervisor session, remove the backend, then the record."""
        record = await self.records.get_by_name(workspace or DEFAULT_WORKSPACE, name)
        if self.records.holds(record.id):
            # A create in flight (`_release_created`): its record is written first, so the mark
            # below is a write of its own, on disk before the backend goes (a crash then
            # finishes the delete instead of finding a Provisioning sandbox with no backend).
            await self.records.release(record.id)
        await self.records.mutate(record.id, lambda r: phases.mark_deleting(r.status))
        if (timer := self._deadline_timers.pop(record.id, None)) is not None:
            timer.cancel()
        # Told to stop, not left to find out: a supervisor whose stream merely ended would
        # reconnect, and be refused, one ConnectSupervisor call per delete (~2% of the event
        # loop's CPU at 6 Kubernetes warm creates/s).
        self.sessions.end(record.id, DELETED_REASON)
        await self.finish_delete(record.id)
        return True

    async def finish_delete(self, sandbox_id: SandboxId) -> None:
        """Remove the backend and the record of a Deleting sandbox (also used for crash repair);
        a paused one's files (its image) go too."""
        try:
            await self.driver.delete(sandbox_id)
        except WarmshellError as exc:
            log.warning("backend delete of sandbox %s failed (will retry): %s", sandbox_id, exc)
            raise
        record = await self.records.get(sandbox_id)
        if record is not None and record.status.paused_image and isinstance(self.driver, Snapshotter):
            await self.driver.forget(record.status.paused_image)
        # The vault holds secrets only for a spec that names some (`SecretVault.sealed` makes
        # nothing for none); their row goes in the record's own statement, not a write of its own.
        sealed = self.vault.rows(sandbox_id) if record is None or record.spec.secret_names else ()
        await self.records.remove(sandbox_id, sealed)
        self.activity.pop(sandbox_id, None)

    async def on_driver_event(self, event: DriverEvent) -> None:
        """Fold one driver event into the record."""
        if event.progress is not None:
            self.bus.publish(
                event.sandbox_id,
                Progress(now_ms(), event.progress.reason, event.progress.message, event.progress.warning),
            )
        if event.deleted:
            record = await self.records.get(event.sandbox_id)
            if record is not None and record.status.phase != Phase.DELETING:
                await self.records.mutate(
                    record.id,
                    lambda r: phases.mark_backend_vanished(r.status, "the backend removed the sandbox"),
                )
        elif event.sandbox is not None:
            await self.on_driver_event_view(event.sandbox)  # (a sandbox without a record is skipped there)

    async def on_driver_event_view(self, view: DriverSandbox) -> None:
        """Fold a backend view into the record (if the sandbox still has one). A view that tells
        nothing new is not written, unless the last sighting is getting old (orphan checks use
        it): a warm create's own claim event repeats what the create has just stored."""

        def change(record: SandboxRecord) -> bool:
            seen_ms = record.status.backend_seen_ms
            before = _view_fields(record.status)
            _apply_driver_view(record, view)
            fresh = now_ms() - seen_ms < _SEEN_REFRESH_MS
            return not fresh or _view_fields(record.status) != before

        with contextlib.suppress(NotFoundError):
            if view.state in _PROGRESS_STATES:
                # No reader waits for a backend starting or running (Ready waits for the session,
                # which writes it too): written with the next write, the session's on a warm
                # create, one write fewer of its seven. A crash loses it; the next start relists.
                await self.records.mutate_later(view.sandbox_id, change, within=VIEW_WRITE_SECONDS)
            else:
                await self.records.mutate(view.sandbox_id, change)

    async def on_session(
        self, sandbox_id: SandboxId, *, connected: bool, session_id: str = "", incarnation: int = -1
    ) -> None:
        """A supervisor session opened or closed. A close names its session: when the record
        already names another one (the supervisor reconnected elsewhere first), it is left alone.
        `incarnation`: of the supervisor that opened it, as its token says (-1: not said)."""

        def change(record: SandboxRecord) -> bool:
            status = record.status
            if not connected and session_id and status.session_id not in ("", session_id):
                return False  # a newer session (on this or another replica) speaks for it now
            status.session_id, status.session_owner = (session_id, self.sessions.owner) if connected else ("", "")
            if connected and _BACKEND_ORDER.get(status.backend_state, 0) < _BACKEND_ORDER[BackendState.RUNNING]:
                # A live supervisor proves the backend is running, whatever the watch says yet.
                status.backend_state = BackendState.RUNNING.value
            phases.mark_session(status, connected, session_id)
            if connected:
                # The activated incarnation has opened a session: a replay of its credential is
                # refused from now on (see activation.reactivation_refused).
                # The token's word counts even when the activation's record change was lost
                # (a crash between the two).
                status.connected_incarnation = max(status.activated_incarnation, incarnation)
            if status.phase == Phase.READY and not status.timeline.ready_us:
                status.timeline.ready_us = now_us()
                metrics.CREATE_READY_SECONDS.labels(path=_ready_path(status)).observe(
                    (status.timeline.ready_us - status.timeline.requested_us) / 1e6
                )
            return True

        try:
            with contextlib.suppress(NotFoundError):
                await self.records.mutate(sandbox_id, change)
        except WarmshellError:
            if not connected and session_id:
                self.sessions.unrecorded_close(sandbox_id, session_id)
            raise
        if not connected and session_id:
            self.sessions.recorded_close(sandbox_id, session_id)

    async def on_workload_exit(self, sandbox_id: SandboxId, exit_code: int) -> None:
        """The workload ended: record the code; the sandbox is terminal."""

        def change(record: SandboxRecord) -> None:
            record.status.timeline.exited_us = record.status.timeline.exited_us or now_us()
            phases.mark_workload_exit(record.status, exit_code)

        with contextlib.suppress(NotFoundError):
            await self.records.mutate(sandbox_id, change)

    def on_output(self, sandbox_id: SandboxId, *, stderr: bool, data: bytes) -> None:
        """Workload output for watchers."""
        self.bus.publish(sandbox_id, Output(stderr=stderr, data=data))


def _ready_path(status: SandboxStatus) -> str:
    """The create-to-Ready histogram's path: warm, cold, or refilled (warm, after waiting for
    its pool to refill), so the warm figures are the instant starts alone."""
    allocated = status.condition("Allocated")
    return "refilled" if allocated is not None and allocated.reason == allocation.REFILLED else status.allocation.value


def _restore(record: SandboxRecord, before: SandboxRecord) -> None:
    """Put back what a resume changed (its driver refused it), unless a delete came meanwhile."""
    if record.status.phase == Phase.DELETING:
        return
    record.status = before.status.model_copy(deep=True)
    record.lifetime = before.lifetime.model_copy(deep=True)
    record.activation_proof_hash = before.activation_proof_hash
