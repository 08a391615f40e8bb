"""The FileService against a real gateway and real bwrap'd sandboxes: round trips, every error
path, and every way out of the sandbox a workload could lay for a file operation.

The attacker is the workload: it plants symlinks, FIFOs and swaps with ordinary commands (an exec),
and the client then asks the gateway to act on those paths. Nothing outside the sandbox may be
read, written or even opened, and what the client creates belongs to the sandbox's uid."""

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
from warmshell.api.v1 import sandbox_pb2_grpc

pytestmark = [needs_bwrap, pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 in /usr")]

NAME = "files"


class Files:
    """The FileService stub of a running gateway, with the sandbox's name filled in."""

    def __init__(self, gw: RunningGateway, name: str = NAME) -> None:
        self.stub = sandbox_pb2_grpc.FileServiceStub(gw.channel)
        self.md = gw.metadata
        self.name = name

    def ref(self, path: str) -> pb.FileRef:
        return pb.FileRef(name=self.name, path=path)

    async def read(self, path: str) -> bytes:
        return b"".join([c.data async for c in self.stub.ReadFile(self.ref(path), metadata=self.md)])

    async def write(self, path: str, data: bytes, *, chunk: int = 64 * 1024, **header: object) -> int:
        call = self.stub.WriteFile(metadata=self.md)
        try:
            await call.write(pb.WriteFileRequest(header=pb.WriteFileHeader(name=self.name, path=path, **header)))  # type: ignore[arg-type]
            for start in range(0, len(data), chunk):
                await call.write(pb.WriteFileRequest(data=data[start : start + chunk]))
            await call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the gateway ended the call early: its status follows
        response = await call
        return response.bytes_written

    async def stat(self, path: str) -> pb.FileInfo:
        return await self.stub.StatFile(self.ref(path), metadata=self.md)

    async def list(self, path: str) -> list[pb.FileInfo]:
        return list((await self.stub.ListFiles(self.ref(path), metadata=self.md)).entries)

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self.stub.RemoveFile(pb.RemoveFileRequest(file=self.ref(path), recursive=recursive), metadata=self.md)

    async def mkdir(self, path: str, parents: bool = False, mode: int = 0) -> pb.FileInfo:
        request = pb.MakeDirectoryRequest(directory=self.ref(path), parents=parents, mode=mode)
        return await self.stub.MakeDirectory(request, metadata=self.md)


async def refused(call: object, code: grpc.StatusCode, *words: str) -> str:
    """Await `call`; it must fail with `code` and a message holding `words`."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() == code, (info.value.code(), info.value.details())
    details = info.value.details() or ""
    for word in words:
        assert word in details, (word, details)
    return details


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state", **{"files.max_file_bytes": 64 * 1024 * 1024}) as running:
        await running.create(name=NAME)
        ready = await running.wait_ready(NAME)
        assert ready.status.phase == pb.SANDBOX_PHASE_READY, ready
        yield running


async def sh(gw: RunningGateway, script: str) -> str:
    code, out, err = await gw.exec(NAME, ["/bin/sh", "-c", script])
    assert code == 0, (script, out, err)
    return out.decode()


# -- round trips -------------------------------------------------------------------------------


async def test_binary_round_trip_seen_by_the_workload(gw: RunningGateway) -> None:
    files = Files(gw)
    data = bytes(range(256)) * 1000 + b"\0\r\n\xff"
    assert await files.write("/workspace/blob.bin", data, chunk=7001) == len(data)
    assert await files.read("/workspace/blob.bin") == data
    # The workload sees the same bytes at the same path.
    assert (await sh(gw, "sha256sum /workspace/blob.bin")).split()[0] == __import__("hashlib").sha256(data).hexdigest()
    info = await files.stat("/workspace/blob.bin")
    assert (info.name, info.type, info.size, info.mode) == ("blob.bin", "file", len(data), 0o644)
    # Replacing keeps the name and leaves no temporary file behind.
    await files.write("/workspace/blob.bin", b"short", mode=0o600)
    assert await files.read("/workspace/blob.bin") == b"short"
    assert [(e.name, e.mode) for e in await files.list("/workspace")] == [("blob.bin", 0o600)]
    assert await files.write("/workspace/empty", b"") == 0
    assert await files.read("/workspace/empty") == b""


async def test_large_file_streams_in_chunks(gw: RunningGateway) -> None:
    files = Files(gw)
    block = os.urandom(1024 * 1024)
    data = block * 20
    assert await files.write("/workspace/big", data, chunk=1024 * 1024 - 64) == len(data)
    chunks = [c.data async for c in files.stub.ReadFile(files.ref("/workspace/big"), metadata=files.md)]
    assert len(chunks) == len(data) // (256 * 1024)  # the configured chunk size
    assert b"".join(chunks) == data


async def test_list_stat_mkdir_remove(gw: RunningGateway) -> None:
    files = Files(gw)
    await sh(gw, "mkdir /workspace/d && echo hi > /workspace/d/f && ln -s f /workspace/d/l && mkfifo /workspace/d/p")
    entries = {e.name: e for e in await files.list("/workspace/d")}
    assert sorted(entries) == ["f", "l", "p"]
    assert (entries["f"].type, entries["f"].size) == ("file", 3)
    assert (entries["l"].type, entries["l"].link_target) == ("symlink", "f")
    assert entries["p"].type == "other"
    assert (await files.stat("/workspace/d/l")).type == "symlink"
    assert (await files.stat("/")).type == "directory"
    # Inside the sandbox a symlink is followed, as the workload would.
    assert await files.read("/workspace/d/l") == b"hi\n"

    made = await files.mkdir("/workspace/a/b/c", parents=True, mode=0o700)
    assert (made.name, made.type, made.mode) == ("c", "directory", 0o700)
    assert (await files.mkdir("/workspace/a/b/c", parents=True)).type == "directory"  # mkdir -p is idempotent
    await files.write("/workspace/x/y/z.txt", b"deep", make_parents=True)
    assert await sh(gw, "cat /workspace/x/y/z.txt") == "deep"

    await files.remove("/workspace/d/l")
    assert await sh(gw, "cat /workspace/d/f") == "hi\n"  # removing a link leaves its target
    await files.remove("/workspace/a", recursive=True)
    await files.remove("/workspace/x/y/z.txt")
    await files.remove("/workspace/x/y")
    assert sorted(e.name for e in await files.list("/workspace")) == ["d", "x"]


async def test_created_files_belong_to_the_sandbox(gw: RunningGateway) -> None:
    files = Files(gw)
    await files.write("/workspace/mine", b"1")
    await files.mkdir("/workspace/dir")
    # The workload (uid 0 of its namespace, its own host uid outside) owns them: it can chmod and
    # rename them, and they show as its own.
    out = await sh(gw, "stat -c '%u %g' /workspace/mine /workspace/dir; chmod 600 /workspace/mine && echo OK")
    assert out.split("\n")[:3] == ["0 0", "0 0", "OK"]


# -- errors name the path and the cause --------------------------------------------------------


async def test_error_paths(gw: RunningGateway) -> None:
    files = Files(gw)
    await sh(gw, "mkdir -p /workspace/dir/sub && echo x > /workspace/file && mkfifo /workspace/fifo")
    nf = grpc.StatusCode.NOT_FOUND
    fp = grpc.StatusCode.FAILED_PRECONDITION
    await refused(files.read("/workspace/missing"), nf, "/workspace/missing", "no such file")
    await refused(files.stat("/workspace/missing"), nf, "/workspace/missing")
    await refused(files.list("/workspace/missing"), nf, "/workspace/missing")
    await refused(files.remove("/workspace/missing"), nf, "/workspace/missing")
    await refused(files.read("/workspace/dir"), fp, "/workspace/dir", "is a directory")
    await refused(files.write("/workspace/dir", b"x"), fp, "/workspace/dir", "is a directory")
    await refused(files.list("/workspace/file"), fp, "/workspace/file", "not a directory")
    await refused(files.remove("/workspace/dir"), fp, "/workspace/dir", "not empty")
    await refused(files.write("/workspace/nodir/f", b"x"), nf, "/workspace/nodir/f")
    await refused(files.mkdir("/workspace/dir"), grpc.StatusCode.ALREADY_EXISTS, "/workspace/dir", "already exists")
    await refused(files.mkdir("/workspace/file", parents=True), grpc.StatusCode.ALREADY_EXISTS, "/workspace/file")
    await refused(files.mkdir("/workspace/no/such"), nf, "/workspace/no/such")
    await refused(files.read("/workspace/fifo"), fp, "/workspace/fifo", "not a regular file")
    # What the workload may not write, neither may the client.
    pd = grpc.StatusCode.PERMISSION_DENIED
    await refused(files.write("/usr/bin/evil", b"x"), pd, "/usr/bin/evil", "read-only")
    await refused(files.write("/etc/passwd", b"x"), pd, "/etc/passwd")
    await refused(files.remove("/"), pd, "/")
    # Bad requests name the field.
    ia = grpc.StatusCode.INVALID_ARGUMENT
    await refused(files.read("relative/path"), ia, "path", "absolute")
    await refused(files.read(""), ia, "path", "empty")
    await refused(files.write("/workspace/m", b"", mode=0o17777), ia, "mode")
    await refused(Files(gw, "nope").read("/workspace/file"), nf)
    # Over the configured size limit: refused, and the partial file is gone.
    await refused(
        files.write("/workspace/huge", b"\0" * (64 * 1024 * 1024 + 1), chunk=512 * 1024),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "/workspace/huge",
    )
    assert "huge" not in await sh(gw, "ls -a /workspace")
    assert ".warmshell" not in await sh(gw, "ls -a /workspace")


async def test_a_sandbox_that_is_not_ready(gw: RunningGateway) -> None:
    await gw.create(name="short", spec=pb.SandboxSpec(command=["/bin/true"]))
    await gw.wait_for("short", lambda s: s.status.HasField("exit_code"))
    await refused(Files(gw, "short").read("/workspace/x"), grpc.StatusCode.FAILED_PRECONDITION, "short", "Ready")


# -- escapes: the workload lays the trap, the client walks into it ----------------------------


def _fingerprint(path: Path) -> tuple[bytes, int, int]:
    st = path.stat()
    return path.read_bytes(), st.st_mtime_ns, st.st_ino


async def test_symlinks_pointing_out_resolve_inside_the_sandbox(gw: RunningGateway, tmp_path: Path) -> None:
    files = Files(gw)
    state = gw.gateway.paths.root
    host_secret = tmp_path / "host-secret"
    host_secret.write_bytes(b"HOST ONLY")
    before = _fingerprint(host_secret)
    await sh(
        gw,
        f"ln -s /etc/shadow /workspace/shadow; ln -s {state} /workspace/state; ln -s {state}/api-token /workspace/tok;"
        f" ln -s {host_secret} /workspace/secret; ln -s / /workspace/root;"
        " ln -s ../../../../../../../../etc/shadow /workspace/up",
    )
    nf = grpc.StatusCode.NOT_FOUND
    assert Path("/etc/shadow").exists()  # on the host: the link would reach it if followed there
    for path in ("/workspace/shadow", "/workspace/tok", "/workspace/secret", "/workspace/up", "/etc/shadow"):
        await refused(files.read(path), nf, path)
    await refused(files.list("/workspace/state"), nf, "/workspace/state")
    await refused(files.read("/workspace/../../../etc/shadow"), nf, "/etc/shadow")
    await refused(files.read(f"/workspace/root{state}/api-token"), nf)
    # An absolute link to / is the sandbox's root, not the host's.
    listing = sorted(e.name for e in await files.list("/workspace/root"))
    assert listing == ["bin", "dev", "etc", "lib", "lib64", "proc", "run", "sbin", "tmp", "usr", "workspace"]
    # Writing through a link that points out replaces the link (inside), never the target.
    await files.write("/workspace/secret", b"overwritten?")
    await files.write("/workspace/shadow", b"overwritten?")
    assert _fingerprint(host_secret) == before
    assert (await files.stat("/workspace/secret")).type == "file"
    # A link to a host directory: a write beneath it lands nowhere on the host.
    await sh(gw, f"ln -s {tmp_path} /workspace/hostdir")
    await refused(files.write("/workspace/hostdir/planted", b"x"), nf, "/workspace/hostdir/planted")
    # mkdir -p meets the dangling link (its target is on the host, not in the sandbox), and says so.
    await refused(
        files.mkdir("/workspace/hostdir/planted", parents=True), nf, "symbolic link on the path points to nothing"
    )
    assert not (tmp_path / "planted").exists()
    # Removing a link that points at the host removes the link only.
    await files.remove("/workspace/tok")
    assert (state / "api-token").exists()
    await refused(files.remove(f"/workspace/root{state}", recursive=True), nf)
    assert (state / "api-token").exists()


async def test_the_workloads_rights_not_the_gateways(gw: RunningGateway) -> None:
    files = Files(gw)
    # Bound into the sandbox from the host, 0710 root:ssl-cert: the workload may not list it,
    # and the gateway (root) must not list it on the workload's behalf either.
    if not Path("/etc/ssl/private").is_dir():
        pytest.skip("no /etc/ssl/private on this host")
    code, _, err = await gw.exec(NAME, ["/bin/ls", "/etc/ssl/private"])
    assert code != 0
    assert "Permission denied" in err.decode()
    await refused(files.list("/etc/ssl/private"), grpc.StatusCode.PERMISSION_DENIED, "/etc/ssl/private")
    await sh(gw, "ln -s /etc/ssl/private /workspace/keys")
    await refused(files.list("/workspace/keys"), grpc.StatusCode.PERMISSION_DENIED)
    # Nor write where only the host's root may.
    await refused(files.write("/etc/ssl/certs/planted.pem", b"x"), grpc.StatusCode.PERMISSION_DENIED)


async def test_fifos_and_device_nodes_are_never_opened(gw: RunningGateway) -> None:
    files = Files(gw)
    await sh(gw, "mkfifo /workspace/fifo; ln -s /dev/tty /workspace/tty; ln -s /dev/zero /workspace/zero")
    fp = grpc.StatusCode.FAILED_PRECONDITION
    async with asyncio.timeout(10):  # a FIFO opened for reading would wait for a writer forever
        await refused(files.read("/workspace/fifo"), fp, "not a regular file")
        for path in ("/dev/zero", "/dev/tty", "/dev/null", "/dev/random", "/workspace/tty", "/workspace/zero"):
            await refused(files.read(path), fp, path, "not a regular file")
        # A write replaces the FIFO with a file rather than opening it (that would block too).
        await files.write("/workspace/fifo", b"data")
    assert await files.read("/workspace/fifo") == b"data"
    assert (await files.stat("/dev/null")).type == "other"


async def test_proc_and_magic_links_are_refused(gw: RunningGateway) -> None:
    files = Files(gw)
    pd = grpc.StatusCode.PERMISSION_DENIED
    # The sandbox's own /proc describes processes the gateway may read more of than the workload
    # (pid 1 is non-dumpable to the workload, not to the gateway): none of it is served.
    for path in ("/proc/1/environ", "/proc/1/cmdline", "/proc/1/mem", "/proc/self/status", "/proc/cpuinfo"):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await files.read(path)
        assert info.value.code() in (pd, grpc.StatusCode.NOT_FOUND), (path, info.value)
    await refused(files.list("/proc"), pd, "/proc")
    await refused(files.list("/proc/1/fd"), pd)
    # Magic links (/proc/<pid>/root, cwd, exe, fd/N) are never followed, however they are reached.
    fp = grpc.StatusCode.FAILED_PRECONDITION
    await refused(files.read("/proc/1/root/etc/passwd"), fp, "symbolic link")
    await refused(files.list("/proc/1/cwd"), fp)
    await sh(gw, "ln -s /proc/1/root /workspace/pid1root; ln -s /proc/self/root /workspace/selfroot")
    await refused(files.list("/workspace/pid1root"), fp, "/workspace/pid1root")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await files.read("/workspace/selfroot/etc/shadow")
    assert info.value.code() in (fp, grpc.StatusCode.NOT_FOUND)
    await refused(files.write("/workspace/pid1root/workspace/x", b"x"), fp)
    await refused(files.write("/proc/1/attr/current", b"x"), pd)
    await refused(files.mkdir("/sys/x"), grpc.StatusCode.NOT_FOUND)  # there is no /sys at all


async def test_a_symlink_swapped_in_during_a_write_changes_nothing_outside(gw: RunningGateway, tmp_path: Path) -> None:
    files = Files(gw)
    host_secret = tmp_path / "host-secret"
    host_secret.write_bytes(b"HOST ONLY")
    before = _fingerprint(host_secret)
    hostdir = tmp_path / "hostdir"
    hostdir.mkdir()
    await sh(gw, "mkdir /workspace/dir && echo old > /workspace/dir/target")
    call = files.stub.WriteFile(metadata=files.md)
    await call.write(pb.WriteFileRequest(header=pb.WriteFileHeader(name=NAME, path="/workspace/dir/target")))
    await call.write(pb.WriteFileRequest(data=b"new content, part 1; "))
    # Mid-write, the workload points the file and then its directory at the host.
    await sh(
        gw,
        f"rm /workspace/dir/target && ln -s {host_secret} /workspace/dir/target &&"
        f" mv /workspace/dir /workspace/moved && ln -s {hostdir} /workspace/dir",
    )
    await call.write(pb.WriteFileRequest(data=b"part 2"))
    await call.done_writing()
    assert (await call).bytes_written == len(b"new content, part 1; part 2")
    # The write went to the directory it resolved at the start (now /workspace/moved), replacing
    # the link planted there; the host saw nothing.
    assert _fingerprint(host_secret) == before
    assert list(hostdir.iterdir()) == []
    assert await sh(gw, "cat /workspace/moved/target") == "new content, part 1; part 2"
    # Meanwhile a read in progress keeps reading the file it opened.
    await files.write("/workspace/r", b"A" * (1024 * 1024))
    stream = files.stub.ReadFile(files.ref("/workspace/r"), metadata=files.md)
    first = await anext(aiter(stream))
    await sh(gw, f"rm /workspace/r && ln -s {host_secret} /workspace/r")
    rest = b"".join([c.data async for c in stream])
    assert first.data + rest == b"A" * (1024 * 1024)


async def test_a_cancelled_write_leaves_nothing(gw: RunningGateway) -> None:
    files = Files(gw)
    await files.write("/workspace/kept", b"old")
    call = files.stub.WriteFile(metadata=files.md)
    await call.write(pb.WriteFileRequest(header=pb.WriteFileHeader(name=NAME, path="/workspace/kept")))
    await call.write(pb.WriteFileRequest(data=b"half of the new content"))
    call.cancel()
    # The gateway notices the cancel, removes its temporary file and keeps the old content.
    async with asyncio.timeout(10):
        while ".warmshell" in await sh(gw, "ls -a /workspace"):
            await asyncio.sleep(0.05)
    assert await files.read("/workspace/kept") == b"old"
    assert sorted(e.name for e in await files.list("/workspace")) == ["kept"]
