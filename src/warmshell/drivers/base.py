"""The seam between the gateway and a compute backend.

A driver speaks driver types only (never the public protobuf `Sandbox`); the gateway composes the
public phase from what drivers report. Shaped like an httpx transport: a small protocol, used as
an async context manager, passed into the gateway. A driver also answers "who is this supervisor?"
(`IdentityProvider`) and, for warm pools, calls the gateway's `Activator` when a create selects one
of its pre-started instances.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from warmshell.core.allocation import MissReason
from warmshell.core.ids import Fingerprint, InstanceId, SandboxId
from warmshell.core.models import Allocation, SandboxSpec

__all__ = [
    "Activator",
    "BackendState",
    "Bound",
    "CachedLister",
    "ComputeDriver",
    "CreateRequest",
    "DriverCondition",
    "DriverEvent",
    "DriverSandbox",
    "IdentityProvider",
    "Leadership",
    "MissReason",
    "PoolView",
    "ProgressLine",
    "SandboxUsage",
    "SupervisorIdentity",
    "Suspender",
    "UsageReporter",
    "WarmPending",
    "invalid_profile_view",
]


class BackendState(StrEnum):
    """The backend's view of one sandbox, before the gateway adds the supervisor session."""

    PENDING = "Pending"  # accepted, not running yet (spawning, scheduling, pulling)
    RUNNING = "Running"  # the sandbox's main process / pod is up
    EXITED = "Exited"  # the sandbox ended on its own (the supervisor reports the workload exit)
    FAILED = "Failed"  # the backend cannot run it (see conditions)


@dataclass(frozen=True)
class CreateRequest:
    """What the gateway asks a driver to create; `activation_proof` is a secret the driver
    attaches to what it creates and hands back to the Activator."""

    sandbox_id: SandboxId
    name: str
    workspace: str
    spec: SandboxSpec
    activation_proof: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # keep the proof out of logs and tracebacks
        return f"CreateRequest(sandbox_id={self.sandbox_id!r}, name={self.name!r}, workspace={self.workspace!r})"


@dataclass(frozen=True)
class DriverCondition:
    """A backend condition, e.g. ("ResourceLimits", "False", "CgroupUnavailable", "...")."""

    type: str
    status: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class DriverSandbox:
    """One sandbox as the backend sees it."""

    sandbox_id: SandboxId
    instance_id: str
    state: BackendState
    conditions: tuple[DriverCondition, ...] = ()
    allocation: Allocation = Allocation.COLD
    pool: str = ""
    miss_reason: str = ""
    message: str = ""
    # When the backend object came to exist (for a warm sandbox: when its pool member started),
    # and when a warm create claimed it (0 for cold ones).
    created_us: int = 0
    claimed_us: int = 0
    # The request's environment keys the pool accepted (set at activation, not matched).
    injected_environment: tuple[str, ...] = ()
    # The serving pool's lifetime defaults (None: the gateway's), reported by the create that it
    # served, so the gateway need not look the pool up again.
    pool_ttl_seconds: int | None = None
    pool_idle_timeout_seconds: int | None = None
    # The backend keeps the sandbox with nothing running (see `Suspender`).
    suspended: bool = False


@dataclass(frozen=True)
class ProgressLine:
    """A human-readable step on the way to Ready (image pull, scheduling, pool hit...)."""

    reason: str
    message: str
    warning: bool = False
    # Observed by every gateway replica's driver on its own (a backend watch, such as Kubernetes
    # Events), so replicas do not pass it to each other.
    seen_by_every_replica: bool = False


@dataclass(frozen=True)
class DriverEvent:
    """A change the driver observed: an update, a removal, or a progress line."""

    sandbox_id: SandboxId
    sandbox: DriverSandbox | None = None
    deleted: bool = False
    progress: ProgressLine | None = None


@dataclass(frozen=True)
class Bound:
    """The instance was created for this sandbox; `proof` is the activation proof the driver
    attached to it at create time."""

    sandbox_id: SandboxId
    proof: str

    def __repr__(self) -> str:
        return f"Bound(sandbox_id={self.sandbox_id!r})"


@dataclass(frozen=True)
class WarmPending:
    """A pre-started pool member with no sandbox yet."""

    pool: Fingerprint


@dataclass(frozen=True)
class SupervisorIdentity:
    """Who a registering supervisor is, as its driver verified it."""

    driver: str
    instance_id: InstanceId
    instance_name: str
    workspace: str
    binding: Bound | WarmPending
    # Which start of the supervisor's container this is (Kubernetes: the pod's restart count), so
    # the gateway can tell a restarted supervisor from a replay of the same one's credential.
    # Drivers that never restart a supervisor in place leave it 0.
    incarnation: int = 0


