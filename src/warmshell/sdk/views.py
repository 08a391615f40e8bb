"""What the SDK returns: plain, frozen snapshots of sandboxes, pools and command results,
converted from the wire messages here so callers never handle protobuf."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from warmshell.api.v1 import outcome_pb2
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.states import Allocation, Phase

__all__ = [
    "Condition",
    "EgressDecision",
    "ExecError",
    "ExecOutcome",
    "ExecResult",
    "Lifetime",
    "Network",
    "OutputEvent",
    "PoolInfo",
    "SandboxInfo",
    "Secret",
    "SnapshotInfo",
    "Timeline",
    "Usage",
    "egress_decisions",
    "pool_info",
    "sandbox_info",
]

_PHASES = {
    pb.SANDBOX_PHASE_PROVISIONING: Phase.PROVISIONING,
    pb.SANDBOX_PHASE_READY: Phase.READY,
    pb.SANDBOX_PHASE_EXITED: Phase.EXITED,
    pb.SANDBOX_PHASE_ERROR: Phase.ERROR,
    pb.SANDBOX_PHASE_DELETING: Phase.DELETING,
    pb.SANDBOX_PHASE_PAUSED: Phase.PAUSED,
}


@dataclass(frozen=True)
class Condition:
    """Why a sandbox (or pool) is where it is, Kubernetes-style."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_ms: int = 0


@dataclass(frozen=True)
class Timeline:
    """When each step on the way to Ready happened (unix microseconds; 0 = not reached)."""

    requested_us: int = 0
    backend_created_us: int = 0
    claimed_us: int = 0
    registered_us: int = 0
    activated_us: int = 0
    ready_us: int = 0
    exited_us: int = 0

    @property
    def ready_ms(self) -> float | None:
        """Milliseconds from the request to Ready, once Ready was reached."""
        if not (self.requested_us and self.ready_us):
            return None
        return (self.ready_us - self.requested_us) / 1000


@dataclass(frozen=True)
class Lifetime:
    """When the gateway will delete the sandbox: at `expires_at` (None: no TTL), and/or after
    `idle_timeout_seconds` without an exec (0: never)."""

    ttl_seconds: int = 0
    expires_at: datetime | None = None
    idle_timeout_seconds: int = 0


@dataclass(frozen=True)
class Usage:
    """What a running sandbox used when the gateway was asked (`Sandbox.info()`); None = unknown
    (not running, or its driver cannot read that figure), and `unknown` says why."""

    cpu_seconds: float | None = None
    memory_bytes: int | None = None
    memory_peak_bytes: int | None = None
    processes: int | None = None
    workspace_bytes: int | None = None
    # Bytes written to the sandbox's writable root, where its image root has one.
    root_bytes: int | None = None
    unknown: str = ""
    read_at_ms: int = 0
    # Bytes through the gateway's egress proxy, out of the sandbox and into it (None: no proxy).
    egress_bytes_out: int | None = None
    egress_bytes_in: int | None = None


@dataclass(frozen=True)
class SandboxInfo:
    """One sandbox as the gateway reported it."""

    id: str
    name: str
    workspace: str
    phase: Phase
    allocation: Allocation
    pool: str
    exit_code: int | None
    conditions: tuple[Condition, ...]
    timeline: Timeline
    lifetime: Lifetime
    labels: Mapping[str, str]
    image: str
    command: tuple[str, ...]
    cpu: str
    memory: str
    created_at_ms: int
    instance_id: str = ""
    # Names only: the gateway never returns a secret's value.
    secret_names: tuple[str, ...] = ()
    # 0: no limit of its own was asked for (the gateway's default applies).
    pids: int = 0
    # Set by `info()` and `get()` (a listing carries none: None).
    usage: Usage | None = None

    def condition(self, type_: str) -> Condition | None:
        """The condition of that type, if any."""
        return next((c for c in self.conditions if c.type == type_), None)

    @property
    def reason(self) -> str:
        """`Reason: message` of the Ready condition (why it is, or is not, Ready)."""
        ready = self.condition("Ready")
        if ready is None:
            return ""
        return f"{ready.reason}: {ready.message}" if ready.message else ready.reason


