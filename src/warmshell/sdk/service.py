"""The SandboxService's calls, typed, over a `Transport`, with the caller's token and deadlines:
the wire layer under the sync `Client` (which turns the messages into views) and what the CLI
uses directly, since it renders the messages themselves (`-o json` is their proto3 JSON form).

Protobuf in, protobuf out; failures are SDK exceptions (`warmshell.sdk.errors`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.sdk.transport import Metadata, ServerStream, Transport

if TYPE_CHECKING:
    from google.protobuf.message import Message

M = TypeVar("M", bound="Message")

__all__ = ["SandboxService"]

_PREFIX = "/warmshell.v1.SandboxService/"


class SandboxService:
    """One gateway's SandboxService; unary calls are bounded by `timeout` seconds."""

    def __init__(self, transport: Transport, metadata: Metadata, *, timeout: float | None) -> None:
        self.transport = transport
        self.metadata = tuple(metadata)
        self.timeout = timeout

    def _unary(self, method: str, request: Message, response_type: type[M], timeout: float | None = None) -> M:
        return self.transport.unary(
            _PREFIX + method,
            request,
            response_type,
            metadata=self.metadata,
            timeout=self.timeout if timeout is None else timeout,
        )

    def create_sandbox(self, request: pb.CreateSandboxRequest, *, timeout: float | None = None) -> pb.Sandbox:
        """CreateSandbox: the new sandbox's first snapshot (Ready already when the request asks
        to wait for it); `timeout` overrides the service's."""
        return self._unary("CreateSandbox", request, pb.Sandbox, timeout)

    def get_sandbox(self, request: pb.SandboxRef) -> pb.Sandbox:
        """GetSandbox."""
        return self._unary("GetSandbox", request, pb.Sandbox)

    def list_sandboxes(self, request: pb.ListSandboxesRequest) -> pb.ListSandboxesResponse:
        """ListSandboxes."""
        return self._unary("ListSandboxes", request, pb.ListSandboxesResponse)

    def delete_sandbox(self, request: pb.SandboxRef) -> pb.DeleteSandboxResponse:
        """DeleteSandbox."""
        return self._unary("DeleteSandbox", request, pb.DeleteSandboxResponse)

    def refresh_ttl(self, request: pb.RefreshTtlRequest) -> pb.Sandbox:
        """RefreshTtl: the sandbox with its new lifetime."""
        return self._unary("RefreshTtl", request, pb.Sandbox)

    def list_egress(self, request: pb.SandboxRef) -> pb.ListEgressResponse:
        """ListEgress: the sandbox's latest egress decisions."""
        return self._unary("ListEgress", request, pb.ListEgressResponse)

    def start_process(self, request: pb.StartProcessRequest) -> pb.ProcessInfo:
        """StartProcess: a background command, started."""
        return self._unary("StartProcess", request, pb.ProcessInfo)

    def list_processes(self, request: pb.SandboxRef) -> pb.ListProcessesResponse:
        """ListProcesses: the sandbox's background commands, running and recently exited."""
        return self._unary("ListProcesses", request, pb.ListProcessesResponse)

    def snapshot_sandbox(self, request: pb.SnapshotSandboxRequest) -> pb.SnapshotSandboxResponse:
        """SnapshotSandbox: the image made of the sandbox."""
        return self._unary("SnapshotSandbox", request, pb.SnapshotSandboxResponse)

    def fork_sandbox(self, request: pb.ForkSandboxRequest, *, timeout: float | None = None) -> pb.ForkSandboxResponse:
        """ForkSandbox: one outcome per child."""
        return self._unary("ForkSandbox", request, pb.ForkSandboxResponse, timeout)

    def pause_sandbox(self, request: pb.PauseSandboxRequest) -> pb.Sandbox:
        """PauseSandbox: the sandbox, Paused."""
        return self._unary("PauseSandbox", request, pb.Sandbox)

    def resume_sandbox(self, request: pb.ResumeSandboxRequest, *, timeout: float | None = None) -> pb.Sandbox:
        """ResumeSandbox: the sandbox, Ready (or as it was when the wait ended)."""
        return self._unary("ResumeSandbox", request, pb.Sandbox, timeout)

    def list_pools(self, request: pb.ListPoolsRequest, *, timeout: float | None = None) -> pb.ListPoolsResponse:
        """ListPools (`timeout` overrides the service's, e.g. for a short liveness probe)."""
        return self._unary("ListPools", request, pb.ListPoolsResponse, timeout)

    def watch_sandbox(self, request: pb.WatchSandboxRequest, *, timeout: float | None) -> ServerStream[pb.SandboxEvent]:
        """WatchSandbox, ended by the server or at `timeout` (None: no deadline)."""
        return self.transport.server_stream(
            _PREFIX + "WatchSandbox", request, pb.SandboxEvent, metadata=self.metadata, timeout=timeout
        )

    def exec_sandbox(self, request: pb.ExecSandboxRequest, *, timeout: float | None) -> ServerStream[pb.ExecEvent]:
        """ExecSandbox, ended by the server or at `timeout` (None: no deadline)."""
        return self.transport.server_stream(
            _PREFIX + "ExecSandbox", request, pb.ExecEvent, metadata=self.metadata, timeout=timeout
        )
