"""The gateway's own files and sockets: a state dir that others could write is refused at start;
what the gateway creates is private; supervisor.sock serves no public API; a flood of
connections is refused at accept instead of using up the gateway's descriptors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.core.config import load_config
from warmshell.core.errors import FailedPreconditionError
from warmshell.gateway import listening
from warmshell.gateway.server import Gateway


async def test_a_world_writable_state_dir_is_refused_and_nothing_is_created_in_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    gateway = Gateway(load_config(None, {"state_dir": str(state), "http_port": 0}))
    with pytest.raises(FailedPreconditionError, match=f"state dir {state} is group- or world-writable"):
        await gateway.start()
    assert list(state.iterdir()) == [], "no secret was written into an untrusted dir"


async def test_everything_the_gateway_creates_is_private(tmp_path: Path) -> None:
    state = tmp_path / "deep" / "state"
    previous = os.umask(0o002)  # a permissive operator umask must not leak into the state dir
    try:
        async with running_gateway(state) as gw:
            paths = gw.gateway.paths
            assert stat.S_IMODE(state.stat().st_mode) == 0o700
            assert stat.S_IMODE(state.parent.stat().st_mode) == 0o700
            created = [paths.api_token, paths.signing_key, paths.database, paths.runtime_info, state / "gateway-id"]
            for path in [*created, paths.socket, paths.supervisor_socket]:
                mode = stat.S_IMODE(path.stat().st_mode)
                assert mode & 0o077 == 0, f"{path.name} is {mode:04o}"
            for path in sorted(state.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    mode = stat.S_IMODE(path.stat().st_mode)
                    assert mode & 0o077 == 0, f"{path.relative_to(state)} is {mode:04o}"
            assert os.umask(0o002) == 0o002, "the gateway restored the process umask"
    finally:
        os.umask(previous)


async def test_the_supervisor_socket_serves_no_public_api(gw: RunningGateway) -> None:
    socket_path = gw.gateway.paths.supervisor_socket
    async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)  # a leaked API token
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert (await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)) is not None


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_connection_flood_on_the_supervisor_socket_is_bounded(tmp_path: Path) -> None:
    limit = listening.MIN_CONNECTIONS
    flood = 400
    async with running_gateway(tmp_path / "state", max_connections=limit) as gw:
        await gw.create(name="victim")
        await gw.wait_ready("victim")
        path = str(gw.gateway.paths.supervisor_socket)
        before = _fds()
        held: list[socket.socket] = []
        try:
            for _ in range(flood):
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    conn.connect(path)
                held.append(conn)

            def closed_by_gateway() -> int:
                count = 0
                for conn in held:
                    with contextlib.suppress(BlockingIOError):
                        count += conn.recv(1, socket.MSG_PEEK) == b""
                return count

            async with asyncio.timeout(20):
                while closed_by_gateway() < flood - limit:
                    await asyncio.sleep(0.05)
            # The gateway (this process) holds at most `limit` descriptors for the flood.
            assert _fds() - before - flood <= limit
            # The public API, the sandbox's live session and its exec are untouched.
            listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)
            assert [s.name for s in listed.sandboxes] == ["victim"]
            assert await gw.exec("victim", ["echo", "REAL"]) == (0, b"REAL\n", b"")
        finally:
            for conn in held:
                conn.close()