@dataclass(frozen=True)
class Network:
    """A create's egress rules (`HOST[:PORT]`, `*.DOMAIN[:PORT]`, an IP, a CIDR): `allow`
    narrows what the sandbox's profile and the gateway allow (or replaces it, where the gateway
    lets requests widen); `deny` always applies."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()


@dataclass(frozen=True)
class Secret:
    """A secret for some hosts only (`secrets={"API_KEY": Secret("…", hosts=["api.example.com"])}`):
    the workload sees a placeholder, which the gateway's egress proxy swaps for the value in
    request headers to those hosts (HTTPS included: it intercepts TLS for them alone)."""

    value: str = field(repr=False)
    hosts: tuple[str, ...] | list[str] = ()


@dataclass(frozen=True)
class EgressDecision:
    """One connection the gateway's egress proxy decided on."""

    time: datetime
    host: str
    port: int
    allowed: bool
    rule: str
    reason: str
    bytes_up: int
    bytes_down: int


def egress_decisions(message: pb.ListEgressResponse) -> list[EgressDecision]:
    """The decisions of a ListEgress response, oldest first."""
    return [
        EgressDecision(
            time=datetime.fromtimestamp(d.time_ms / 1000, tz=UTC),
            host=d.host,
            port=d.port,
            allowed=d.allowed,
            rule=d.rule,
            reason=d.reason,
            bytes_up=d.bytes_up,
            bytes_down=d.bytes_down,
        )
        for d in message.decisions
    ]


@dataclass(frozen=True)
class PoolInfo:
    """A warm pool and how well it serves creates."""

    name: str
    workspace: str
    fingerprint: str
    image: str
    environment: Mapping[str, str]
    cpu: str
    memory: str
    desired: int
    ready: int
    idle: int
    hits: int
    misses: int
    source: str
    conditions: tuple[Condition, ...] = ()
    pids: int = 0


class ExecError(enum.Enum):
    """Why a command never started (its exit code is then the shell's: 127, 126, 125)."""

    COMMAND_NOT_FOUND = "command_not_found"
    NOT_EXECUTABLE = "not_executable"
    WORKDIR = "workdir"  # the workdir does not exist, is not a directory or cannot be entered


_EXEC_ERRORS = {
    outcome_pb2.EXEC_ERROR_COMMAND_NOT_FOUND: ExecError.COMMAND_NOT_FOUND,
    outcome_pb2.EXEC_ERROR_NOT_EXECUTABLE: ExecError.NOT_EXECUTABLE,
    outcome_pb2.EXEC_ERROR_WORKDIR: ExecError.WORKDIR,
}


@dataclass(frozen=True)
class ExecOutcome:
    """How a command ended as the system saw it (never written into its output): killed at its
    `timeout` (`timed_out`; exit code 124), ended by `signal` (0: it exited by itself), or never
    started (`error`, and `error_message` naming the command or workdir)."""

    timed_out: bool = False
    signal: int = 0
    error: ExecError | None = None
    error_message: str = ""


def exec_outcome(message: outcome_pb2.ExecOutcome) -> ExecOutcome:
    """The outcome carried by a wire ExecEvent (an unknown error code reads as not executable)."""
    error = _EXEC_ERRORS.get(message.error, ExecError.NOT_EXECUTABLE) if message.error else None
    return ExecOutcome(message.timed_out, message.signal, error, message.error_message)


class _Outcome:
    """The outcome's fields, read on the result that carries it."""

    outcome: ExecOutcome | None

    @property
    def timed_out(self) -> bool:
        """Killed at its timeout (its exit code is 124, but a command's own 124 is not this)."""
        return self.outcome is not None and self.outcome.timed_out

    @property
    def signal(self) -> int:
        """The signal that ended the command; 0 when it exited by itself."""
        return self.outcome.signal if self.outcome is not None else 0

    @property
    def error(self) -> ExecError | None:
        """Why the command never started; None when it ran."""
        return self.outcome.error if self.outcome is not None else None


