"""An in-process SandboxService that scripts what the CLI sees, and a runner for the real CLI.

The fake answers from plain data set by each test (sandboxes, watch and exec event scripts) and
records the requests it got, so tests assert on both what the CLI sent and what it printed.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.cli import main

TOKEN = "test-token"

_Context = grpc.aio.ServicerContext[object, object]


def sandbox(name: str, phase: int = pb.SANDBOX_PHASE_PROVISIONING, **status: object) -> pb.Sandbox:
    """A Sandbox message in the default workspace with the given phase and status fields."""
    return pb.Sandbox(
        id=f"id-{name}",
        name=name,
        workspace="default",
        status=pb.SandboxStatus(phase=phase, **status),  # type: ignore[arg-type]
    )


def event(**kind: object) -> pb.SandboxEvent:
    """A SandboxEvent: event(sandbox=...), event(progress=...), event(output=...), event(deleted=...)."""
    return pb.SandboxEvent(**kind)  # type: ignore[arg-type]


@dataclass
class FakeSandboxService(sandbox_pb2_grpc.SandboxServiceServicer):
    """Scripted answers; `requests` records (method, request) in arrival order."""

    sandboxes: dict[str, pb.Sandbox] = field(default_factory=dict)
    watch_events: list[pb.SandboxEvent] = field(default_factory=list)
    # When set, the watch stream stays open after its script (for timeout and Ctrl-C paths).
    watch_hangs: bool = False
    exec_events: list[pb.ExecEvent] = field(default_factory=list)
    pools: pb.ListPoolsResponse = field(default_factory=pb.ListPoolsResponse)
    create_error: tuple[grpc.StatusCode, str] | None = None
    requests: list[tuple[str, object]] = field(default_factory=list)

    async def _admit(self, method: str, request: object, context: _Context) -> None:
        self.requests.append((method, request))
        metadata = dict(context.invocation_metadata() or ())
        if metadata.get("authorization") != f"Bearer {TOKEN}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid API token")

    async def _lookup(self, name: str, context: _Context) -> pb.Sandbox:
        if name not in self.sandboxes:
            await context.abort(grpc.StatusCode.NOT_FOUND, f'sandbox "default/{name}" not found')
        return self.sandboxes[name]

    async def CreateSandbox(self, request, context):  # type: ignore[no-untyped-def]
        await self._admit("CreateSandbox", request, context)
        if self.create_error is not None:
            await context.abort(*self.create_error)
        created = sandbox(request.name or "generated-1")
        created.spec.CopyFrom(request.spec)
        created.labels.update(request.labels)
        self.sandboxes[created.name] = created
        return created

    async def GetSandbox(self, request, context):  # type: ignore[no-untyped-def]
        await self._admit("GetSandbox", request, context)
        return await self._lookup(request.name, context)

    async def ListSandboxes(self, request, context):  # type: ignore[no-untyped-def]
        await self._admit("ListSandboxes", request, context)
        return pb.ListSandboxesResponse(sandboxes=list(self.sandboxes.values()))

    async def DeleteSandbox(self, request, context):  # type: ignore[no-untyped-def]
        await self._admit("DeleteSandbox", request, context)
        await self._lookup(request.name, context)
        del self.sandboxes[request.name]
        return pb.DeleteSandboxResponse(deleted=True)

    async def WatchSandbox(self, request, context) -> AsyncIterator[pb.SandboxEvent]:  # type: ignore[no-untyped-def]
        await self._admit("WatchSandbox", request, context)
        await self._lookup(request.name, context)
        for item in self.watch_events:
            yield item
        if self.watch_hangs:
            await asyncio.Event().wait()  # until the client goes away and the call is cancelled

    async def ExecSandbox(self, request, context) -> AsyncIterator[pb.ExecEvent]:  # type: ignore[no-untyped-def]
        await self._admit("ExecSandbox", request, context)
        await self._lookup(request.name, context)
        for item in self.exec_events:
            yield item

    async def ListPools(self, request, context):  # type: ignore[no-untyped-def]
        await self._admit("ListPools", request, context)
        return self.pools


@dataclass
class Result:
    """What one CLI run printed and its exit code."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """Both streams, for failure messages."""
        return self.stdout + self.stderr


class _Stream(io.TextIOWrapper):
    """A text stream with a `.buffer`, as the CLI writes workload bytes to sys.stdout.buffer."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", write_through=True)

    def text(self) -> str:
        self.flush()
        raw = self.buffer
        assert isinstance(raw, io.BytesIO)
        return raw.getvalue().decode()


def _run_captured(argv: list[str], env: dict[str, str | None]) -> Result:
    out, err = _Stream(), _Stream()
    saved = {name: os.environ.get(name) for name in env}
    old_out, old_err = sys.stdout, sys.stderr
    try:
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        sys.stdout, sys.stderr = out, err
        code = main.run(argv)
    finally:
        sys.stdout, sys.stderr = old_out, old_err
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return Result(exit_code=code, stdout=out.text(), stderr=err.text())


async def invoke(address: str, args: Sequence[str], *, token: str = TOKEN) -> Result:
    """Run the real CLI (`warmshell.cli.main.run`) against `address`, in a worker thread: the CLI
    runs its own event loop with asyncio.run, which cannot nest inside the test's loop."""
    argv = ["--gateway", address, "--token", token, *args]
    # The developer's own WARMSHELL_* settings (output format, workspace, ...) must not leak in.
    env: dict[str, str | None] = {name: None for name in os.environ if name.startswith("WARMSHELL_")}
    return await asyncio.to_thread(_run_captured, argv, env)
