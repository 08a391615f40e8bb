"""Stored records -> public protobuf messages."""

from __future__ import annotations

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.models import Phase, SandboxRecord
from warmshell.drivers.base import PoolView

__all__ = ["pool_to_proto", "sandbox_to_proto"]

_PHASES = {
    Phase.PROVISIONING: pb.SANDBOX_PHASE_PROVISIONING,
    Phase.READY: pb.SANDBOX_PHASE_READY,
    Phase.ERROR: pb.SANDBOX_PHASE_ERROR,
    Phase.DELETING: pb.SANDBOX_PHASE_DELETING,
}


def sandbox_to_proto(record: SandboxRecord) -> pb.Sandbox:
    """The public view of a stored sandbox (never includes the activation proof hash)."""
    status = record.status
    timeline = status.timeline
    message = pb.Sandbox(
        id=record.id,
        name=record.name,
        workspace=record.workspace,
        labels=record.labels,
        created_at_ms=record.created_at_ms,
        resource_version=record.resource_version,
        spec=pb.SandboxSpec(
            image=record.spec.image,
            environment=record.spec.environment,
            resources=pb.Resources(cpu=record.spec.resources.cpu, memory=record.spec.resources.memory),
            command=record.spec.command,
            runtime_class_name=record.spec.runtime_class_name,
        ),
        status=pb.SandboxStatus(
            phase=_PHASES[status.phase],
            conditions=[
                pb.Condition(
                    type=c.type,
                    status=c.status,
                    reason=c.reason,
                    message=c.message,
                    last_transition_time_ms=c.last_transition_ms,
                )
                for c in status.conditions
            ],
            allocation=status.allocation.value,
            pool=status.pool,
            timeline=pb.Timeline(
                requested_us=timeline.requested_us,
                backend_created_us=timeline.backend_created_us,
                claimed_us=timeline.claimed_us,
                registered_us=timeline.registered_us,
                activated_us=timeline.activated_us,
                ready_us=timeline.ready_us,
                exited_us=timeline.exited_us,
            ),
            instance_id=status.instance_id,
        ),
    )
    if status.exit_code is not None:
        message.status.exit_code = status.exit_code
    return message


def pool_to_proto(pool: PoolView) -> pb.Pool:
    """The public view of a warm pool."""
    return pb.Pool(
        name=pool.name,
        workspace=pool.workspace,
        fingerprint=pool.fingerprint,
        image=pool.image,
        environment=dict(pool.environment),
        resources=pb.Resources(cpu=pool.cpu, memory=pool.memory),
        desired=pool.desired,
        ready=pool.ready,
        idle=pool.idle,
        hits=pool.hits,
        misses=pool.misses,
        source=pool.source,
        conditions=[
            pb.Condition(type=c.type, status=c.status, reason=c.reason, message=c.message) for c in pool.conditions
        ],
    )