@dataclass(frozen=True)
class ExecResult(_Outcome):
    """A finished command: its exit code (128+N killed by signal N), its output, how it ended
    (`timed_out`, `signal`, `error`: see ExecOutcome), and `duration_ms`: for `run`, the call's
    wall time as the caller saw it; for `wait_exit`, how long the workload ran (from its
    activation to its exit)."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_ms: float
    outcome: ExecOutcome = field(default_factory=ExecOutcome)

    @property
    def ok(self) -> bool:
        """It ran and exited 0."""
        return self.exit_code == 0 and self.error is None and not self.timed_out


@dataclass(frozen=True)
class OutputEvent(_Outcome):
    """One step of a streamed command: a chunk of stdout or stderr, or (last) the exit code
    with how the command ended (`outcome`, and `timed_out`, `signal`, `error` read from it)."""

    stdout: bytes = b""
    stderr: bytes = b""
    exit_code: int | None = field(default=None)
    outcome: ExecOutcome | None = None
    # A reattached background command: this many bytes before this chunk were dropped from its
    # ring before this client read them.
    dropped_bytes: int = 0


def _conditions(conditions: object) -> tuple[Condition, ...]:
    return tuple(
        Condition(c.type, c.status, c.reason, c.message, c.last_transition_time_ms)
        for c in conditions  # type: ignore[attr-defined]
    )


def _lifetime(lifetime: pb.Lifetime) -> Lifetime:
    expires = datetime.fromtimestamp(lifetime.expires_at_ms / 1000, tz=UTC) if lifetime.expires_at_ms else None
    return Lifetime(lifetime.ttl_seconds, expires, lifetime.idle_timeout_seconds)


def _allocation(value: str) -> Allocation:
    return Allocation(value) if value in Allocation._value2member_map_ else Allocation.COLD


def sandbox_info(message: pb.Sandbox) -> SandboxInfo:
    """The snapshot of a wire `Sandbox`."""
    status, spec, t = message.status, message.spec, message.status.timeline
    return SandboxInfo(
        id=message.id,
        name=message.name,
        workspace=message.workspace,
        phase=_PHASES.get(status.phase, Phase.PROVISIONING),
        allocation=_allocation(status.allocation),
        pool=status.pool,
        exit_code=status.exit_code if status.HasField("exit_code") else None,
        conditions=_conditions(status.conditions),
        timeline=Timeline(
            t.requested_us, t.backend_created_us, t.claimed_us, t.registered_us, t.activated_us, t.ready_us, t.exited_us
        ),
        lifetime=_lifetime(message.lifetime),
        labels=dict(message.labels),
        image=spec.image,
        command=tuple(spec.command),
        cpu=spec.resources.cpu,
        memory=spec.resources.memory,
        created_at_ms=message.created_at_ms,
        instance_id=status.instance_id,
        secret_names=tuple(sorted(spec.secrets)),
        pids=spec.resources.pids,
        usage=_usage(status.usage) if status.HasField("usage") else None,
    )


def _usage(usage: pb.SandboxUsage) -> Usage:
    figures = (
        "cpu_seconds",
        "memory_bytes",
        "memory_peak_bytes",
        "processes",
        "workspace_bytes",
        "root_bytes",
        "egress_bytes_out",
        "egress_bytes_in",
    )
    known = {field.name: value for field, value in usage.ListFields() if field.name in figures}
    return Usage(**known, unknown=usage.unknown, read_at_ms=usage.read_at_ms)


def pool_info(message: pb.Pool) -> PoolInfo:
    """The snapshot of a wire `Pool`."""
    return PoolInfo(
        name=message.name,
        workspace=message.workspace,
        fingerprint=message.fingerprint,
        image=message.image,
        environment=dict(message.environment),
        cpu=message.resources.cpu,
        memory=message.resources.memory,
        desired=message.desired,
        ready=message.ready,
        idle=message.idle,
        hits=message.hits,
        misses=message.misses,
        source=message.source,
        conditions=_conditions(message.conditions),
        pids=message.resources.pids,
    )


@dataclass(frozen=True)
class SnapshotInfo:
    """An image made of a sandbox's filesystem (`Sandbox.snapshot`)."""

    digest: str
    image: str
    base_digest: str
    layers: int
    layer_bytes: int
    frozen_ms: int
    flattened: bool

    @property
    def pinned(self) -> str:
        """NAME:TAG@DIGEST, the reference a create from exactly this snapshot names."""
        return f"{self.image}@{self.digest}"


def snapshot_info(message: pb.SnapshotSandboxResponse) -> SnapshotInfo:
    """The view of a SnapshotSandbox response."""
    return SnapshotInfo(
        digest=message.digest,
        image=message.image,
        base_digest=message.base_digest,
        layers=message.layers,
        layer_bytes=message.layer_bytes,
        frozen_ms=message.frozen_ms,
        flattened=message.flattened,
    )