class IdentityProvider(Protocol):
    """Verifies bootstrap credentials presented by supervisors, fail-closed.

    Authentication is pure: the gateway authenticates whatever credential any RPC presents, so
    what a registration sets in motion (progress lines, pool bookkeeping) happens in `registered`,
    which only an accepted RegisterSupervisor calls."""

    async def authenticate(self, credential: str) -> SupervisorIdentity | None:
        """The identity behind `credential`; None when it is not a credential of this driver.
        Raises PermissionDeniedError when it is one but fails a check. No side effects."""
        ...

    def registered(self, identity: SupervisorIdentity) -> None:
        """The gateway parked a registration of `identity` (an identity this provider returned):
        the driver's registration effects happen now, and only here."""
        ...


class Activator(Protocol):
    """The gateway side of activation: bind a registered instance to a sandbox."""

    async def activate(
        self, *, instance_id: InstanceId, sandbox_id: SandboxId, proof: str, reason: str, claimed_us: int = 0
    ) -> None:
        """Deliver the sandbox's activation to the instance's open registration stream.
        `claimed_us`: when the backend bound the sandbox to a warm instance, for drivers that learn
        it only now (a SandboxClaim bound after create); recorded on the timeline.
        Raises NotFoundError (not registered yet), AlreadyExistsError (already activated),
        PermissionDeniedError (proof or identity mismatch), UnavailableError (stream gone)."""
        ...

    async def wait_registrations_changed(self, generation: int) -> int:
        """Block until the set of registered supervisors changed after `generation`; returns the
        new generation. Warm drivers re-check their not-yet-activated claims on it."""
        ...

    def holds(self, instance_id: InstanceId) -> bool:
        """Whether a registration of `instance_id` waits here for its activation (so `activate`
        could reach it now). Cheap: warm drivers ask it for each parked claim on every change."""
        ...

    def idle_members(self) -> Counter[Fingerprint]:
        """Registrations of pool members (`WarmPending`) waiting here for a create, counted by
        their pool's fingerprint: what a driver whose pools live elsewhere shows as idle."""
        ...


@dataclass(frozen=True)
class PoolView:
    """A warm pool as `warmshell pool list` shows it."""

    name: str
    workspace: str
    fingerprint: Fingerprint
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
    conditions: tuple[DriverCondition, ...] = ()
    accepted_environment: tuple[str, ...] = ()
    # The profile's lifetime defaults for sandboxes this pool serves (None: the gateway's).
    ttl_seconds: int | None = None
    idle_timeout_seconds: int | None = None
    pids: int = 0
    # The profile's `[network]` rules (allow None: the gateway's default), applied at activation.
    network_allow: tuple[str, ...] | None = None
    network_deny: tuple[str, ...] = ()
    # The profile's `[activation] secret_hosts`, applied at activation to a request's secrets.
    secret_hosts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def invalid_profile_view(name: str, *, source: str, message: str, reason: str = "InvalidProfile") -> PoolView:
    """How `pool list` shows a profile that makes no pool: its error as a ProfileValid=False condition."""
    return PoolView(
        name=name,
        workspace="",
        fingerprint=Fingerprint(""),
        image="",
        environment={},
        cpu="",
        memory="",
        desired=0,
        ready=0,
        idle=0,
        hits=0,
        misses=0,
        source=source,
        conditions=(DriverCondition("ProfileValid", "False", reason, message),),
    )


@runtime_checkable
class ComputeDriver(Protocol):
    """A compute backend. Use as `async with driver:`; `start()` hands it the Activator."""

    name: str

    @property
    def identity(self) -> IdentityProvider:
        """Verifies this driver's bootstrap credentials."""
        ...

    async def start(self, activator: Activator) -> None:
        """Begin background work (pools, watches); called once, after the gateway is listening."""
        ...

    def default_image(self) -> str:
        """The image an empty request resolves to (part of every fingerprint)."""
        ...

    def validate(self, workspace: str, spec: SandboxSpec) -> SandboxSpec:
        """Driver-specific checks of a request (e.g. what an image means); raises
        InvalidArgumentError naming the field. Returns the spec as the driver runs it (the
        gateway records that one: e.g. an image tag pinned to its digest)."""
        ...

    async def create(self, request: CreateRequest) -> DriverSandbox:
        """Create (idempotently) the backend for a persisted sandbox."""
        ...

    async def get(self, sandbox_id: SandboxId) -> DriverSandbox | None:
        """The backend's current view, or None if it has no such sandbox."""
        ...

    async def list(self) -> list[DriverSandbox]:
        """Every sandbox this driver manages."""
        ...

    async def delete(self, sandbox_id: SandboxId) -> bool:
        """Remove the backend; False when it was already gone."""
        ...

    def watch(self) -> AsyncIterator[DriverEvent]:
        """Changes as they happen, until the driver is closed."""
        ...

    def pools(self) -> builtins.list[PoolView]:
        """The driver's warm pools (empty when it has none)."""
        ...

    async def aclose(self) -> None:
        """Stop background work; sandboxes keep running unless the driver says otherwise."""
        ...

    async def __aenter__(self) -> ComputeDriver: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


