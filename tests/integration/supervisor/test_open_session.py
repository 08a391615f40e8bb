"""A pod's supervisor registers with OpenSupervisor, and the stream that brings its activation is
its first session; against a gateway without that call (an older one) it registers and connects
with RegisterSupervisor and ConnectSupervisor. Either way the credential is gone once activated,
and a lost session is reopened with ConnectSupervisor and the token."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.helpers.agents import start_agent
from tests.helpers.grpc import serve_for
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc
from warmshell.supervisor.main import Supervisor, SupervisorSettings

CREDENTIAL = "the-pods-bootstrap-credential"
ACTIVATION = spb.SupervisorActivationMessage(sandbox_id="sbx-1", token="jwt-1", token_expires_at_ms=2**62)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the agent runs as PID 1 under bwrap")


class OlderGateway(supervisor_pb2_grpc.SupervisorServiceServicer):
    """RegisterSupervisor and ConnectSupervisor only (OpenSupervisor is UNIMPLEMENTED); every
    call noted, with its first message up and the bearer token."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.sessions = 0
        self.connected = asyncio.Event()

    async def RegisterSupervisor(self, request: Any, context: Any) -> AsyncIterator[spb.SupervisorActivationMessage]:
        self.calls.append(("RegisterSupervisor", request.bootstrap_credential))
        yield ACTIVATION

    async def ConnectSupervisor(self, request_iterator: Any, context: Any) -> AsyncIterator[spb.GatewayMessage]:
        metadata = dict(context.invocation_metadata())
        first = await anext(aiter(request_iterator))
        self.calls.append(("ConnectSupervisor", f"{first.WhichOneof('message')} {metadata['authorization']}"))
        async for message in self._session():
            yield message

    async def _session(self) -> AsyncIterator[spb.GatewayMessage]:
        """The first session is ended with a reconnect request, the second held until the test ends."""
        self.sessions += 1
        yield spb.GatewayMessage(accepted=spb.SessionAccepted(session_id=f"s{self.sessions}"))
        if self.sessions == 1:
            yield spb.GatewayMessage(shutdown=spb.Shutdown(reason="restarting", reconnect=True))
            return
        self.connected.set()
        await asyncio.Event().wait()


class CurrentGateway(OlderGateway):
    """With OpenSupervisor."""

    async def OpenSupervisor(self, request_iterator: Any, context: Any) -> AsyncIterator[spb.GatewayMessage]:
        messages = aiter(request_iterator)
        first = await anext(messages)
        self.calls.append(("OpenSupervisor", f"{first.WhichOneof('message')} {first.register.bootstrap_credential}"))
        yield spb.GatewayMessage(activation=ACTIVATION)
        second = await anext(messages)
        self.calls.append(("OpenSupervisor", f"{second.WhichOneof('message')} {second.hello.sandbox_id}"))
        async for message in self._session():
            yield message


@asynccontextmanager
async def _supervising(
    gateway: supervisor_pb2_grpc.SupervisorServiceServicer, tmp_path: Path
) -> AsyncIterator[tuple[Supervisor, asyncio.Task[int]]]:
    """A pod's supervisor (with its workload's agent) running against `gateway`, stopped on exit."""
    token = tmp_path / "token"
    token.write_text(CREDENTIAL + "\n")
    async with serve_for(gateway) as served:
        socket = tmp_path / "agent.sock"
        environ = {
            "WARMSHELL_GATEWAY": served.address,
            "WARMSHELL_BOOTSTRAP_FILE": str(token),
            "WARMSHELL_AGENT_SOCKET": str(socket),
        }
        supervisor = Supervisor(SupervisorSettings.from_environment(environ), {"PATH": "/usr/bin:/bin"})
        running = asyncio.create_task(supervisor.run())
        agent = start_agent(socket)
        try:
            yield supervisor, running
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            agent.kill()
            agent.wait()


async def _run(gateway: OlderGateway, tmp_path: Path) -> Supervisor:
    """A supervisor against `gateway` until its second session is open."""
    async with _supervising(gateway, tmp_path) as (supervisor, _), asyncio.timeout(20):
        await gateway.connected.wait()
    return supervisor


async def test_the_registration_stream_is_the_first_session(tmp_path: Path) -> None:
    gateway = CurrentGateway()
    supervisor = await _run(gateway, tmp_path)
    assert gateway.calls == [
        ("OpenSupervisor", f"register {CREDENTIAL}"),
        ("OpenSupervisor", "hello sbx-1"),
        ("ConnectSupervisor", "hello Bearer jwt-1"),  # the reconnect the gateway asked for
    ]
    assert supervisor.settings.credential == ""
    assert CREDENTIAL not in repr(vars(supervisor))


async def test_an_older_gateway_is_registered_with_and_connected_to_apart(tmp_path: Path) -> None:
    gateway = OlderGateway()
    supervisor = await _run(gateway, tmp_path)
    assert gateway.calls == [
        ("RegisterSupervisor", CREDENTIAL),
        ("ConnectSupervisor", "hello Bearer jwt-1"),
        ("ConnectSupervisor", "hello Bearer jwt-1"),
    ]
    assert supervisor.settings.credential == ""


async def test_a_refusal_on_the_registration_stream_stops_the_supervisor(tmp_path: Path) -> None:
    class Refusing(CurrentGateway):
        async def OpenSupervisor(self, request_iterator: Any, context: Any) -> AsyncIterator[spb.GatewayMessage]:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown bootstrap credential")
            yield spb.GatewayMessage()  # pragma: no cover - abort raises

    async with _supervising(Refusing(), tmp_path) as (_, running), asyncio.timeout(20):
        assert await running == 1
