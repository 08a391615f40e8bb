"""Exec output is flow-controlled end to end: a slow reader slows the command, never loses bytes,
and a reader that stops for longer than the stall timeout gets an explicit error (real gateway,
real bwrap'd sandbox)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from warmshell.api.v1 import sandbox_pb2 as pb

TOTAL = 200_000_000
# Random bytes to stdout, their sha256 to stderr at the end (the host's python3, in the sandbox).
CHECKSUMMED = """
import hashlib, os, sys
digest, left = hashlib.sha256(), int(sys.argv[1])
while left:
    block = os.urandom(min(left, 1 << 20))
    digest.update(block)
    sys.stdout.buffer.write(block)
    left -= len(block)
sys.stdout.flush()
sys.stderr.write(digest.hexdigest())
"""
WINDOW = 1024 * 1024


def queued_bytes(gw: RunningGateway) -> int:
    """Output the gateway holds for execs right now (test introspection)."""
    sessions = gw.gateway.parts.sessions._sessions.values()
    return sum(channel.in_flight for session in sessions for channel in session.execs.values())


async def wait_no_exec(gw: RunningGateway, timeout: float) -> None:
    """Until no session has an exec open (the gateway ended or gave up every one)."""
    async with asyncio.timeout(timeout):
        while any(session.execs for session in gw.gateway.parts.sessions._sessions.values()):
            await asyncio.sleep(0.05)


async def test_a_pausing_reader_gets_every_byte_of_200mb(tmp_path: Path) -> None:
    async with running_gateway(tmp_path / "state", exec_output_window_bytes=WINDOW) as gw:
        await gw.create(name="flood")
        assert (await gw.wait_ready("flood")).status.phase == pb.SANDBOX_PHASE_READY
        request = pb.ExecSandboxRequest(name="flood", command=["/usr/bin/python3", "-c", CHECKSUMMED, str(TOTAL)])
        digest, received, err, code = hashlib.sha256(), 0, b"", None
        next_pause, held = 25_000_000, []
        async for event in gw.stub.ExecSandbox(request, metadata=gw.metadata):
            kind = event.WhichOneof("event")
            if kind == "stdout":
                digest.update(event.stdout)
                received += len(event.stdout)
                if received >= next_pause:
                    next_pause += 50_000_000
                    await asyncio.sleep(2.0)  # the reader pauses; the command must wait for it
                    held.append(queued_bytes(gw))
            elif kind == "stderr":
                err += event.stderr
            else:
                code = event.exit_code
        assert code == 0, err
        assert received == TOTAL, err
        assert err.split()[0].decode() == digest.hexdigest()
        # While the reader paused, the gateway held at most the window (nothing piled up, or was dropped).
        assert len(held) == 4
        assert all(0 < size <= WINDOW for size in held), held


async def test_a_reader_that_stops_gets_an_error_not_an_exit_status(tmp_path: Path) -> None:
    async with running_gateway(tmp_path / "state", exec_stall_timeout_seconds=1.0) as gw:
        await gw.create(name="stall")
        assert (await gw.wait_ready("stall")).status.phase == pb.SANDBOX_PHASE_READY
        request = pb.ExecSandboxRequest(name="stall", command=["/bin/sh", "-c", "head -c 100000000 /dev/zero"])
        received, codes = 0, []

        async def read_slowly() -> None:
            nonlocal received
            async for event in gw.stub.ExecSandbox(request, metadata=gw.metadata):
                if event.WhichOneof("event") == "exit_code":
                    codes.append(event.exit_code)
                received += len(event.stdout)
                if received and not codes:
                    # Gone until the gateway has given the exec up (its stall timeout, 1 s).
                    await wait_no_exec(gw, timeout=30.0)
                    codes.append(-999)  # paused once only

        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await read_slowly()
        assert failure.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "read none of the exec's output for 1s" in (failure.value.details() or "")
        assert "output is incomplete" in (failure.value.details() or "")
        assert received < 100_000_000
        assert codes == [-999]  # no exit status ever arrived
        # The command was killed: the sandbox runs execs again, and holds nothing for the old one.
        start = time.monotonic()
        code, out, _ = await gw.exec("stall", ["echo", "after"])
        assert (code, out) == (0, b"after\n")
        assert time.monotonic() - start < 10
        assert queued_bytes(gw) == 0
