"""What forcing a new layer to disk costs, by three ways of doing it, on the image store's
filesystem: the step a durable commit (import, tagged snapshot, pause) takes before its index.

Two layers, each freshly written in every round (after an `os.sync()`, so each way starts from the
same clean state): the tests' Debian minbase root (~170 MB, ~9,000 entries, unpacked by
`tar -x`) and a 200 MB pause's layer (50 files of 4 MB). The ways, in an order rotated from
round to round:

- `syncfs`: one `syncfs(2)` on the filesystem (what `ImageStore.commit` does);
- `fsync_each`: an fsync of every regular file and directory of the layer;
- `start_then_fsync`: `sync_file_range(SYNC_FILE_RANGE_WRITE)` on every file first (writeback
  started for all, as it would be during extraction), then an fsync of each.

Wall time of the sync step and this process's CPU (user + system) around it. `syncfs` also
writes whatever other work on the filesystem had dirty: on a shared host its wall time moves with
that, its CPU does not (the kernel's flusher threads do the writing).

    python bench/layer_sync.py [--rounds 3] [--dir DIR]

`--dir` must be on the filesystem measured (default: a directory under bench/, i.e. the
repository's disk).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness import write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from tests.helpers import debian  # noqa: E402
from warmshell.drivers.local.imagestore.store import sync_filesystem  # noqa: E402

_LIBC = ctypes.CDLL(None, use_errno=True)
_SYNC_FILE_RANGE_WRITE = 2


def _entries(root: Path) -> Iterator[tuple[str, bool]]:
    """(path, is a directory) of every directory and regular file under `root`."""
    for directory, _, files in os.walk(root):
        yield directory, True
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path) and os.path.isfile(path):
                yield path, False


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_each(root: Path) -> None:
    for path, _ in _entries(root):
        _fsync(path)


def start_then_fsync(root: Path) -> None:
    paths = list(_entries(root))
    for path, is_directory in paths:
        if not is_directory:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                _LIBC.sync_file_range(fd, ctypes.c_int64(0), ctypes.c_int64(0), _SYNC_FILE_RANGE_WRITE)
            finally:
                os.close(fd)
    for path, _ in paths:
        _fsync(path)


WAYS: dict[str, Callable[[Path], None]] = {
    "syncfs": sync_filesystem,
    "fsync_each": fsync_each,
    "start_then_fsync": start_then_fsync,
}


def _debian(dest: Path) -> None:
    subprocess.run(["tar", "-x", "-f", str(debian.debian_rootfs_tar()), "-C", str(dest)], check=True)


def _pause(dest: Path) -> None:
    block = os.urandom(4 << 20)
    for number in range(50):
        (dest / f"file{number}").write_bytes(block[number:] + block[:number])


LAYERS: dict[str, Callable[[Path], None]] = {"debian": _debian, "pause_200mb": _pause}


def measure(rounds: int, work: Path) -> dict[str, dict[str, list[dict[str, float]]]]:
    samples: dict[str, dict[str, list[dict[str, float]]]] = {layer: {way: [] for way in WAYS} for layer in LAYERS}
    order = list(WAYS)
    for number in range(rounds):
        rotated = order[number % len(order) :] + order[: number % len(order)]
        for layer, write in LAYERS.items():
            for way in rotated:
                os.sync()
                dest = work / f"{layer}-{way}-{number}"
                dest.mkdir()
                write(dest)
                before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                WAYS[way](dest)
                wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
                cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                samples[layer][way].append({"wall_s": wall, "cpu_s": cpu})
                print(f"{layer} {way}: wall {wall * 1000:.0f} ms, cpu {cpu * 1000:.0f} ms", flush=True)
    return samples


def table(samples: dict[str, dict[str, list[dict[str, float]]]]) -> str:
    lines = [
        "| layer | way | wall p50 | wall min | CPU p50 |",
        "|---|---|---|---|---|",
    ]
    for layer, ways in samples.items():
        for way, runs in ways.items():
            walls = [run["wall_s"] * 1000 for run in runs]
            cpus = [run["cpu_s"] * 1000 for run in runs]
            lines.append(
                f"| {layer} | `{way}` | {statistics.median(walls):.0f} ms | {min(walls):.0f} ms "
                f"| {statistics.median(cpus):.0f} ms |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="layer-sync-", dir=args.dir))
    try:
        samples = measure(args.rounds, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    data: dict[str, Any] = {"rounds": args.rounds, "samples": samples}
    write_results("layer_sync", data, table(samples))


if __name__ == "__main__":
    main()
