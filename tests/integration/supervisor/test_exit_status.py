"""The supervisor's exit status against a fake gateway on a real grpc.aio server: under the
Kubernetes pod policy (`WARMSHELL_RESTART_POLICY=OnFailure`) it exits 0 whenever the gateway has
ended its part, so the kubelet restarts only a supervisor that failed; without it (the local
driver) it exits with the workload's status, as before."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.helpers.agents import workload_agent
from tests.helpers.grpc import serve_for
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc
from warmshell.supervisor.main import Supervisor, SupervisorExit, SupervisorSettings

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the agent runs as PID 1 under bwrap")


class FakeGateway(supervisor_pb2_grpc.SupervisorServiceServicer):
    """Activates every registration with `command` (or refuses it with `refuse`); ends the
    session with a shutdown once the workload has exited, as the gateway does."""

    def __init__(self, workdir: Path, command: list[str], refuse: grpc.StatusCode | None = None) -> None:
        self.workdir = workdir
        self.command = command
        self.refuse = refuse
        self.exit_codes: list[int] = []

    async def RegisterSupervisor(self, request: Any, context: Any) -> AsyncIterator[spb.SupervisorActivationMessage]:
        if self.refuse is not None:
            await context.abort(self.refuse, "sandbox sbx-1 is Error")
        yield spb.SupervisorActivationMessage(
            sandbox_id="sbx-1",
            sandbox_name="one",
            token="t",
            token_expires_at_ms=2**62,
            workload=spb.Workload(command=self.command, workdir=str(self.workdir)),
        )

    async def ConnectSupervisor(self, request_iterator: Any, context: Any) -> AsyncIterator[spb.GatewayMessage]:
        async for message in request_iterator:
            if message.WhichOneof("message") == "workload_exited":
                self.exit_codes.append(message.workload_exited.exit_code)
                yield spb.GatewayMessage(shutdown=spb.Shutdown(reason="workload exited"))
                return


async def run_supervisor(gateway: FakeGateway, *, policy: str) -> int:
    async with serve_for(gateway) as served:
        environ = {
            "WARMSHELL_GATEWAY": served.address,
            "WARMSHELL_BOOTSTRAP_FILE": str(credential(gateway.workdir)),
            "WARMSHELL_RESTART_POLICY": policy,
            "WARMSHELL_AGENT_SOCKET": str(gateway.workdir / "agent.sock"),
        }
        settings = SupervisorSettings.from_environment(environ)
        with workload_agent(gateway.workdir / "agent.sock"):
            return await asyncio.wait_for(Supervisor(settings, {"PATH": "/usr/bin:/bin"}).run(), 20)


def credential(directory: Path) -> Path:
    path = directory / "token"
    path.write_text("a.b.c\n")
    return path


@pytest.mark.parametrize(("policy", "status"), [("", 3), ("Never", 3), ("OnFailure", 0)])
async def test_a_workload_that_failed_ends_the_supervisor(tmp_path: Path, policy: str, status: int) -> None:
    """The gateway has the workload's 3 either way; only OnFailure keeps it out of the exit."""
    gateway = FakeGateway(tmp_path, ["sh", "-c", "exit 3"])
    assert await run_supervisor(gateway, policy=policy) == status
    assert gateway.exit_codes == [3]


@pytest.mark.parametrize(
    ("refusal", "policy", "status"),
    [
        # The sandbox is over (Error, Deleting, gone): restarting cannot help, so no restart.
        (grpc.StatusCode.FAILED_PRECONDITION, "OnFailure", 0),
        (grpc.StatusCode.NOT_FOUND, "OnFailure", 0),
        (grpc.StatusCode.FAILED_PRECONDITION, "Never", 1),
        # A refused credential is a failure: the kubelet's back-off (and the restart limit) apply.
        (grpc.StatusCode.PERMISSION_DENIED, "OnFailure", 1),
        (grpc.StatusCode.PERMISSION_DENIED, "Never", 1),
    ],
)
async def test_a_refused_registration(tmp_path: Path, refusal: grpc.StatusCode, policy: str, status: int) -> None:
    gateway = FakeGateway(tmp_path, ["true"], refuse=refusal)
    assert await run_supervisor(gateway, policy=policy) == status


def test_a_restart_policy_that_would_rerun_an_ended_sandbox_is_refused(tmp_path: Path) -> None:
    environ = {"WARMSHELL_GATEWAY": "unix:///x", "WARMSHELL_BOOTSTRAP_FILE": str(credential(tmp_path))}
    with pytest.raises(SupervisorExit) as refused:
        SupervisorSettings.from_environment({**environ, "WARMSHELL_RESTART_POLICY": "Always"})
    assert refused.value.code == 2
    assert SupervisorSettings.from_environment(environ).restart_on_failure is False
    restartable = SupervisorSettings.from_environment({**environ, "WARMSHELL_RESTART_POLICY": "OnFailure"})
    assert restartable.restart_on_failure is True