@dataclass(frozen=True)
class SandboxUsage:
    """What a running sandbox uses now; None = unknown, and `unknown` says why (in words)."""

    cpu_seconds: float | None = None
    memory_bytes: int | None = None
    memory_peak_bytes: int | None = None
    processes: int | None = None
    workspace_bytes: int | None = None
    # Bytes written to the sandbox's writable root, for drivers whose image roots have one.
    root_bytes: int | None = None
    unknown: str = ""

    def figures(self) -> dict[str, float | None]:
        """Each figure by its field's name (None: unknown)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "unknown"}


@runtime_checkable
class UsageReporter(Protocol):
    """A driver that can say what its running sandboxes use. Optional: the gateway reports the
    usage of a sandbox whose driver is not one as unknown, saying so."""

    async def usage(self, sandbox_id: SandboxId) -> SandboxUsage:
        """The sandbox's usage now, cheaply (a handful of small reads: `sandbox get` calls it).
        FailedPreconditionError when it is not running here."""
        ...


@runtime_checkable
class Leadership(Protocol):
    """A driver that can elect one leader among gateway replicas sharing a store (Kubernetes: the
    Lease). The gateway campaigns only when its store is shared, and runs its singleton work
    (orphans, deadlines, expiry, folding backend events into records) only while leading."""

    def campaign(self) -> None:
        """Start taking part in the election (idempotent); called after `start()`."""
        ...

    def leading(self) -> bool:
        """Whether this replica leads now."""
        ...


@runtime_checkable
class CachedLister(Protocol):
    """A driver that keeps its backend's objects in memory as its watch follows them (Kubernetes:
    the informers), and can say what `list` would without asking the backend. The reconciler's
    relist judges from it, and reads live only what a decision must confirm (`get` before marking
    a backend vanished; a delete finds its object itself)."""

    def cached_list(self) -> builtins.list[DriverSandbox] | None:
        """Every sandbox this driver manages, as its watch last saw it; None while that view may
        miss some (not yet listed, or a watch it needs is stopped): the caller then lists."""
        ...


@runtime_checkable
class Suspender(Protocol):
    """A driver that pauses a sandbox in place: the backend keeps the sandbox's object (and what
    it keeps of its volumes) with nothing of it running, and runs it again, as a new instance
    that registers and is activated like any other, when it is resumed (Kubernetes:
    agent-sandbox's `Suspended` operating mode). The gateway's record is the truth: it is
    marked Paused before `suspend` is asked, and the reconciler asks again for a Paused sandbox
    whose backend still runs it."""

    async def check_suspend(self) -> None:
        """FailedPreconditionError, saying why, when this backend cannot suspend at all (nothing
        is written)."""
        ...

    async def suspend(self, sandbox_id: SandboxId) -> None:
        """Stop the sandbox's instance and keep its object (idempotent); NotFoundError when the
        backend has no such sandbox."""
        ...

    async def unsuspend(self, sandbox_id: SandboxId, activation_proof: str) -> DriverSandbox:
        """Run a suspended sandbox again; its new instance registers with `activation_proof`
        (the one the gateway's record now expects), the same write that resumes it."""
        ...


@dataclass(frozen=True)
class SnapshotTaken:
    """An image made of a sandbox's filesystem (see `Snapshotter`)."""

    digest: str
    image: str  # NAME:TAG
    base_digest: str
    layers: int
    layer_bytes: int
    frozen_ms: int
    flattened: bool


@runtime_checkable
class Snapshotter(Protocol):
    """A driver that can capture a running sandbox's filesystem as an image. Optional: the
    gateway refuses a snapshot on a driver that is not one, saying so."""

    @property
    def max_fork_count(self) -> int:
        """The most children one fork may ask for."""
        ...

    async def snapshot(
        self, sandbox_id: SandboxId, *, image: str, force: bool, source: str, durable: bool = True
    ) -> SnapshotTaken:
        """Capture the sandbox (frozen meanwhile, then thawed) as `image` (NAME:TAG; "": an
        untagged image, named by its digest); `source` names it in the image's record.
        `durable` False (a fork's: its children die with the host): the image need not outlive
        this boot of the host, and the driver may skip what would make it. FailedPreconditionError
        when it is not running here."""
        ...

    async def forget(self, digest: str) -> None:
        """Remove an untagged snapshot (a paused sandbox's files, once it is deleted) and the
        layers no other image uses; one still in use stays until its users end."""
        ...
