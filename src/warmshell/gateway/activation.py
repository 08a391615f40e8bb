"""The Activator drivers call: bind a registered supervisor instance to a persisted sandbox.

Checks, in order and fail-closed: the instance has a live registration (not tombstoned), its
identity (as the driver validated it) is consistent with this sandbox, the sandbox still exists
and is not going away, and the caller's proof matches the activation token generated at create.
Only then is a sandbox token minted and sent down the registration's stream.
"""

from __future__ import annotations

import logging
from collections import Counter

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core import allocation, pausing, phases
from warmshell.core.errors import (
    ConflictError,
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
    WarmshellError,
)
from warmshell.core.ids import Fingerprint, InstanceId, SandboxId
from warmshell.core.models import WORKSPACE_DIR, Phase, SandboxRecord, SandboxStatus, now_us
from warmshell.drivers.base import Bound, SupervisorIdentity, WarmPending
from warmshell.gateway import metrics
from warmshell.gateway.egress.gate import EgressGate
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.registry import Registration, Registry
from warmshell.gateway.secretvault import SecretVault
from warmshell.gateway.tokens import SandboxTokenIssuer, proof_matches

__all__ = ["ACTIVATION_ATTEMPTS", "GatewayActivator", "reactivation_refused"]

log = logging.getLogger(__name__)

ACTIVATION_ATTEMPTS = 3
# How long an activation's record change waits for the session's write to carry it.
ACTIVATION_WRITE_SECONDS = 1.0


def _check_identity(registration: Registration[spb.SupervisorActivationMessage], record: SandboxRecord) -> None:
    identity = registration.identity
    binding = identity.binding
    if isinstance(binding, Bound) and binding.sandbox_id != record.id:
        raise PermissionDeniedError(f"instance {identity.instance_id} is bound to another sandbox")
    if not isinstance(binding, Bound | WarmPending):  # pragma: no cover - exhaustive
        raise PermissionDeniedError("unknown binding")
    if identity.workspace != record.workspace:
        raise PermissionDeniedError(
            f"instance {identity.instance_id} belongs to workspace {identity.workspace!r}, not {record.workspace!r}"
        )


def reactivation_refused(identity: SupervisorIdentity, status: SandboxStatus | None, *, session_live: bool) -> str:
    """Why a registration bound to an existing sandbox must not be activated ("" when it may):
    the sandbox's session is live, or this incarnation of the same instance has already opened a
    session (a replay of its credential, not a restart)."""
    if session_live:
        return "has a live supervisor session"
    same_instance = status is not None and status.instance_id == identity.instance_id
    if same_instance and status is not None and identity.incarnation <= status.connected_incarnation:
        return f"was already activated for incarnation {identity.incarnation} of this supervisor"
    return ""


