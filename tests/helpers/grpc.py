"""A one-line harness for gRPC services, like grpclib's ChannelFor:

    async with serve_for(servicer) as served:
        stub = sandbox_pb2_grpc.SandboxServiceStub(served.channel)

The server is a real grpc.aio server on a Unix socket in a fresh temporary directory (short
path: AF_UNIX paths are limited to 107 bytes), so clients can also connect by `served.address`.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from warmshell.api.v1 import image_pb2_grpc, sandbox_pb2_grpc, supervisor_pb2_grpc

__all__ = ["Served", "serve_for"]

STOP_TIMEOUT_SECONDS = 5.0

_Register = Callable[[Any, grpc.aio.Server], None]

# Servicer base class -> the generated function that adds it to a server.
_REGISTRARS: tuple[tuple[type, _Register], ...] = (
    (sandbox_pb2_grpc.SandboxServiceServicer, sandbox_pb2_grpc.add_SandboxServiceServicer_to_server),
    (
        supervisor_pb2_grpc.SupervisorServiceServicer,
        supervisor_pb2_grpc.add_SupervisorServiceServicer_to_server,
    ),
    (image_pb2_grpc.ImageServiceServicer, image_pb2_grpc.add_ImageServiceServicer_to_server),
)


@dataclass(frozen=True)
class Served:
    """Where the servicers are served, and a channel already open to them."""

    address: str
    channel: grpc.aio.Channel


def _register(servicer: object, server: grpc.aio.Server) -> None:
    for base, add in _REGISTRARS:
        if isinstance(servicer, base):
            add(servicer, server)
            return
    raise TypeError(f"{type(servicer).__name__} is not a known warmshell servicer")


@asynccontextmanager
async def serve_for(*servicers: object) -> AsyncIterator[Served]:
    """Serve `servicers` on a temporary Unix socket for the duration of the block."""
    with tempfile.TemporaryDirectory(prefix="ws-grpc-") as tmp:
        address = f"unix://{tmp}/grpc.sock"
        server = grpc.aio.server()
        for servicer in servicers:
            _register(servicer, server)
        server.add_insecure_port(address)
        before = asyncio.all_tasks()
        await server.start()
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                yield Served(address=address, channel=channel)
        finally:
            # No grace: a test that ends mid-stream should not wait for its server.
            await server.stop(None)
            await _wait_for_call_tasks(before)


async def _wait_for_call_tasks(before: set[asyncio.Task[Any]]) -> None:
    # server.stop() cancels the calls but returns before grpc's per-call tasks have run their
    # last step; let them finish here rather than be reported as leaked by tests/conftest.py.
    pending = asyncio.all_tasks() - before - {asyncio.current_task()}
    pending = {task for task in pending if not task.done()}
    if pending:
        await asyncio.wait(pending, timeout=STOP_TIMEOUT_SECONDS)
