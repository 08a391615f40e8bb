"""Files and interactive execs on the Kubernetes driver (kubesim): a real gateway whose sandboxes
are pods running the real supervisor, which serves file operations in the workload container's
filesystem (under its agent's root, never the supervisor's own) over its session and runs
commands on a pseudo-terminal of the pod.

kubesim's container view is the host's tree in a mount namespace (see podshim), so "outside the
container" cannot be shown by a host path here; what is checked is what the supervisor's
confinement refuses in any container: `..` resolving at the container's root, links into /proc
(another process's memory and environment), and magic links like /proc/self/root."""

from __future__ import annotations

import asyncio
import io
import os
import re
import tarfile
from pathlib import Path

import pytest

import warmshell
from tests.helpers.gateway import RunningGateway
from warmshell.drivers.kubernetes import rendering


async def test_files_through_the_pods_supervisor(gw: RunningGateway) -> None:
    async with warmshell.AsyncClient(state_dir=gw.gateway.config.state_dir) as client:
        sb = await client.create(name="files", ready_timeout=60)
        try:
            await sb.files.write("/workspace/dir/a.txt", b"hello pod\n")  # parents made
            assert await sb.files.read("/workspace/dir/a.txt") == b"hello pod\n"
            ran = await sb.run(["cat", "/workspace/dir/a.txt"])
            assert ran.stdout == b"hello pod\n"  # the workload sees what was written
            entries = await sb.files.list("/workspace/dir")
            assert [(e.name, e.type, e.size) for e in entries] == [("a.txt", "file", 10)]
            info = await sb.files.stat("/workspace/dir/a.txt")
            assert (info.type, info.size, info.mode) == ("file", 10, 0o644)
            # Several chunks each way (the gateway's chunk is 256 KiB), byte for byte.
            big = os.urandom(5 * 1024 * 1024 + 3)
            await sb.files.write("/workspace/big.bin", big)
            assert await sb.files.read("/workspace/big.bin") == big
            made = await sb.files.mkdir("/workspace/m/n", parents=True)
            assert made.type == "directory"
            await sb.files.remove("/workspace/dir", recursive=True)
            with pytest.raises(warmshell.NotFound, match="/workspace/dir"):
                await sb.files.stat("/workspace/dir/a.txt")
            with pytest.raises(warmshell.FailedPrecondition, match="is a directory"):
                await sb.files.read("/workspace/m")
        finally:
            await sb.delete()


async def test_files_are_the_workload_containers_outside_the_workspace_too(gw: RunningGateway) -> None:
    """kubesim gives each container its own overlay over `/`: a file made at the top of the
    workload's root exists there alone, and the supervisor's token directory is empty there."""
    async with warmshell.AsyncClient(state_dir=gw.gateway.config.state_dir) as client:
        sb = await client.create(name="outside", ready_timeout=60)
        try:
            made = await sb.run(["sh", "-c", "echo only in the workload > /workload-only"])
            assert made.exit_code == 0, made.stderr
            assert await sb.files.read("/workload-only") == b"only in the workload\n"
            await sb.files.write("/written-by-the-api", b"outside /workspace\n")
            ran = await sb.run(["cat", "/written-by-the-api"])
            assert ran.stdout == b"outside /workspace\n", ran.stderr
            # The agent's directory is mounted into the workload's container only.
            agent = await sb.files.stat(rendering.AGENT_COMMAND[0])
            assert agent.type == "file"
            with pytest.raises(warmshell.NotFound):
                await sb.files.read(rendering.TOKEN_PATH)
        finally:
            await sb.delete()


