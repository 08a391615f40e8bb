"""How a supervisor reaches the gateway: the three supervisor RPCs behind one small protocol.

A pod's supervisor is a process of its own and speaks real gRPC (`GrpcLink`, over a channel); a
local sandbox's supervisor runs inside the gateway process, which passes it a link that calls the
same servicer in process (`warmshell.gateway.inprocess`). Both transports report a refusal the
same way, as `grpc.aio.AioRpcError` with the servicer's status code and details, so the
supervisor's retry and exit rules do not depend on the transport.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

import grpc

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc

__all__ = ["GatewayLink", "GrpcLink", "SessionCall", "SessionOpener"]


class SessionCall(Protocol):
    """One open ConnectSupervisor stream, as the supervisor sees it."""

    def __aiter__(self) -> AsyncIterator[spb.GatewayMessage]:
        """The gateway's messages until the session ends (AioRpcError when it is refused or fails)."""
        ...

    def cancel(self) -> bool:
        """End the session from the supervisor's side (the gateway's handler is cancelled)."""
        ...


class GatewayLink(Protocol):
    """The supervisor API as a supervisor calls it."""

    async def register(self, request: spb.RegisterSupervisorRequest) -> spb.SupervisorActivationMessage | None:
        """RegisterSupervisor: wait until activated; None when the stream ended without an activation."""
        ...

    def connect(self, requests: AsyncIterator[spb.SupervisorMessage], token: str) -> SessionCall:
        """ConnectSupervisor with the sandbox token; `requests` go up the session."""
        ...

    async def refresh_token(self, token: str) -> spb.RefreshSandboxTokenResponse:
        """RefreshSandboxToken with the current sandbox token."""
        ...


@runtime_checkable
class SessionOpener(Protocol):
    """A link whose registration can become the first session (OpenSupervisor): a pod's, over
    gRPC, where that saves a warm create a second call. In process there is no call to save."""

    def open(self, requests: AsyncIterator[spb.SupervisorMessage]) -> SessionCall:
        """OpenSupervisor: `requests` start with `register`, then the hello once the activation
        (the call's first message) has been taken."""
        ...


def _bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


class GrpcLink:
    """`GatewayLink` over a gRPC channel (which the caller owns and closes)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = supervisor_pb2_grpc.SupervisorServiceStub(channel)

    async def register(self, request: spb.RegisterSupervisorRequest) -> spb.SupervisorActivationMessage | None:
        """See `GatewayLink.register`."""
        async for activation in self._stub.RegisterSupervisor(request):
            return activation
        return None

    def connect(self, requests: AsyncIterator[spb.SupervisorMessage], token: str) -> SessionCall:
        """See `GatewayLink.connect`."""
        return self._stub.ConnectSupervisor(requests, metadata=_bearer(token))

    def open(self, requests: AsyncIterator[spb.SupervisorMessage]) -> SessionCall:
        """See `SessionOpener.open`."""
        return self._stub.OpenSupervisor(requests)

    async def refresh_token(self, token: str) -> spb.RefreshSandboxTokenResponse:
        """See `GatewayLink.refresh_token`."""
        return await self._stub.RefreshSandboxToken(spb.RefreshSandboxTokenRequest(), metadata=_bearer(token))
