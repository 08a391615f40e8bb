"""A gateway that stops gracefully says so: the execs in flight get `exec_drain_seconds` to
finish, a new call meanwhile is refused UNAVAILABLE "gateway stopping", and an exec that could
not finish ends UNAVAILABLE too (a client retries it as after a crash), never as a failed
precondition ("session closed")."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.gateway import listening

Exec = grpc.aio.UnaryStreamCall[pb.ExecSandboxRequest, pb.ExecEvent]


async def _started_exec(
    gw: RunningGateway, script: str
) -> grpc.aio.UnaryStreamCall[pb.ExecSandboxRequest, pb.ExecEvent]:
    """An exec of `script` in sandbox "s", returned once its first line has come out."""
    call = gw.stub.ExecSandbox(pb.ExecSandboxRequest(name="s", command=["sh", "-c", script]), metadata=gw.metadata)
    first = await call.read()
    assert isinstance(first, pb.ExecEvent)
    assert first.stdout == b"started\n"
    return call


async def _refused(gw: RunningGateway) -> grpc.aio.AioRpcError:
    """The error of the first ListSandboxes refused (they are, once the stop has begun)."""
    async with asyncio.timeout(5):
        while True:
            try:
                await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)
            except grpc.aio.AioRpcError as refused:
                return refused
            await asyncio.sleep(0.01)


async def _rest(call: Exec) -> tuple[bytes, int]:
    """The exec's remaining output and its exit code, read to the end of the call."""
    out, code = b"", -1
    while (event := await call.read()) is not grpc.aio.EOF:
        assert isinstance(event, pb.ExecEvent)
        if event.WhichOneof("event") == "exit_code":
            code = event.exit_code
        out += event.stdout
    return out, code


async def test_an_exec_in_flight_finishes_while_new_calls_are_refused(tmp_path: Path) -> None:
    async with running_gateway(tmp_path / "state", exec_drain_seconds=20.0) as gw:
        await gw.create(name="s")
        await gw.wait_ready("s")
        call = await _started_exec(gw, "echo started; sleep 1; echo finished")
        stopping = asyncio.create_task(gw.stop())
        # New calls, on the connection the exec uses, are refused by the gateway, saying why.
        refused = await _refused(gw)
        assert refused.code() == grpc.StatusCode.UNAVAILABLE
        assert refused.details() == listening.STOPPING
        assert not stopping.done(), "the stop waits for the exec"
        assert await _rest(call) == (b"finished\n", 0)
        await stopping


async def test_an_exec_that_cannot_finish_ends_unavailable_when_the_drain_is_over(tmp_path: Path) -> None:
    drain = 1.0
    async with running_gateway(tmp_path / "state", exec_drain_seconds=drain) as gw:
        await gw.create(name="s")
        await gw.wait_ready("s")
        call = await _started_exec(gw, "echo started; exec sleep 600")
        began = time.monotonic()
        stopping = asyncio.create_task(gw.stop())
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await _rest(call)
        took = time.monotonic() - began
        assert await call.code() == ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value.details()
        assert (ended.value.details() or "").startswith(listening.STOPPING)
        assert drain <= took < drain + listening.SHUTDOWN_GRACE_SECONDS
        await stopping
