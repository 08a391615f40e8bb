"""The supervisor refreshes its sandbox token before it expires, and again after each refresh
(a timer until the first is due: no task of its own from the activation on)."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.agents import start_agent
from tests.helpers.grpc import serve_for
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc
from warmshell.supervisor.main import Supervisor, SupervisorSettings

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the agent runs as PID 1 under bwrap")


def _soon_ms() -> int:
    return int(time.time() * 1000) + 1000  # refreshed after the minimum delay, 1 s


class ShortTokens(supervisor_pb2_grpc.SupervisorServiceServicer):
    """Activates with a token that expires in a second; each refresh hands out the next one."""

    def __init__(self) -> None:
        self.presented: list[str] = []
        self.refreshed = asyncio.Event()

    async def RegisterSupervisor(self, request: Any, context: Any) -> AsyncIterator[spb.SupervisorActivationMessage]:
        yield spb.SupervisorActivationMessage(sandbox_id="sbx-1", token="token-0", token_expires_at_ms=_soon_ms())

    async def ConnectSupervisor(self, request_iterator: Any, context: Any) -> AsyncIterator[spb.GatewayMessage]:
        async for _ in request_iterator:
            pass
        yield spb.GatewayMessage(shutdown=spb.Shutdown(reason="test over"))  # pragma: no cover

    async def RefreshSandboxToken(self, request: Any, context: Any) -> spb.RefreshSandboxTokenResponse:
        presented = dict(context.invocation_metadata())["authorization"].removeprefix("Bearer ")
        self.presented.append(presented)
        if len(self.presented) >= 2:
            self.refreshed.set()
        return spb.RefreshSandboxTokenResponse(token=f"token-{len(self.presented)}", expires_at_ms=_soon_ms())


async def test_the_token_is_refreshed_before_it_expires_and_again_after(tmp_path: Path) -> None:
    credential = tmp_path / "credential"
    credential.write_text("bootstrap\n")
    gateway = ShortTokens()
    async with serve_for(gateway) as served:
        socket = tmp_path / "agent.sock"
        environ = {
            "WARMSHELL_GATEWAY": served.address,
            "WARMSHELL_BOOTSTRAP_FILE": str(credential),
            "WARMSHELL_AGENT_SOCKET": str(socket),
        }
        supervisor = Supervisor(SupervisorSettings.from_environment(environ), {"PATH": "/usr/bin:/bin"})
        started = time.monotonic()
        running = asyncio.create_task(supervisor.run())
        agent = start_agent(socket)
        try:
            async with asyncio.timeout(20):
                await gateway.refreshed.wait()
            assert gateway.presented[:2] == ["token-0", "token-1"], "each refresh presents the token it was given"
            assert time.monotonic() - started >= 1.8, "not before the first is due, nor in a loop"
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            agent.kill()
            agent.wait()
