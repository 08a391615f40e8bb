"""Once activated, the supervisor holds no bootstrap credential: only its (short-lived, refreshed)
sandbox token is left for its session."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.agents import start_agent
from tests.helpers.grpc import serve_for
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc
from warmshell.supervisor.main import Supervisor, SupervisorSettings

CREDENTIAL = "the-pods-bootstrap-credential"

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the agent runs as PID 1 under bwrap")


class ActivatingGateway(supervisor_pb2_grpc.SupervisorServiceServicer):
    """Activates the registration (no workload), then holds the session open."""

    def __init__(self) -> None:
        self.credentials: list[str] = []
        self.connected = asyncio.Event()

    async def RegisterSupervisor(self, request: Any, context: Any) -> AsyncIterator[spb.SupervisorActivationMessage]:
        self.credentials.append(request.bootstrap_credential)
        yield spb.SupervisorActivationMessage(sandbox_id="sbx-1", token="jwt", token_expires_at_ms=2**62)

    async def ConnectSupervisor(self, request_iterator: Any, context: Any) -> AsyncIterator[spb.GatewayMessage]:
        self.connected.set()
        async for _ in request_iterator:
            pass
        yield spb.GatewayMessage(shutdown=spb.Shutdown(reason="test over"))  # pragma: no cover


async def test_the_credential_is_dropped_once_registered(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(CREDENTIAL + "\n")
    gateway = ActivatingGateway()
    async with serve_for(gateway) as served:
        socket = tmp_path / "agent.sock"
        environ = {
            "WARMSHELL_GATEWAY": served.address,
            "WARMSHELL_BOOTSTRAP_FILE": str(token),
            "WARMSHELL_AGENT_SOCKET": str(socket),
        }
        supervisor = Supervisor(SupervisorSettings.from_environment(environ), {"PATH": "/usr/bin:/bin"})
        assert supervisor.settings.credential == CREDENTIAL
        running = asyncio.create_task(supervisor.run())
        agent = start_agent(socket)
        try:
            async with asyncio.timeout(20):
                await gateway.connected.wait()
            assert gateway.credentials == [CREDENTIAL]
            assert supervisor.settings.credential == ""
            assert CREDENTIAL not in repr(vars(supervisor))
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            agent.kill()
            agent.wait()
