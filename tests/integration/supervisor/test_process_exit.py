"""A pod supervisor process ends as soon as its part is over, leaving its gateway channel, gRPC's
core and its event loop to the exit: its exit status and its log are what they were, and the
gateway sees the stream end.

A real `python -m warmshell supervisor` with its workload's agent (as a pod runs them) against a
stand-in gateway: activated, it opens its session, and the gateway ends the sandbox (`Shutdown`);
or, never activated, it is sent SIGTERM (a pod deleted while it was a warm member)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.helpers import agents
from tests.helpers.churning_gateway import free_port
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc
from warmshell.drivers.local.runtime.launching import AGENT_BINARY

EXIT_SECONDS = 60.0


class EndingGateway(supervisor_pb2_grpc.SupervisorServiceServicer):
    """Activates the registration (or holds it, `activate=False`), takes the session's hello,
    ends the sandbox; `stream_ended` is set once the supervisor's side of the stream is gone."""

    def __init__(self, *, activate: bool) -> None:
        self.activate = activate
        self.registered = asyncio.Event()
        self.hello = asyncio.Event()
        self.stream_ended = asyncio.Event()

    async def OpenSupervisor(self, request_iterator: Any, context: Any) -> AsyncIterator[spb.GatewayMessage]:
        requests = aiter(request_iterator)
        try:
            first = await anext(requests)
            assert first.HasField("register")
            self.registered.set()
            if not self.activate:
                async for _ in requests:  # until the supervisor's end closes it
                    pass
                return
            activation = spb.SupervisorActivationMessage(
                sandbox_id="sb-exit", sandbox_name="exit", token="t" * 300, token_expires_at_ms=2**62
            )
            yield spb.GatewayMessage(activation=activation)
            async for message in requests:
                if message.HasField("hello"):
                    break
            self.hello.set()
            yield spb.GatewayMessage(shutdown=spb.Shutdown(reason="deleted by the test"))
            async for _ in requests:
                pass
        finally:
            self.stream_ended.set()


def _start(port: int, workdir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """The supervisor and its agent, as `churning_gateway.start_supervisor` starts them, with its
    log kept."""
    (workdir / "token").write_text("credential\n")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "WARMSHELL_GATEWAY": f"127.0.0.1:{port}",
        "WARMSHELL_BOOTSTRAP_FILE": str(workdir / "token"),
        "WARMSHELL_RESTART_POLICY": "OnFailure",
        "WARMSHELL_AGENT_SOCKET": str(workdir / "agent.sock"),
    }
    agent = [*agents.PID_1, str(AGENT_BINARY), "--connect", env["WARMSHELL_AGENT_SOCKET"]]
    both = ["sh", "-c", '"$@" & exec "$0" -m warmshell supervisor', sys.executable, *agent]
    log = workdir / "supervisor.log"
    with log.open("wb") as out:
        process = subprocess.Popen(both, env=env, stderr=out, cwd=workdir)
    return process, log


async def _served(gateway: EndingGateway, port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    supervisor_pb2_grpc.add_SupervisorServiceServicer_to_server(gateway, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


async def _exit_status(process: subprocess.Popen[bytes]) -> int:
    return await asyncio.wait_for(asyncio.to_thread(process.wait), EXIT_SECONDS)


@pytest.mark.parametrize("reason", ["shutdown", "sigterm"])
async def test_the_supervisor_process_ends_with_its_status_and_its_log(tmp_path: Path, reason: str) -> None:
    port = free_port()
    gateway = EndingGateway(activate=reason == "shutdown")
    server = await _served(gateway, port)
    process, log = _start(port, tmp_path)
    try:
        await asyncio.wait_for(gateway.registered.wait(), EXIT_SECONDS)
        if reason == "sigterm":
            process.send_signal(signal.SIGTERM)
        status = await _exit_status(process)
        await asyncio.wait_for(gateway.stream_ended.wait(), EXIT_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        await server.stop(None)
    text = log.read_text()
    assert "the workload's agent (pid 1 in its container) is connected" in text
    if reason == "shutdown":
        assert gateway.hello.is_set()
        # Under OnFailure a sandbox the gateway ended exits 0 (the kubelet does not run it again).
        assert status == 0
        assert "gateway ended the sandbox: deleted by the test" in text
    else:
        assert status == 143
