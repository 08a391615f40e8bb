"""Archive uploads that wait for a file thread hold no other thread meanwhile (real files under a
real directory opened as a sandbox's root): with one file thread and one thread in the event
loop's default executor, three uploads larger than what waits between a stream and its unpacker
all finish. When a waiting upload's writer blocked a default-executor thread on its full pipe,
the running upload's writer found none free once its own pipe filled, and every upload stopped
for good (fifty at once on the gateway's 4 file threads and 6 default ones did)."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from warmshell.core.archives import ArchiveLimits
from warmshell.drivers.local.runtime.files import LocalFiles

BLOB = 6 * 1024 * 1024  # past the 4 MiB a pipe holds
CHUNK = 256 * 1024


def archive(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("blob.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def chunks(data: bytes) -> AsyncIterator[bytes]:
    """As fast as the unpacker takes them: a stream that is never the slow side."""
    for start in range(0, len(data), CHUNK):
        yield data[start : start + CHUNK]


@pytest.mark.timeout(60)
async def test_uploads_waiting_for_the_file_thread_hold_no_thread(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    default = ThreadPoolExecutor(max_workers=1)
    loop.set_default_executor(default)
    root = tmp_path / "root"
    root.mkdir()
    data = os.urandom(BLOB)
    tar = archive(data)
    with ThreadPoolExecutor(max_workers=1) as files_threads:
        files = LocalFiles(lambda: os.open(root, os.O_PATH | os.O_DIRECTORY), None, files_threads)
        limits = ArchiveLimits(max_entries=10, max_bytes=2 * BLOB)
        uploads = [files.write_archive(f"/up-{i}", chunks(tar), limits) for i in range(3)]
        summaries = await asyncio.wait_for(asyncio.gather(*uploads), 45)
    assert [s.bytes_written for s in summaries] == [BLOB] * 3
    assert all((root / f"up-{i}" / "blob.bin").read_bytes() == data for i in range(3))
