"""The driver's in-memory view of one local instance: a sandbox and its host-side supervisor,
cold or warm.

An instance is either bound to a sandbox (created for it, or a pool member it claimed) or an idle
pool member waiting to be claimed. Only bound instances are visible as `DriverSandbox`es.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from warmshell.core.ids import Fingerprint, InstanceId, SandboxId
from warmshell.core.models import Allocation, now_us
from warmshell.drivers.base import BackendState, Bound, CreateRequest, DriverCondition, DriverSandbox, WarmPending
from warmshell.drivers.local import credentials, records
from warmshell.drivers.local.runtime import cgroups, imageroots
from warmshell.drivers.local.runtime.limits import Bounds
from warmshell.drivers.local.runtime.processes import HostProcesses, SandboxProcess

__all__ = ["EGRESS_SUFFIX", "LOG_SUFFIX", "Instance", "egress_dir", "lost_sandbox"]

LOG_SUFFIX = ".log"  # bwrap's output is `<sandboxes>/<instance id>.log`
EGRESS_SUFFIX = ".egress"  # the directory bound into it for the egress proxy's socket


def egress_dir(parent: Path, instance_id: str) -> Path:
    """`<parent>/<instance id>.egress`: in the runtime directory, or the state directory's
    sandboxes, where its uid can reach it."""
    return parent / (instance_id + EGRESS_SUFFIX)


@dataclass(eq=False)
class Instance:
    """Mutable state of one instance, owned by the driver's event loop."""

    instance_id: InstanceId
    workspace: str
    hostname: str
    directory: Path  # <sandboxes>/<instance_id>, made only for a workspace on the host's disk there
    created_us: int
    name: str = ""
    sandbox_id: SandboxId | None = None
    proof: str = field(default="", repr=False)
    allocation: Allocation = Allocation.COLD
    pool: Fingerprint | None = None
    pool_name: str = ""
    miss_reason: str = ""
    credential_digest: str = field(default="", repr=False)
    conditions: tuple[DriverCondition, ...] = ()
    state: BackendState = BackendState.PENDING
    message: str = ""
    process: SandboxProcess | HostProcesses | None = None
    supervisor: asyncio.Task[int] | None = None  # the host-side supervisor
    uid: int | None = None  # the sandbox's own host uid (a gateway run as root)
    workspaces: Path | None = None  # where its workspace lives, when not under `directory`
    runtime: Path | None = None  # where its egress directory lives, when not beside `directory`
    logs: Path | None = None  # where its log lives, when not beside `directory`
    cgroup: cgroups.Group | None = None
    image_root: imageroots.ImageRoot | None = None  # the stored image it runs, its layers held
    bounds: Bounds | None = None  # what bounds its sandbox (None: unisolated, nothing)
    registered: bool = False
    deleting: bool = False
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    waiter: asyncio.Task[None] | None = None
    saving: asyncio.Future[None] | None = None  # a record write in flight (see Fleet.save_soon)

    @classmethod
    def cold(cls, request: CreateRequest, miss_reason: str, *, sandboxes: Path) -> Instance:
        """A new instance bound to the create from birth (its supervisor registers bound)."""
        instance_id = credentials.new_instance_id()
        return cls(
            instance_id=instance_id,
            workspace=request.workspace,
            hostname=request.name,
            directory=sandboxes / instance_id,
            created_us=now_us(),
            name=request.name,
            sandbox_id=request.sandbox_id,
            proof=request.activation_proof,
            miss_reason=miss_reason,
        )

    @classmethod
    def member(cls, workspace: str, pool: Fingerprint, pool_name: str, *, sandboxes: Path) -> Instance:
        """A new idle member of a pool (named after itself until a create claims it)."""
        instance_id = credentials.new_instance_id()
        return cls(
            instance_id=instance_id,
            workspace=workspace,
            hostname=instance_id,
            directory=sandboxes / instance_id,
            created_us=now_us(),
            allocation=Allocation.WARM,
            pool=pool,
            pool_name=pool_name,
        )

    @property
    def workspace_dir(self) -> Path:
        """The host directory bound at /workspace."""
        if self.workspaces is not None:
            return self.workspaces / self.instance_id
        return self.directory / "workspace"

    @property
    def log_path(self) -> Path:
        """Where bwrap's stdout and stderr go: beside the directory, not in it, so an instance
        whose workspace is a tmpfs (the default) or lives elsewhere needs no directory at all;
        in the gateway's own directory of the runtime directory when set (see `Fleet.launch`)."""
        return (self.logs or self.directory.parent) / (self.instance_id + LOG_SUFFIX)

    @property
    def egress_dir(self) -> Path:
        """The host directory bound into the sandbox for its egress proxy socket: in the
        runtime directory when the sandbox has a uid of its own (see `runtimedir`)."""
        return egress_dir(self.runtime or self.directory.parent, self.instance_id)

    @property
    def alive(self) -> bool:
        """Spawned and not ended, not being deleted."""
        return self.state in (BackendState.PENDING, BackendState.RUNNING) and not self.deleting

    def binding(self) -> Bound | WarmPending:
        """What `authenticate` reports: bound to a sandbox, or a pool member still waiting."""
        if self.sandbox_id is not None:
            return Bound(self.sandbox_id, self.proof)
        assert self.pool is not None, "an unbound instance is always a pool member"
        return WarmPending(self.pool)

    def view(self) -> DriverSandbox:
        """The `DriverSandbox` of a bound instance."""
        assert self.sandbox_id is not None
        return DriverSandbox(
            sandbox_id=self.sandbox_id,
            instance_id=self.instance_id,
            state=self.state,
            conditions=self.conditions,
            allocation=self.allocation,
            pool=self.pool_name,  # the name `pool list` shows, as the Kubernetes driver reports it
            miss_reason=self.miss_reason,
            message=self.message,
            created_us=self.created_us,
        )

    def record(self) -> records.InstanceRecord:
        """What goes to disk."""
        return records.InstanceRecord(
            instance_id=self.instance_id,
            credential_digest=self.credential_digest,
            workspace=self.workspace,
            hostname=self.hostname,
            created_us=self.created_us,
            pid=self.process.pid if self.process is not None else 0,
            sandbox_id=self.sandbox_id or "",
            name=self.name,
            activation_proof=self.proof,
            allocation=self.allocation.value,
            pool=self.pool or "",
            pool_name=self.pool_name,
            miss_reason=self.miss_reason,
        )


def lost_sandbox(record: records.InstanceRecord, message: str) -> DriverSandbox:
    """How a bound instance of a previous gateway run is reported: failed, with `message`."""
    return DriverSandbox(
        sandbox_id=SandboxId(record.sandbox_id),
        instance_id=record.instance_id,
        state=BackendState.FAILED,
        allocation=Allocation(record.allocation),
        pool=record.pool,
        miss_reason=record.miss_reason,
        message=message,
        created_us=record.created_us,
    )
