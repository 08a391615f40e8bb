"""Files in bulk through a real gateway and real bwrap'd sandboxes, on both clients: a directory
up and back in one call each (modes, symbolic links, mtimes kept), several in-memory files in one
call, a caller's own tar streamed both ways, and the refusals a client sees."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.sdk.files import AsyncFiles, Files, TransferSummary

pytestmark = [needs_bwrap, pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 in /usr")]

OLD = 1_500_000_000  # an mtime far from now: preserved, not merely recent


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state") as running:
        await running.create(name="bulk")
        ready = await running.wait_ready("bulk")
        assert ready.status.phase == pb.SANDBOX_PHASE_READY, ready
        yield running


def make_repo(root: Path) -> dict[str, bytes]:
    """A small repository: nested files, an executable, a link, an empty directory, a 1 MiB blob."""
    files = {
        "README.md": b"# repo\n",
        "src/pkg/__init__.py": b"",
        "src/pkg/main.py": b"print('main')\n",
        "bin/run.sh": b"#!/bin/sh\necho run\n",
        "data/blob.bin": os.urandom(1024 * 1024),
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "bin/run.sh").chmod(0o750)
    (root / "empty").mkdir()
    (root / "src/pkg/link.py").symlink_to("main.py")
    os.utime(root / "README.md", (OLD, OLD))
    return files


def assert_same_tree(original: Path, copy: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        assert (copy / name).read_bytes() == data, name
    assert (copy / "bin/run.sh").stat().st_mode & 0o777 == 0o750
    assert int((copy / "README.md").stat().st_mtime) == OLD
    assert os.readlink(copy / "src/pkg/link.py") == "main.py"
    assert (copy / "empty").is_dir()
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*")) == sorted(
        p.relative_to(original).as_posix() for p in original.rglob("*")
    )


async def test_async_directory_up_and_back_in_one_call_each(gw: RunningGateway, tmp_path: Path) -> None:
    files = AsyncFiles(gw.channel, "bulk", metadata=gw.metadata, chunk_bytes=64 * 1024)
    repo = tmp_path / "repo"
    contents = make_repo(repo)
    summary = await files.upload_dir(repo, "/workspace/repo")
    assert summary == TransferSummary(entries=11, bytes_written=sum(map(len, contents.values())))
    # The workload sees what was sent: the executable runs, the link resolves, the mtime holds.
    code, out, _ = await gw.exec("bulk", ["sh", "-c", "cd /workspace/repo && bin/run.sh && cat src/pkg/link.py"])
    assert (code, out) == (0, b"run\nprint('main')\n")
    assert (await files.stat("/workspace/repo/README.md")).mtime_ms == OLD * 1000
    back = tmp_path / "back"
    assert await files.download_dir("/workspace/repo", back) == summary
    assert_same_tree(repo, back, contents)


async def test_async_write_files_and_own_tar_streams(gw: RunningGateway, tmp_path: Path) -> None:
    files = AsyncFiles(gw.channel, "bulk", metadata=gw.metadata)
    summary = await files.write_files({"/workspace/w/a.txt": "a", "/workspace/w/deep/b.txt": b"bb"}, mode=0o600)
    assert summary.bytes_written == 3
    assert await files.read("/workspace/w/deep/b.txt") == b"bb"
    assert (await files.stat("/workspace/w/a.txt")).mode == 0o600

    async def chunks() -> AsyncIterator[bytes]:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            info = tarfile.TarInfo("t/x")
            info.size = 3
            archive.addfile(info, io.BytesIO(b"xyz"))
        data = buffer.getvalue()
        for start in range(0, len(data), 1000):
            yield data[start : start + 1000]

    assert (await files.upload_tar(chunks(), "/workspace/own")).entries == 1
    downloaded = b"".join([c async for c in files.download_tar("/workspace/own")])
    with tarfile.open(fileobj=io.BytesIO(downloaded)) as archive:
        assert [(m.name, archive.extractfile(m).read()) for m in archive if m.isfile()] == [("t/x", b"xyz")]  # type: ignore[union-attr]
    # One file downloads as a one-entry archive named by its base name.
    single = b"".join([c async for c in files.download_tar("/workspace/w/a.txt")])
    with tarfile.open(fileobj=io.BytesIO(single)) as archive:
        assert archive.getnames() == ["a.txt"]


async def test_refusals_name_the_entry_and_the_rule(gw: RunningGateway, tmp_path: Path) -> None:
    files = AsyncFiles(gw.channel, "bulk", metadata=gw.metadata)
    with pytest.raises(grpc.RpcError) as info:
        await files.upload_tar(io.BytesIO(b"this is not a tar archive" * 100), "/workspace/x")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "archive" in (info.value.details() or "")  # type: ignore[attr-defined]
    with pytest.raises(grpc.RpcError) as info:
        await files.download_tar("/workspace/missing").__anext__()
    assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    with pytest.raises(NotADirectoryError):
        await files.upload_dir(tmp_path / "nothing-here", "/workspace/x")
    with pytest.raises(ValueError, match="absolute"):
        await files.write_files({"relative.txt": "x"})


async def test_sync_directory_up_and_back(gw: RunningGateway, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    contents = make_repo(repo)
    target = f"unix://{gw.gateway.paths.socket}"

    def work() -> None:
        with grpc.insecure_channel(target) as channel:
            files = Files(channel, "bulk", metadata=gw.metadata)
            assert files.upload_dir(repo, "/workspace/sync").entries == 11
            assert files.write_files({"/workspace/sync/extra/n.txt": b"n"}).entries == 1
            with open(tmp_path / "own.tar", "wb") as out:
                for chunk in files.download_tar("/workspace/sync/src"):
                    out.write(chunk)
            with open(tmp_path / "own.tar", "rb") as archive:
                assert files.upload_tar(archive, "/workspace/again").entries == 4
            assert files.read("/workspace/again/pkg/main.py") == contents["src/pkg/main.py"]
            assert files.download_dir("/workspace/sync", tmp_path / "back").entries == 13

    await asyncio.to_thread(work)
    back = tmp_path / "back"
    assert (back / "extra/n.txt").read_bytes() == b"n"
    shutil.rmtree(back / "extra")
    assert_same_tree(repo, back, contents)
