"""A whole gateway on real sockets with the fake driver (whose bootstrap credentials the test
makes), and a hand-driven OpenSupervisor stream: what a pod's supervisor sends, one message at a
time, so a test can send what a real supervisor never would."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc, supervisor_pb2_grpc
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.config import load_config
from warmshell.drivers.fake import FakeDriver
from warmshell.gateway.server import Gateway

__all__ = ["FakeGateway", "HandDriven", "fake_gateway", "hello", "register", "until"]


@dataclass
class HandDriven:
    """The request side of one OpenSupervisor call: `send` queues a message, `end` half-closes."""

    queue: asyncio.Queue[spb.SupervisorMessage | None] = field(default_factory=asyncio.Queue)

    def send(self, message: spb.SupervisorMessage) -> None:
        """Send `message` up the stream."""
        self.queue.put_nowait(message)

    def end(self) -> None:
        """Half-close the stream."""
        self.queue.put_nowait(None)

    async def requests(self) -> AsyncIterator[spb.SupervisorMessage]:
        """What the call reads."""
        while (message := await self.queue.get()) is not None:
            yield message


@dataclass
class FakeGateway:
    """A started gateway over a `FakeDriver`, with a supervisor stub and a client stub."""

    gateway: Gateway
    driver: FakeDriver
    supervisors: supervisor_pb2_grpc.SupervisorServiceStub
    sandboxes: sandbox_pb2_grpc.SandboxServiceStub
    api_token: str

    def open(
        self, first: spb.SupervisorMessage
    ) -> tuple[grpc.aio.StreamStreamCall[spb.SupervisorMessage, spb.GatewayMessage], HandDriven]:
        """An OpenSupervisor call whose first message is `first`; the rest the test sends."""
        driven = HandDriven()
        driven.send(first)
        return self.supervisors.OpenSupervisor(driven.requests()), driven

    async def create(self, name: str) -> pb.Sandbox:
        """CreateSandbox (not waiting): the fake driver activates a pending warm instance."""
        request = pb.CreateSandboxRequest(name=name)
        return await self.sandboxes.CreateSandbox(request, metadata=self._metadata())

    async def get(self, name: str) -> pb.Sandbox:
        """GetSandbox."""
        return await self.sandboxes.GetSandbox(pb.SandboxRef(name=name), metadata=self._metadata())

    def _metadata(self) -> tuple[tuple[str, str]]:
        return (("authorization", f"Bearer {self.api_token}"),)


def register(credential: str) -> spb.SupervisorMessage:
    """OpenSupervisor's first message."""
    return spb.SupervisorMessage(register=spb.RegisterSupervisorRequest(bootstrap_credential=credential))


def hello(sandbox_id: str, instance_id: str) -> spb.SupervisorMessage:
    """A session's first message."""
    return spb.SupervisorMessage(hello=spb.SupervisorHello(sandbox_id=sandbox_id, instance_id=instance_id))


@asynccontextmanager
async def fake_gateway() -> AsyncIterator[FakeGateway]:
    """A gateway over a fake driver, stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="ws-open-") as tmp:  # short: AF_UNIX paths
        config = load_config(None, {"state_dir": str(Path(tmp) / "state"), "http_port": 0})
        driver = FakeDriver()
        gateway = Gateway(config, driver)
        await gateway.start()
        supervisors = grpc.aio.insecure_channel(f"unix://{config.paths.supervisor_socket}")
        clients = grpc.aio.insecure_channel(f"unix://{config.paths.socket}")
        try:
            yield FakeGateway(
                gateway,
                driver,
                supervisor_pb2_grpc.SupervisorServiceStub(supervisors),
                sandbox_pb2_grpc.SandboxServiceStub(clients),
                config.paths.api_token.read_text().strip(),
            )
        finally:
            await supervisors.close(grace=None)
            await clients.close(grace=None)
            await gateway.stop()


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for `condition` (on state that has no change notification), or fail."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)
