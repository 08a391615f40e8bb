"""The SDK's `Files` (sync, on a thread with its own channel) and `AsyncFiles` against a real
gateway with real bwrap'd sandboxes: every call, upload/download through local files, and the
`translate` hook the client uses to raise its own errors."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.sdk.files import AsyncFiles, FileInfo, Files

pytestmark = [needs_bwrap, pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 in /usr")]


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code


def translate(exc: grpc.RpcError) -> BaseException:
    assert isinstance(exc, grpc.aio.AioRpcError)
    return Refused(exc.code(), exc.details() or "")


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state") as running:
        await running.create(name="sdk")
        ready = await running.wait_ready("sdk")
        assert ready.status.phase == pb.SANDBOX_PHASE_READY, ready
        yield running


async def test_async_files_every_call(gw: RunningGateway, tmp_path: Path) -> None:
    files = AsyncFiles(gw.channel, "sdk", metadata=gw.metadata, translate=translate, chunk_bytes=4096)
    assert await files.write("/workspace/a/b.py", "print('hi')") == 11  # str, parents created
    assert await files.read("/workspace/a/b.py") == b"print('hi')"
    code, out, _ = await gw.exec("sdk", ["python3", "/workspace/a/b.py"])
    assert (code, out) == (0, b"hi\n")
    info = await files.stat("/workspace/a/b.py")
    assert (info.name, info.type, info.size, info.mode) == ("b.py", "file", 11, 0o644)
    assert [e.name for e in await files.list("/workspace/a")] == ["b.py"]
    assert (await files.mkdir("/workspace/x/y")).type == "directory"
    local = tmp_path / "up.bin"
    local.write_bytes(os.urandom(100_000))
    assert await files.upload(local, "/workspace/x/y/up.bin") == 100_000
    down = tmp_path / "down.bin"
    assert await files.download("/workspace/x/y/up.bin", down) == 100_000
    assert down.read_bytes() == local.read_bytes()
    await files.remove("/workspace/x", recursive=True)
    assert sorted(e.name for e in await files.list("/workspace")) == ["a"]
    with pytest.raises(Refused) as info_:
        await files.read("/workspace/x/y/up.bin")
    assert info_.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(Refused) as info_:
        await files.download("/workspace/missing", tmp_path / "never")
    assert not (tmp_path / "never").exists()
    assert not list(tmp_path.glob(".never*"))


async def test_sync_files_every_call(gw: RunningGateway, tmp_path: Path) -> None:
    target = f"unix://{gw.gateway.paths.socket}"

    def work() -> list[FileInfo]:
        with grpc.insecure_channel(target) as channel:
            files = Files(channel, "sdk", metadata=gw.metadata)
            assert files.write("/workspace/s.txt", b"sync") == 4
            assert files.read("/workspace/s.txt") == b"sync"
            assert files.stat("/workspace/s.txt").size == 4
            files.mkdir("/workspace/d/e")
            local = tmp_path / "l.bin"
            local.write_bytes(b"\x00\xff" * 70_000)
            assert files.upload(local, "/workspace/d/e/l.bin") == 140_000
            assert files.download("/workspace/d/e/l.bin", tmp_path / "back.bin") == 140_000
            assert (tmp_path / "back.bin").read_bytes() == local.read_bytes()
            files.remove("/workspace/d", recursive=True)
            with pytest.raises(grpc.RpcError) as info:  # no translate hook: the RpcError itself
                files.read("/workspace/d")
            assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
            return files.list("/workspace")

    entries = await asyncio.to_thread(work)
    assert [(e.name, e.type) for e in entries] == [("s.txt", "file")]


def test_the_clients_sandbox_handles_carry_files(tmp_path: Path) -> None:
    """`sb.files` on the SDK's own handles (a gateway process, found through its state dir),
    with failures raised as the SDK's named errors."""
    import warmshell
    from tests.helpers.cli import start_gateway

    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required"
    running = start_gateway(tmp_path / "state")
    try:
        with warmshell.Client(state_dir=running.state_dir) as client, client.create(name="handle") as sb:
            sb.files.write("/workspace/a.py", "print(6*7)")
            result = sb.run(["python3", "/workspace/a.py"])
            assert (result.exit_code, result.stdout) == (0, b"42\n")
            assert [e.name for e in sb.files.list("/workspace")] == ["a.py"]
            with pytest.raises(warmshell.NotFound, match="/workspace/nope: no such file"):
                sb.files.read("/workspace/nope")
            with pytest.raises(warmshell.PermissionDenied, match="read-only"):
                sb.files.write("/usr/planted", b"x")

        async def via_async() -> None:
            async with (
                warmshell.AsyncClient(state_dir=running.state_dir) as aclient,
                await aclient.create(name="ahandle") as asb,
            ):
                await asb.files.write("/workspace/b", b"\x00\x01")
                assert await asb.files.read("/workspace/b") == b"\x00\x01"
                with pytest.raises(warmshell.FailedPrecondition, match="is a directory"):
                    await asb.files.read("/workspace")

        asyncio.run(via_async())
    finally:
        assert running.stop() == 0, running.log()
