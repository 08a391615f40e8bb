"""Attacks through the FileService on a real local sandbox that `drivers_local/test_files.py` does
not already make: `..` and absolute host paths for every operation, hard links, the agent's
binary, very deep paths, and uploads past the workspace's bound.

The client is the attacker here (or a client a workload tricked into asking): nothing outside
the sandbox may be read, written, listed or removed, and a full workspace is an error for the
upload, never a problem for the gateway."""

from __future__ import annotations

import asyncio
import gc
import secrets
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import sandbox, sh, still_real
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.sandboxio import rootfs

pytestmark = [needs_bwrap, pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 in /usr")]

NAME = "files"
ROOT_LISTING = ["bin", "dev", "etc", "lib", "lib64", "proc", "run", "sbin", "tmp", "usr", "workspace"]


class Files:
    """The FileService of a running gateway, for one sandbox."""

    def __init__(self, gw: RunningGateway) -> None:
        self.stub = sandbox_pb2_grpc.FileServiceStub(gw.channel)
        self.md = gw.metadata

    def ref(self, path: str) -> pb.FileRef:
        return pb.FileRef(name=NAME, path=path)

    async def read(self, path: str) -> bytes:
        return b"".join([c.data async for c in self.stub.ReadFile(self.ref(path), metadata=self.md)])

    async def write(self, path: str, data: bytes, *, chunk: int = 256 * 1024, make_parents: bool = False) -> int:
        call = self.stub.WriteFile(metadata=self.md)
        try:
            header = pb.WriteFileHeader(name=NAME, path=path, make_parents=make_parents)
            await call.write(pb.WriteFileRequest(header=header))
            for start in range(0, len(data), chunk):
                await call.write(pb.WriteFileRequest(data=data[start : start + chunk]))
            await call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the gateway ended the call early: its status follows
        return (await call).bytes_written

    async def list(self, path: str) -> list[str]:
        return [e.name for e in (await self.stub.ListFiles(self.ref(path), metadata=self.md)).entries]

    async def stat(self, path: str) -> pb.FileInfo:
        return await self.stub.StatFile(self.ref(path), metadata=self.md)

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self.stub.RemoveFile(pb.RemoveFileRequest(file=self.ref(path), recursive=recursive), metadata=self.md)

    async def mkdir(self, path: str, parents: bool = False) -> pb.FileInfo:
        request = pb.MakeDirectoryRequest(directory=self.ref(path), parents=parents)
        return await self.stub.MakeDirectory(request, metadata=self.md)


async def code_of(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state") as running:
        await sandbox(running, NAME)
        yield running


def _fingerprint(path: Path) -> tuple[bytes, int, int]:
    st = path.stat()
    return path.read_bytes(), st.st_mtime_ns, st.st_ino


async def test_dot_dot_and_host_paths_stay_inside_for_every_operation(gw: RunningGateway, tmp_path: Path) -> None:
    files = Files(gw)
    host_file = tmp_path / "host-file"
    host_file.write_bytes(b"HOST ONLY")
    before = _fingerprint(host_file)
    unique = secrets.token_hex(6)
    up = "/workspace/../../../.."
    nf = grpc.StatusCode.NOT_FOUND
    # A host path, however it is spelled, names a path in the sandbox, where it does not exist.
    for spelling in (str(host_file), f"{up}{host_file}", f"/workspace/..{host_file}", f"//..//{host_file}"):
        assert await code_of(files.read(spelling)) == nf, spelling
        assert await code_of(files.stat(spelling)) == nf, spelling
        assert await code_of(files.remove(spelling)) == nf, spelling
        assert await code_of(files.remove(str(Path(spelling).parent), recursive=True)) == nf, spelling
        assert await code_of(files.write(spelling, b"overwritten?")) == nf, spelling
        assert await code_of(files.list(str(Path(spelling).parent))) == nf, spelling
    assert _fingerprint(host_file) == before
    # What does get made lands in the sandbox's own /tmp, not the host's.
    assert await files.write(f"{up}/tmp/rt-{unique}", b"inside") == len(b"inside")
    await files.mkdir(f"{up}/tmp/rt-dir-{unique}/a/b", parents=True)
    await files.write(f"/workspace/../tmp/rt-parents-{unique}/f", b"x", make_parents=True)
    assert not any(Path("/tmp").glob(f"rt-*{unique}*"))
    assert (await sh(gw, NAME, f"cat /tmp/rt-{unique}; ls -d /tmp/rt-dir-{unique}/a/b"))[1] == (
        f"inside/tmp/rt-dir-{unique}/a/b\n"
    )
    # Up from anywhere is the sandbox's root.
    assert sorted(await files.list(up)) == ROOT_LISTING
    assert sorted(await files.list("/proc/../workspace/../")) == ROOT_LISTING
    await still_real(gw, NAME)


async def test_hard_links_cannot_reach_out_and_writes_never_go_through_one(gw: RunningGateway) -> None:
    files = Files(gw)
    # A hard link to a file the sandbox sees read-only (the host's, or the agent's) would let a
    # write to the link change it: the kernel refuses every one (another mount).
    for target in ("/usr/bin/env", "/etc/hosts", "/etc/passwd", "/run/warmshell/agent"):
        code, _, err = await sh(gw, NAME, f"ln {target} /workspace/link")
        assert code != 0, target
        assert "cross-device" in err or "Operation not permitted" in err, (target, err)
    # Within the workspace a hard link is the workload's own business; a write through the API
    # replaces the name it is given and leaves the other name's content alone.
    await sh(gw, NAME, "echo original > /workspace/a && ln /workspace/a /workspace/b")
    await files.write("/workspace/b", b"replaced")
    assert (await sh(gw, NAME, "cat /workspace/a /workspace/b"))[1] == "original\nreplaced"


async def test_the_agent_cannot_be_replaced_or_removed_through_the_api(gw: RunningGateway) -> None:
    # The agent is a file bound read-only onto the sandbox's writable /run: the workload gets
    # EBUSY replacing or removing it, but the gateway, outside the sandbox's mount namespace,
    # would be let through by the kernel, detaching the mount. Found by this test, fixed in rootfs.
    files = Files(gw)
    agent = "/run/warmshell/agent"
    before = await files.stat(agent)
    mounts = "grep -c ' /run/warmshell/agent ' /proc/self/mountinfo"
    assert (await sh(gw, NAME, mounts))[1] == "1\n"
    assert await code_of(files.write(agent, b"#!/bin/sh\necho FORGED\n")) == grpc.StatusCode.FAILED_PRECONDITION
    assert await code_of(files.remove(agent)) == grpc.StatusCode.FAILED_PRECONDITION
    assert await code_of(files.remove("/run/warmshell", recursive=True)) == grpc.StatusCode.FAILED_PRECONDITION
    assert await code_of(files.remove("/run", recursive=True)) != grpc.StatusCode.OK
    after = await files.stat(agent)
    assert (after.size, after.mtime_ms, after.mode) == (before.size, before.mtime_ms, before.mode)
    assert (await sh(gw, NAME, mounts))[1] == "1\n"
    # The workload's own rights give the same answer.
    assert (await sh(gw, NAME, f"rm -f {agent} || mv /workspace/x {agent}"))[0] != 0
    await still_real(gw, NAME)


async def test_very_deep_paths_get_a_clear_error_not_an_internal_one(gw: RunningGateway) -> None:
    files = Files(gw)
    deep = "/workspace" + "/d" * 2040  # just under the 4096-byte path limit
    calls = {
        "mkdir -p": files.mkdir(deep, parents=True),
        "write, parents": files.write(deep + "/f", b"x", make_parents=True),
        "stat": files.stat(deep),
        "rm -r": files.remove("/workspace/d", recursive=True),
    }
    for label, call in calls.items():
        assert await code_of(call) not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), label
    # A tree the workload made deeper than any path can name: refused cleanly (a removal holds a
    # descriptor per level in the gateway, so it stops at rootfs.MAX_TREE_DEPTH), and one within
    # that depth is removed whole.
    tree = "python3 -c \"import os\nos.chdir('/workspace')\nfor _ in range({}):\n    os.mkdir('{}'); os.chdir('{}')\""
    assert (await sh(gw, NAME, tree.format(3000, "e", "e")))[0] == 0
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await files.remove("/workspace/e", recursive=True)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"deeper than {rootfs.MAX_TREE_DEPTH} levels" in (refused.value.details() or "")
    assert (await sh(gw, NAME, tree.format(rootfs.MAX_TREE_DEPTH - 1, "f", "f")))[0] == 0
    await files.remove("/workspace/f", recursive=True)
    assert "f" not in await files.list("/workspace")
    await still_real(gw, NAME)


def _full(error: grpc.aio.AioRpcError) -> bool:
    """The gateway's answer to an upload the workspace has no room for (a client still sending
    when it comes gets it too: the gateway answers once the client has finished)."""
    return error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "no space left" in (error.details() or "")


async def test_uploads_past_the_workspace_bound_fail_cleanly_and_leave_nothing(tmp_path: Path) -> None:
    settings = {"local.workspace_size": "8Mi", "files.max_file_bytes": 64 * 1024 * 1024}
    async with running_gateway(tmp_path / "state", **settings) as gw:
        await sandbox(gw, NAME)
        files = Files(gw)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await files.write("/workspace/huge", b"\0" * (16 * 1024 * 1024))
        assert _full(refused.value), refused.value
        # Several at once, each within the limit but together past the bound.
        results = await asyncio.gather(
            *(files.write(f"/workspace/part{i}", b"\1" * (3 * 1024 * 1024)) for i in range(4)), return_exceptions=True
        )
        failures = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
        assert failures
        assert all(_full(f) for f in failures), failures
        # No temporary file is left to hold the space, and the workspace is usable again.
        _, listing, _ = await sh(gw, NAME, "ls -A /workspace")
        assert ".warmshell" not in listing
        assert "huge" not in listing
        await sh(gw, NAME, "rm -f /workspace/part*")
        assert await files.write("/workspace/small", b"fine") == 4
        # Nothing of it ever reached the gateway's disk.
        assert sum(p.stat().st_size for p in (tmp_path / "state").rglob("*") if p.is_file()) < 8 * 1024 * 1024
        await still_real(gw, NAME)
        # The failed uploads' request streams (gRPC's async generators, left suspended in the
        # gateway's handlers) are closed when collected: let that finish inside the test.
        gc.collect()
        await asyncio.sleep(0.5)
