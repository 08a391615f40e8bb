"""SandboxService's snapshot call: a Ready sandbox's filesystem captured as an image, on a driver
that can (`drivers.base.Snapshotter`); FAILED_PRECONDITION on one that cannot, or for a sandbox
that is not Ready. Apart from `sandbox_service` so the lifecycle calls built on snapshots (fork,
pause, resume) live together."""

from __future__ import annotations

from typing import Any

import grpc

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.errors import FailedPreconditionError, InvalidArgumentError
from warmshell.core.models import DEFAULT_WORKSPACE, Phase
from warmshell.core.validation import validate_workspace
from warmshell.drivers.base import Snapshotter
from warmshell.gateway.auth import Authenticator
from warmshell.gateway.calls import unary
from warmshell.gateway.manager import SandboxManager

__all__ = ["SnapshotCalls"]

Ctx = grpc.aio.ServicerContext[Any, Any]


class SnapshotCalls:
    """Mixed into `SandboxService` (which sets `_manager` and `_auth`)."""

    _manager: SandboxManager
    _auth: Authenticator

    @unary
    async def SnapshotSandbox(self, request: pb.SnapshotSandboxRequest, context: Ctx) -> pb.SnapshotSandboxResponse:
        await self._auth.require_client(context)
        workspace = request.workspace or DEFAULT_WORKSPACE
        validate_workspace(workspace)
        if not request.name:
            raise InvalidArgumentError("name", "must not be empty")
        if not request.image:
            raise InvalidArgumentError("image", "must name the snapshot's image as NAME:TAG")
        record = await self._manager.records.get_by_name(workspace, request.name)
        driver = self._manager.driver
        if not isinstance(driver, Snapshotter):
            raise FailedPreconditionError(f"the {driver.name} driver cannot snapshot a sandbox")
        if record.status.phase != Phase.READY:
            raise FailedPreconditionError(
                f"sandbox {workspace}/{request.name} is {record.status.phase.value}: "
                "only a Ready sandbox can be snapshotted"
            )
        taken = await driver.snapshot(
            record.id, image=request.image, force=request.force, source=f"{workspace}/{request.name}"
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
