"""A stand-in gateway that keeps losing a real supervisor process's sessions, for memory tests.

It activates every registration at once and ends every ConnectSupervisor session after one
heartbeat round trip (`abort`) or by being stopped and started again on the same port (`goaway`,
the caller does the restart); with `max_age_ms` its server also GOAWAYs every connection that
long after it is made, as a replica that is shutting down does. A supervisor against it goes
through lost sessions and failed call attempts as fast as it reconnects.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from tests.helpers import agents
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc
from warmshell.drivers.local.runtime.launching import AGENT_BINARY

__all__ = ["ChurningGateway", "free_port", "memory_kib", "serve", "start_supervisor", "stop"]

TOKEN_LIFETIME_MS = 3_600_000
STOP_TIMEOUT_SECONDS = 5.0


def _token() -> tuple[str, int]:
    return "t" * 300, int(time.time() * 1000) + TOKEN_LIFETIME_MS


class ChurningGateway(supervisor_pb2_grpc.SupervisorServiceServicer):
    """Activates every registration; ends every session as `mode` says (`abort` or `goaway`)."""

    def __init__(self, mode: str = "abort") -> None:
        self.mode = mode
        self.sessions = 0
        self.session_started = asyncio.Event()
        self.heartbeat_answered = asyncio.Event()
        self.baseline = asyncio.all_tasks()  # the caller's tasks, which `stop` does not wait for

    async def RegisterSupervisor(self, request: Any, context: Any) -> AsyncIterator[spb.SupervisorActivationMessage]:
        token, expires = _token()
        yield spb.SupervisorActivationMessage(
            sandbox_id="sb-churn", sandbox_name="churn", token=token, token_expires_at_ms=expires
        )

    async def ConnectSupervisor(self, request_iterator: Any, context: Any) -> AsyncIterator[spb.GatewayMessage]:
        self.sessions += 1
        self.session_started.set()
        yield spb.GatewayMessage(heartbeat=spb.Heartbeat(sent_at_ms=1))
        async for message in request_iterator:
            if message.WhichOneof("message") == "heartbeat":
                break
        self.heartbeat_answered.set()
        if self.mode == "abort":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "replica going away")
        await asyncio.Event().wait()  # goaway: the server is stopped under this call

    async def RefreshSandboxToken(self, request: Any, context: Any) -> spb.RefreshSandboxTokenResponse:
        token, expires = _token()
        return spb.RefreshSandboxTokenResponse(token=token, expires_at_ms=expires)


def free_port() -> int:
    """A loopback TCP port free right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def serve(gateway: ChurningGateway, port: int, max_age_ms: int = 0) -> grpc.aio.Server:
    """Start a server for `gateway` on 127.0.0.1:`port`; the caller stops it."""
    age = [("grpc.max_connection_age_ms", max_age_ms), ("grpc.max_connection_age_grace_ms", 10)]
    server = grpc.aio.server(options=age if max_age_ms else [])
    supervisor_pb2_grpc.add_SupervisorServiceServicer_to_server(gateway, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


async def stop(server: grpc.aio.Server, gateway: ChurningGateway) -> None:
    """Stop `server` at once and let the tasks its calls left behind finish (a handler parked
    mid-stream is cancelled, and its generator closed, a step after `stop` returns)."""
    await server.stop(None)
    for _ in range(2):  # the cancelled handlers' generators are closed by tasks made on collection
        gc.collect()
        await asyncio.sleep(0)
        pending = {task for task in asyncio.all_tasks() - gateway.baseline if not task.done()}
        pending.discard(asyncio.current_task())  # type: ignore[arg-type]
        if pending:
            await asyncio.wait(pending, timeout=STOP_TIMEOUT_SECONDS)


def start_supervisor(
    port: int, workdir: Path, *, extra_env: dict[str, str] | None = None, python: str = sys.executable
) -> subprocess.Popen[bytes]:
    """`python -m warmshell supervisor` as a pod runs it, pointed at 127.0.0.1:`port`, with its
    workload's agent."""
    token = workdir / "token"
    token.write_text("credential\n")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "WARMSHELL_GATEWAY": f"127.0.0.1:{port}",
        "WARMSHELL_BOOTSTRAP_FILE": str(token),
        "WARMSHELL_RESTART_POLICY": "OnFailure",
        **(extra_env or {}),
    }
    env["WARMSHELL_AGENT_SOCKET"] = str(workdir / "agent.sock")
    # The workload's agent beside it, started by the shell the supervisor then replaces: a child
    # of the supervisor, which ends when the supervisor's connection to it closes.
    agent = [*agents.PID_1, str(AGENT_BINARY), "--connect", env["WARMSHELL_AGENT_SOCKET"]]
    both = ["sh", "-c", '"$@" & exec "$0" -m warmshell supervisor', python, *agent]
    return subprocess.Popen(both, env=env, stderr=subprocess.DEVNULL, cwd=workdir)


def memory_kib(pid: int) -> dict[str, int]:
    """Rss, Pss and Private_Dirty of `pid` in KiB (`/proc/<pid>/smaps_rollup`)."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss", "Private_Dirty"):
            out[key] = int(rest.split()[0])
    return out