class GatewayActivator:
    """`drivers.base.Activator` backed by the registry, the store and the token issuer."""

    def __init__(
        self,
        registry: Registry[spb.SupervisorActivationMessage],
        records: SandboxRecords,
        issuer: SandboxTokenIssuer,
        vault: SecretVault,
        egress: EgressGate | None = None,
    ) -> None:
        """`egress`: opens each sandbox's proxy socket at activation (None: no egress at all)."""
        self._registry = registry
        self._egress = egress
        self._records = records
        self._issuer = issuer
        self._vault = vault
        # The idle members by pool as of a registry generation: every pool listing asks (an
        # egress policy's lookup at each warm activation among them), and counting every parked
        # member each time grows with the pool (5.3 us with 30 parked, 59 with the 450 of the
        # Poisson benchmark's pool; 1 us from here).
        self._idle: tuple[int, Counter[Fingerprint]] = (-1, Counter())

    async def activate(
        self, *, instance_id: InstanceId, sandbox_id: SandboxId, proof: str, reason: str, claimed_us: int = 0
    ) -> None:
        """See `drivers.base.Activator.activate`."""
        for _attempt in range(1, ACTIVATION_ATTEMPTS + 1):
            registration = self._registry.pending(instance_id)
            try:
                message = await self._prepare(registration, sandbox_id, proof)
            except (PermissionDeniedError, NotFoundError, FailedPreconditionError) as exc:
                metrics.ACTIVATIONS.labels(result="refused").inc()
                # The supervisor learns why; a refused instance must start over.
                self._registry.fail_if_session(instance_id, registration.session_id, exc)
                raise
            try:
                self._registry.activate_if_session(instance_id, registration.session_id, message)
            except ConflictError:
                continue  # replaced while we validated: re-read the new registration
            metrics.ACTIVATIONS.labels(result="activated").inc()
            await self._record(sandbox_id, instance_id, registration, claimed_us)
            log.debug("activated instance %s for sandbox %s (%s)", instance_id, sandbox_id, reason)
            return
        metrics.ACTIVATIONS.labels(result="aborted").inc()
        log.warning(
            "registration of instance %s changed repeatedly while activating sandbox %s; gave up after %d attempts",
            instance_id,
            sandbox_id,
            ACTIVATION_ATTEMPTS,
        )
        raise ConflictError(f"registration of instance {instance_id} kept changing during activation")

    async def wait_registrations_changed(self, generation: int) -> int:
        """See `drivers.base.Activator.wait_registrations_changed`."""
        return await self._registry.wait_changed(generation)

    def holds(self, instance_id: InstanceId) -> bool:
        """See `drivers.base.Activator.holds`."""
        return self._registry.holds(instance_id)

    def idle_members(self) -> Counter[Fingerprint]:
        """See `drivers.base.Activator.idle_members` (a copy: the caller's own)."""
        generation, idle = self._idle
        if generation != self._registry.generation:  # every change of the parked ones moves it
            pending = (r.identity.binding for r in self._registry.warm_pending())
            idle = Counter(binding.pool for binding in pending if isinstance(binding, WarmPending))
            self._idle = (self._registry.generation, idle)
        return idle.copy()

    async def _prepare(
        self,
        registration: Registration[spb.SupervisorActivationMessage],
        sandbox_id: SandboxId,
        proof: str,
    ) -> spb.SupervisorActivationMessage:
        record = await self._records.get(sandbox_id)
        if record is None:
            raise NotFoundError(f"sandbox {sandbox_id} does not exist")
        if record.status.phase in phases.TERMINAL or record.status.phase == Phase.PAUSED:
            # Paused: whatever still runs of it (a pod on its way out) gets nothing.
            raise FailedPreconditionError(f"sandbox {sandbox_id} is {record.status.phase.value}")
        if pausing.is_retired(record.status, registration.identity.instance_id):
            raise PermissionDeniedError(f"instance {registration.identity.instance_id} was retired by a pause")
        if not proof_matches(proof, record.activation_proof_hash):
            raise PermissionDeniedError(f"activation proof does not match sandbox {sandbox_id}")
        _check_identity(registration, record)
        # Opened only now, for this sandbox's own verified session, and kept nowhere else: handed
        # over by the create in flight whose proof this is, else read from the sealed row.
        secrets = self._vault.handover.take(record.id, proof)
        if secrets is None:
            secrets = await self._vault.get(record.id) if record.spec.secret_names else {}
        # The proxy is opened for this instance before the workload can start: its first
        # connection finds the socket there.
        environment = dict(record.spec.environment)
        trusted_ca = b""
        if self._egress is not None:
            binding = registration.identity.binding
            pool = binding.pool if isinstance(binding, WarmPending) else None
            attached = await self._egress.attach(
                record, registration.identity.instance_id, pool, secrets, source=registration.peer
            )
            environment |= attached.environment
            secrets, trusted_ca = attached.secrets, attached.trusted_ca
        identity = registration.identity
        token, expires_ms = self._issuer.mint(record.id, identity.instance_id, identity.incarnation)
        return spb.SupervisorActivationMessage(
            sandbox_id=record.id,
            sandbox_name=record.name,
            workspace=record.workspace,
            token=token,
            token_expires_at_ms=expires_ms,
            workload=spb.Workload(
                command=record.spec.command,
                environment=environment,
                workdir=WORKSPACE_DIR,
                secrets=secrets,
                trusted_ca=trusted_ca,
            ),
            session_id=registration.session_id,
        )

    async def _record(
        self,
        sandbox_id: SandboxId,
        instance_id: InstanceId,
        registration: Registration[spb.SupervisorActivationMessage],
        claimed_us: int,
    ) -> None:
        activated = now_us()

        def change(record: SandboxRecord) -> None:
            timeline = record.status.timeline
            timeline.registered_us = timeline.registered_us or registration.registered_us
            timeline.claimed_us = timeline.claimed_us or claimed_us
            # A supervisor restarted in place is activated again; the timeline keeps the first.
            timeline.activated_us = timeline.activated_us or activated
            allocation.mark_refilled(record.status)
            record.status.instance_id = instance_id
            record.status.activated_incarnation = registration.identity.incarnation
            condition = self._egress.condition(record) if self._egress is not None else None
            if condition is not None:
                record.status.set_condition(condition)

        try:
            # Written with the session's write that follows within milliseconds (one write fewer
            # per warm create, ~1 ms of gateway CPU), or alone if none comes. A crash before it
            # loses the timeline alone: the incarnation, which the refusal of a replayed
            # credential relies on, rides in the token the session presents.
            await self._records.mutate_later(sandbox_id, change, within=ACTIVATION_WRITE_SECONDS)
        except WarmshellError as exc:  # the activation itself went out; the timeline is best effort
            log.warning("could not record activation of sandbox %s: %s", sandbox_id, exc)
