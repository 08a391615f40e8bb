"""Gateway memory while files stream through it (issue 15): a 1 GiB upload and download must
work with flat memory.

A real `warmshell gateway start` process with the local driver, one real sandbox; the client is
this process (the SDK's `AsyncFiles`). For each size: the gateway's resident set before, and its
peak (VmHWM, reset through /proc/<pid>/clear_refs before each phase) during the upload and during
the download, with the throughput; the downloaded bytes are checked against the uploaded ones.
Flat memory means the peak does not grow with the size.

    python bench/files.py [--sizes-mib 16,256,1024]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from harness import gateway_process, write_results

from warmshell.sdk.files import CHUNK_BYTES, AsyncFiles

MIB = 1024 * 1024


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def _content(size: int, digest: hashlib._Hash) -> Iterator[bytes]:
    block = os.urandom(CHUNK_BYTES)
    sent = 0
    while sent < size:
        piece = block[: min(CHUNK_BYTES, size - sent)]
        digest.update(piece)
        sent += len(piece)
        yield piece


async def measure(sizes_mib: list[int]) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = []
    async with gateway_process() as gw:
        pid = gw.process.pid
        await gw.create(name="files")
        await gw.wait_ready("files")
        files = AsyncFiles(gw.channel, "files", metadata=gw.metadata)
        for size_mib in sizes_mib:
            size = size_mib * MIB
            before = _status_kib(pid, "VmRSS")
            _reset_peak(pid)
            sent = hashlib.sha256()
            start = time.perf_counter()
            written = await files.write_chunks("/workspace/blob", _content(size, sent))
            upload_s = time.perf_counter() - start
            assert written == size, (written, size)
            upload_peak = _status_kib(pid, "VmHWM")
            _reset_peak(pid)
            got = hashlib.sha256()
            received = 0
            start = time.perf_counter()
            async for chunk in files.read_chunks("/workspace/blob"):
                got.update(chunk)
                received += len(chunk)
            download_s = time.perf_counter() - start
            download_peak = _status_kib(pid, "VmHWM")
            assert (received, got.hexdigest()) == (size, sent.hexdigest()), "the download differs"
            await files.remove("/workspace/blob")
            rows.append(
                {
                    "size_mib": size_mib,
                    "rss_before_mib": before / 1024,
                    "upload_peak_mib": upload_peak / 1024,
                    "download_peak_mib": download_peak / 1024,
                    "upload_mib_s": size_mib / upload_s,
                    "download_mib_s": size_mib / download_s,
                }
            )
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", default="16,256,1024")
    args = parser.parse_args()
    rows = asyncio.run(measure([int(s) for s in args.sizes_mib.split(",")]))
    lines = [
        "| size | gateway RSS before | peak during upload | peak during download | upload | download |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['size_mib']:.0f} MiB | {r['rss_before_mib']:.1f} MiB | {r['upload_peak_mib']:.1f} MiB"
            f" | {r['download_peak_mib']:.1f} MiB | {r['upload_mib_s']:.0f} MiB/s | {r['download_mib_s']:.0f} MiB/s |"
        )
    note = (
        "\n\nShared machine (2 cores, other engineers' tests running): throughput is indicative only;"
        " the memory columns are what this measures. Chunks of 256 KiB both ways.\n"
    )
    write_results("files", {"rows": rows}, "\n".join(lines) + note)


if __name__ == "__main__":
    main()
