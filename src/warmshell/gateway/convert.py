"""The gateway's edge: public protobuf requests -> the core model (once, here), and stored records
-> public protobuf messages."""

from __future__ import annotations

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core import specs
from warmshell.core.models import Condition, Phase, SandboxRecord, now_ms
from warmshell.drivers.base import DriverCondition, PoolView, SandboxUsage

__all__ = ["REDACTED", "new_sandbox", "pool_to_proto", "sandbox_to_proto", "usage_to_proto"]

# What every response shows in place of a secret's value.
REDACTED = "<redacted>"

_PHASES = {
    Phase.PROVISIONING: pb.SANDBOX_PHASE_PROVISIONING,
    Phase.READY: pb.SANDBOX_PHASE_READY,
    Phase.EXITED: pb.SANDBOX_PHASE_EXITED,
    Phase.ERROR: pb.SANDBOX_PHASE_ERROR,
    Phase.DELETING: pb.SANDBOX_PHASE_DELETING,
    Phase.PAUSED: pb.SANDBOX_PHASE_PAUSED,
}


def new_sandbox(request: pb.CreateSandboxRequest) -> specs.NewSandbox:
    """A create request in the core model: validated, its quantities normalised."""
    spec = request.spec
    return specs.new_sandbox(
        workspace=request.workspace,
        name=request.name,
        labels=dict(request.labels),
        spec=lambda: specs.build_spec(
            image=spec.image,
            environment=dict(spec.environment),
            cpu=spec.resources.cpu,
            memory=spec.resources.memory,
            pids=spec.resources.pids,
            command=list(spec.command),
            runtime_class_name=spec.runtime_class_name,
            network_allow=list(spec.network.allow),
            network_deny=list(spec.network.deny),
            no_command=spec.no_command,
        ),
        secrets=dict(spec.secrets),
        secret_hosts={name: list(entry.hosts) for name, entry in spec.secret_hosts.items()},
        ttl_seconds=request.ttl_seconds if request.HasField("ttl_seconds") else None,
        idle_timeout_seconds=request.idle_timeout_seconds if request.HasField("idle_timeout_seconds") else None,
    )


def _condition(condition: Condition | DriverCondition) -> pb.Condition:
    """One condition on the wire, from the store or straight from a driver (no transition time)."""
    return pb.Condition(
        type=condition.type,
        status=condition.status,
        reason=condition.reason,
        message=condition.message,
        last_transition_time_ms=condition.last_transition_ms if isinstance(condition, Condition) else 0,
    )


def sandbox_to_proto(record: SandboxRecord) -> pb.Sandbox:
    """The public view of a stored sandbox (never includes the activation proof hash)."""
    status = record.status
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
            resources=pb.Resources(
                cpu=record.spec.resources.cpu, memory=record.spec.resources.memory, pids=record.spec.resources.pids
            ),
            command=record.spec.command,
            runtime_class_name=record.spec.runtime_class_name,
            secrets=dict.fromkeys(record.spec.secret_names, REDACTED),
            network=pb.NetworkPolicy(allow=record.spec.network.allow, deny=record.spec.network.deny),
            secret_hosts={name: pb.SecretHosts(hosts=hosts) for name, hosts in record.spec.secret_hosts.items()},
            no_command=record.spec.no_command,
        ),
        status=pb.SandboxStatus(
            phase=_PHASES[status.phase],
            conditions=[_condition(c) for c in status.conditions],
            allocation=status.allocation.value,
            pool=status.pool,
            # The stored timeline and the wire message share their field names.
            timeline=pb.Timeline(**status.timeline.model_dump()),
            instance_id=status.instance_id,
            injected_environment=status.injected_environment,
        ),
        lifetime=pb.Lifetime(**record.lifetime.model_dump()),
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
        resources=pb.Resources(cpu=pool.cpu, memory=pool.memory, pids=pool.pids),
        desired=pool.desired,
        ready=pool.ready,
        idle=pool.idle,
        hits=pool.hits,
        misses=pool.misses,
        source=pool.source,
        conditions=[_condition(c) for c in pool.conditions],
        accepted_environment=list(pool.accepted_environment),
    )


def usage_to_proto(usage: SandboxUsage) -> pb.SandboxUsage:
    """A driver's usage reading on the wire, stamped with the time of the call (unknown figures
    stay unset)."""
    figures = {name: value for name, value in usage.figures().items() if value is not None}
    return pb.SandboxUsage(**figures, unknown=usage.unknown, read_at_ms=now_ms())  # type: ignore[arg-type]
