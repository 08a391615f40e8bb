"""Relaying one exec between a client's ExecSandbox call and the sandbox's supervisor session,
flow-controlled end to end.

The supervisor may have at most a window of output in flight; the gateway grants it more only
after the client's stream has taken the bytes (a gRPC write completes once HTTP/2 flow control
lets it out). A slow reader therefore slows the command's writes down to the pipe it writes
into; nothing is buffered without bound and nothing is dropped. A client that takes nothing for
`stall_seconds` ends the exec with an explicit error (and the command is killed): output is
complete, or the call fails — never an exit status after missing output.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import grpc

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.errors import FailedPreconditionError, ResourceExhaustedError
from warmshell.gateway import metrics
from warmshell.gateway.sessions import ExecChannel, SupervisorSession

__all__ = ["ExecRelay"]

Ctx = grpc.aio.ServicerContext[Any, Any]


class ExecRelay:
    """Runs execs over supervisor sessions with the gateway's flow-control settings."""

    def __init__(self, *, window_bytes: int, stall_seconds: float) -> None:
        self.window_bytes = window_bytes
        self.stall_seconds = stall_seconds

    async def run(self, session: SupervisorSession, request: pb.ExecSandboxRequest, context: Ctx) -> None:
        """Start the exec in the sandbox and write its events to the client until its exit.
        FailedPreconditionError when it could not run; ResourceExhaustedError when the client
        stopped reading for longer than `stall_seconds`."""
        channel = ExecChannel(exec_id=uuid.uuid4().hex, window=self.window_bytes)
        session.execs[channel.exec_id] = channel
        session.send(
            spb.GatewayMessage(
                exec_start=spb.ExecStart(
                    exec_id=channel.exec_id,
                    command=request.command,
                    environment=request.environment,
                    workdir=request.workdir,
                    timeout_seconds=request.timeout_seconds,
                    stdin=request.stdin,
                    output_window_bytes=self.window_bytes,
                )
            )
        )
        finished = False
        try:
            while True:
                event = await channel.events.get()
                if isinstance(event, spb.OutputData):
                    out = pb.ExecEvent(stderr=event.data) if event.stderr else pb.ExecEvent(stdout=event.data)
                    await self._write(context, out)
                    if grant := channel.passed_on(len(event.data)):
                        credit = spb.ExecCredit(exec_id=channel.exec_id, bytes=grant)
                        session.send(spb.GatewayMessage(exec_credit=credit))
                    continue
                finished = True
                if event.error:
                    metrics.EXECS.labels(result="error").inc()
                    raise FailedPreconditionError(f"exec failed: {event.error}")
                metrics.EXECS.labels(result="ok").inc()
                await self._write(context, pb.ExecEvent(exit_code=event.exit_code))
                return
        finally:
            if not finished:  # the client went away or stalled: stop the command in the sandbox
                session.execs.pop(channel.exec_id, None)
                session.send(spb.GatewayMessage(exec_cancel=spb.ExecCancel(exec_id=channel.exec_id)))

    async def _write(self, context: Ctx, event: pb.ExecEvent) -> None:
        try:
            await asyncio.wait_for(context.write(event), self.stall_seconds)
        except TimeoutError:
            metrics.EXECS.labels(result="stalled").inc()
            raise ResourceExhaustedError(
                f"the client read none of the exec's output for {self.stall_seconds:g}s "
                "(gateway.exec_stall_timeout_seconds): the command was killed and its output is incomplete"
            ) from None
