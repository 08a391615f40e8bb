"""SandboxService's calls built on snapshots: snapshot (a Ready sandbox's files as an image), fork
(N sandboxes on one snapshot), pause (the files kept, the runtime freed) and resume, on a driver
that can (`drivers.base.Snapshotter`); pause and resume also on a driver that suspends in place
(`drivers.base.Suspender`: Kubernetes); FAILED_PRECONDITION on one that can do neither, or for a
sandbox that is not Ready (not Paused, for a resume). Apart from `sandbox_service` so that they
live together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core import pausing
from warmshell.core.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    WarmshellError,
)
from warmshell.core.models import DEFAULT_WORKSPACE, Phase, SandboxRecord, now_ms
from warmshell.core.validation import validate_workspace
from warmshell.drivers.base import Snapshotter, Suspender
from warmshell.gateway import forking
from warmshell.gateway.auth import Authenticator
from warmshell.gateway.calls import unary
from warmshell.gateway.convert import sandbox_to_proto
from warmshell.gateway.errors import status_code_for
from warmshell.gateway.manager import SandboxManager

__all__ = ["SnapshotCalls"]

Ctx = grpc.aio.ServicerContext[Any, Any]
log = logging.getLogger(__name__)

# What a paused sandbox's supervisor is told: its instance is over (a resume starts another), so
# it stops rather than reconnect to be refused, which a pod's supervisor would exit 1 on and be
# restarted by the kubelet.
_PAUSED = "the sandbox was paused"


class SnapshotCalls:
    """Mixed into `SandboxService` (which sets `_manager` and `_auth`, and waits for a create
    to settle with `_settled`)."""

    _manager: SandboxManager
    _auth: Authenticator
    _settled: Callable[[SandboxRecord, float | None], Awaitable[SandboxRecord]]

    async def _ready_parent(
        self, workspace: str, name: str, doing: str, done: str
    ) -> tuple[SandboxRecord, Snapshotter]:
        """The Ready sandbox `name` and a driver that can snapshot it, else the reason why not."""
        record = await self._named_record(workspace, name)
        driver = self._manager.driver
        if not isinstance(driver, Snapshotter):
            raise FailedPreconditionError(f"the {driver.name} driver cannot {doing} a sandbox")
        _require_ready(record, done)
        return record, driver

    async def _named_record(self, workspace: str, name: str) -> SandboxRecord:
        workspace = workspace or DEFAULT_WORKSPACE
        validate_workspace(workspace)
        if not name:
            raise InvalidArgumentError("name", "must not be empty")
        return await self._manager.records.get_by_name(workspace, name)

    @unary
    async def SnapshotSandbox(self, request: pb.SnapshotSandboxRequest, context: Ctx) -> pb.SnapshotSandboxResponse:
        await self._auth.require_client(context)
        if not request.image:
            raise InvalidArgumentError("image", "must name the snapshot's image as NAME:TAG")
        record, driver = await self._ready_parent(request.workspace, request.name, "snapshot", "snapshotted")
        taken = await driver.snapshot(
            record.id, image=request.image, force=request.force, source=f"{record.workspace}/{record.name}"
        )
        return pb.SnapshotSandboxResponse(
            digest=taken.digest,
            image=taken.image,
            base_digest=taken.base_digest,
            layers=taken.layers,
            layer_bytes=taken.layer_bytes,
            frozen_ms=taken.frozen_ms,
            flattened=taken.flattened,
        )

    @unary
    async def ForkSandbox(self, request: pb.ForkSandboxRequest, context: Ctx) -> pb.ForkSandboxResponse:
        await self._auth.require_client(context)
        parent, driver = await self._ready_parent(request.workspace, request.name, "fork", "forked")
        names = forking.child_names(parent.name, request.prefix, request.count, most=driver.max_fork_count)
        for name in names:
            with contextlib.suppress(NotFoundError):
                await self._manager.records.get_by_name(parent.workspace, name)
                raise AlreadyExistsError(f"prefix: sandbox {parent.workspace}/{name} exists; choose another --prefix")
        # Not durable: the children die with the host, so their image need not outlive its boot.
        source = f"{parent.workspace}/{parent.name}"
        taken = await driver.snapshot(parent.id, image="", force=False, source=source, durable=False)
        secrets = await self._manager.vault.get(parent.id) if request.with_secrets else None
        timeout = request.ready_timeout_ms / 1000 or None
        children = await asyncio.gather(
            *(self._fork_child(parent, name, taken.digest, secrets, timeout) for name in names)
        )
        return pb.ForkSandboxResponse(image_digest=taken.digest, children=children, frozen_ms=taken.frozen_ms)

    async def _fork_child(
        self,
        parent: SandboxRecord,
        name: str,
        image: str,
        secrets: Mapping[str, str] | None,
        timeout: float | None,  # noqa: ASYNC109 - the wait for Ready, as a create's
    ) -> pb.ForkChild:
        try:
            record = await self._manager.create(forking.child_sandbox(parent, name, image, secrets))
            return pb.ForkChild(name=name, sandbox=sandbox_to_proto(await self._settled(record, timeout)))
        except WarmshellError as exc:
            return pb.ForkChild(name=name, error_code=status_code_for(exc).name, error=str(exc))

    @unary
    async def PauseSandbox(self, request: pb.PauseSandboxRequest, context: Ctx) -> pb.Sandbox:
        await self._auth.require_client(context)
        if request.pause_ttl_seconds < 0:
            raise InvalidArgumentError("pause_ttl_seconds", "must be 0 (the gateway's default) or more")
        ttl = request.pause_ttl_seconds or self._manager.limits.pause_ttl_seconds
        if isinstance(self._manager.driver, Suspender):
            return await self._suspend(await self._named_record(request.workspace, request.name), ttl)
        record, driver = await self._ready_parent(request.workspace, request.name, "pause", "paused")
        taken = await driver.snapshot(record.id, image="", force=False, source=f"{record.workspace}/{record.name}")
        paused = await self._manager.records.mutate(
            record.id, lambda r: pausing.mark_paused(r, taken.digest, now_ms=now_ms(), pause_ttl_seconds=ttl)
        )
        self._manager.sessions.end(record.id, _PAUSED)
        await self._manager.driver.delete(record.id)  # every process, its tmpfs and uid go; the record stays
        return sandbox_to_proto(await self._manager.records.get(record.id) or paused)

    async def _suspend(self, record: SandboxRecord, ttl: int) -> pb.Sandbox:
        """Pause in place: the record is Paused first (the commit point: from then on nothing of
        the sandbox is activated or served), its session closed, then the driver suspends it. A
        suspend that fails after the record is Paused is asked again by the reconciler, so the
        call answers Paused either way."""
        driver = self._manager.driver
        assert isinstance(driver, Suspender)
        await driver.check_suspend()
        _require_ready(record, "paused")
        paused = await self._manager.records.mutate(
            record.id,
            lambda r: (
                pausing.mark_paused(r, pausing.SUSPENDED, now_ms=now_ms(), pause_ttl_seconds=ttl)
                if r.status.phase == Phase.READY
                else False
            ),
        )
        if paused.status.phase != Phase.PAUSED:
            _require_ready(paused, "paused")  # it changed since it was read: say what it is now
        self._manager.sessions.end(record.id, _PAUSED)
        try:
            await driver.suspend(record.id)
        except WarmshellError as exc:
            log.warning(
                "sandbox %s/%s: suspend not confirmed (the reconciler asks again): %s",
                record.workspace,
                record.name,
                exc,
            )
        return sandbox_to_proto(await self._manager.records.get(record.id) or paused)

    @unary
    async def ResumeSandbox(self, request: pb.ResumeSandboxRequest, context: Ctx) -> pb.Sandbox:
        await self._auth.require_client(context)
        workspace = request.workspace or DEFAULT_WORKSPACE
        validate_workspace(workspace)
        record = await self._manager.records.get_by_name(workspace, request.name)
        if record.status.phase != Phase.PAUSED:
            raise FailedPreconditionError(
                f"sandbox {workspace}/{request.name} is {record.status.phase.value}: "
                "only a Paused sandbox can be resumed"
            )
        resumed = await self._manager.resume(record)
        if request.wait_ready:
            resumed = await self._settled(resumed, request.ready_timeout_ms / 1000 or None)
        return sandbox_to_proto(resumed)


def _require_ready(record: SandboxRecord, done: str) -> None:
    if record.status.phase != Phase.READY:
        raise FailedPreconditionError(
            f"sandbox {record.workspace}/{record.name} is {record.status.phase.value}: "
            f"only a Ready sandbox can be {done}"
        )