async def test_escapes_from_the_container_are_refused(gw: RunningGateway) -> None:
    async with warmshell.AsyncClient(state_dir=gw.gateway.config.state_dir) as client:
        sb = await client.create(name="escape", ready_timeout=60)
        try:
            await sb.files.write("/workspace/real", b"inside")
            # `..` above the root stays at the root: this names /workspace/real.
            assert await sb.files.read("/workspace/../../../../workspace/real") == b"inside"
            # Links the workload plants: into /proc (the supervisor's own environment and memory),
            # through a magic link, and an absolute one that climbs (resolved in the root).
            planted = await sb.run(
                [
                    "sh",
                    "-c",
                    "ln -s /proc/1/environ /workspace/env; ln -s /proc/self/root/etc/hostname /workspace/magic;"
                    " ln -s /../../../workspace/real /workspace/climb",
                ]
            )
            assert planted.exit_code == 0, planted.stderr
            for path in ("/workspace/env", "/proc/1/environ", "/proc/1/mem"):
                with pytest.raises(warmshell.PermissionDenied):
                    await sb.files.read(path)
            # (NotFound: the workload's /proc has no "self" for the supervisor, a process of
            # another PID namespace.)
            with pytest.raises((warmshell.PermissionDenied, warmshell.FailedPrecondition, warmshell.NotFound)):
                await sb.files.read("/workspace/magic")
            assert await sb.files.read("/workspace/climb") == b"inside"
            with pytest.raises(warmshell.PermissionDenied):
                await sb.files.write("/proc/1/attr/current", b"x")
            # Stat reports a link without following it.
            link = await sb.files.stat("/workspace/env")
            assert (link.type, link.link_target) == ("symlink", "/proc/1/environ")
        finally:
            await sb.delete()


async def test_a_pty_and_streamed_stdin_in_a_pod(gw: RunningGateway) -> None:
    async with warmshell.AsyncClient(state_dir=gw.gateway.config.state_dir) as client:
        sb = await client.create(name="tty", ready_timeout=60)
        try:
            async with await sb.pty(["sh"], rows=21, columns=77) as shell:
                await shell.send("tty; stty size; sleep 100\n")
                seen = b""
                while b"21 77" not in seen:
                    event = await asyncio.wait_for(shell.recv(), 30)
                    assert event is not None, (seen, shell.exit_code)
                    seen += event.stdout + event.stderr
                assert re.search(rb"/dev/pts/\d+", seen), seen
                await asyncio.sleep(0.5)
                await shell.send(b"\x03")
                await shell.resize(30, 100)
                await shell.send("stty size; exit 6\n")
                async for event in shell:
                    seen += event.stdout
                assert b"30 100" in seen
                assert shell.exit_code == 6
            data = os.urandom(3 * 1024 * 1024)
            r = await sb.run(["wc", "-c"], stdin=[data[i : i + 65536] for i in range(0, len(data), 65536)])
            assert r.stdout.strip() == str(len(data)).encode()
        finally:
            await sb.delete()


async def test_bulk_files_through_the_pods_supervisor(gw: RunningGateway, tmp_path: Path) -> None:
    """A directory up and back in one call each, unpacked and packed inside the pod (modes,
    links, mtimes kept); a hostile entry refused there, naming the rule."""
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    blob = os.urandom(3 * 1024 * 1024 + 5)  # several chunks and credits each way
    (repo / "src" / "blob.bin").write_bytes(blob)
    (repo / "run.sh").write_bytes(b"#!/bin/sh\necho ran\n")
    (repo / "run.sh").chmod(0o755)
    os.utime(repo / "run.sh", (1_500_000_000, 1_500_000_000))
    (repo / "link").symlink_to("src/blob.bin")
    async with warmshell.AsyncClient(state_dir=gw.gateway.config.state_dir) as client:
        sb = await client.create(name="bulk", ready_timeout=60)
        try:
            summary = await sb.files.upload_dir(repo, "/workspace/repo")
            assert (summary.entries, summary.bytes_written) == (4, len(blob) + 19)
            ran = await sb.run(["sh", "-c", "/workspace/repo/run.sh && wc -c < /workspace/repo/link"])
            assert ran.stdout.split() == [b"ran", str(len(blob)).encode()]
            back = tmp_path / "back"
            assert await sb.files.download_dir("/workspace/repo", back) == summary
            assert (back / "src" / "blob.bin").read_bytes() == blob
            assert os.readlink(back / "link") == "src/blob.bin"
            assert ((back / "run.sh").stat().st_mode & 0o777, int((back / "run.sh").stat().st_mtime)) == (
                0o755,
                1_500_000_000,
            )
            hostile = io.BytesIO()
            with tarfile.open(fileobj=hostile, mode="w") as archive:
                info = tarfile.TarInfo("../escape")
                archive.addfile(info, io.BytesIO(b""))
            hostile.seek(0)
            with pytest.raises(warmshell.InvalidArgument, match=r"'\.\.' component"):
                await sb.files.upload_tar(hostile, "/workspace/repo")
        finally:
            await sb.delete()
