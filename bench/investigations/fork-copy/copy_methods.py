"""Issue 31: what does a fork's copy of a 200 MB file from a sandbox's tmpfs into the image store
(ext4) cost by method on this host, and what would not copying (a link or a rename within one
tmpfs) cost instead?

    python bench/investigations/fork-copy/copy_methods.py [--mb 200] [--rounds 12] [--target DIR]

A file of `--mb` MB of random bytes on /dev/shm (a tmpfs, as a sandbox's /workspace is) is copied
into a new file under `--target` (ext4 here, the store's filesystem) by each method in turn, the
order shuffled every round; the copy is deleted after each (as a fork's prune deletes its layer),
its deletion timed apart. Per method: wall ms, the copying thread's CPU ms (user and system: the
kernel's part of the copy runs in this thread's system calls; the later writeback of the dirty
pages runs in the kernel's flusher threads and is not counted, as it is not in a fork's call) and
its wait for a CPU (schedstat). Methods:

- `copy_file_range`: the kernel's own copy (EXDEV between tmpfs and ext4 since Linux 5.19, then
  `capture._copy_across`'s splice: what `capture` does today, `fallocate` first);
- `splice_64k` / `splice_1m`: through a pipe of that size (`F_SETPIPE_SZ`), no `fallocate`;
- `splice_1m_fallocate`: the same with `posix_fallocate` of the target first (capture's path);
- `sendfile`, `sendfile_fallocate`;
- `rw_1m` / `rw_8m`: `readv` into one reused buffer and `write` (two copies through user space);
- `mmap_write`: the source mapped and `write` from it (one copy, page faults on the source);
- `splice_1m_fadvise`: capture's path plus `posix_fadvise(SEQUENTIAL)` on the source and
  `fadvise(NOREUSE)` on the target;
- `tmpfs_copy`: capture's path into a second file on the same tmpfs (the store on tmpfs);
- `overwrite_cached`: capture's splice into a file of the same size kept from the round before
  (its pages in the page cache, its blocks allocated; not deleted): what recycling a pruned fork
  layer's file would cost;
- `tmpfs_link` / `tmpfs_rename`: a hard link / a rename within the tmpfs (what not copying costs).
"""

from __future__ import annotations

import argparse
import fcntl
import mmap
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness

from harness import summary, write_results

from warmshell.drivers.local.imagestore import capture


def waited_ms() -> float:
    """How long the calling thread has waited on a run queue for a CPU (its schedstat), ms."""
    return int(Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").read_text().split()[1]) / 1e6


def _splice(pipe_bytes: int) -> Callable[[int, int, int], None]:
    def run(src: int, dst: int, size: int) -> None:
        pipe_out, pipe_in = os.pipe2(os.O_CLOEXEC)
        try:
            fcntl.fcntl(pipe_in, fcntl.F_SETPIPE_SZ, pipe_bytes)
            done = 0
            while done < size:
                got = os.splice(src, pipe_in, min(size - done, pipe_bytes), offset_src=done)
                written = 0
                while written < got:
                    written += os.splice(pipe_out, dst, got - written)
                done += got
        finally:
            os.close(pipe_out)
            os.close(pipe_in)

    return run


def _sendfile(src: int, dst: int, size: int) -> None:
    done = 0
    while done < size:
        done += os.sendfile(dst, src, done, size - done)


def _rw(chunk: int) -> Callable[[int, int, int], None]:
    def run(src: int, dst: int, size: int) -> None:
        view = memoryview(bytearray(chunk))
        done = 0
        while done < size:
            got = os.readv(src, [view[: min(chunk, size - done)]])
            written = 0
            while written < got:
                written += os.write(dst, view[written:got])
            done += got

    return run


def _mmap_write(src: int, dst: int, size: int) -> None:
    with mmap.mmap(src, size, prot=mmap.PROT_READ) as mapped:
        view = memoryview(mapped)
        try:
            done = 0
            while done < size:
                done += os.write(dst, view[done : min(size, done + (8 << 20))])
        finally:
            view.release()


def _capture_path(src: int, dst: int, size: int) -> None:
    os.posix_fallocate(dst, 0, size)
    capture._copy_in_kernel(src, dst, size)


def _fallocated(copy: Callable[[int, int, int], None]) -> Callable[[int, int, int], None]:
    def run(src: int, dst: int, size: int) -> None:
        os.posix_fallocate(dst, 0, size)
        copy(src, dst, size)

    return run


def _fadvised(src: int, dst: int, size: int) -> None:
    os.posix_fadvise(src, 0, size, os.POSIX_FADV_SEQUENTIAL)
    os.posix_fadvise(dst, 0, size, os.POSIX_FADV_NOREUSE)
    _capture_path(src, dst, size)


COPIES: dict[str, Callable[[int, int, int], None]] = {
    "copy_file_range": _capture_path,
    "splice_64k": _splice(64 << 10),
    "splice_1m": _splice(1 << 20),
    "splice_1m_fallocate": _fallocated(_splice(1 << 20)),
    "sendfile": _sendfile,
    "sendfile_fallocate": _fallocated(_sendfile),
    "rw_1m": _rw(1 << 20),
    "rw_8m": _rw(8 << 20),
    "mmap_write": _mmap_write,
    "splice_1m_fadvise": _fadvised,
    "tmpfs_copy": _capture_path,
    "overwrite_cached": _splice(1 << 20),
}


def cross_fs_copy_file_range(source: Path, directory: Path) -> str:
    """What `copy_file_range` answers from the tmpfs to `directory`'s filesystem."""
    target = directory / "probe"
    src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        return f"{os.copy_file_range(src, dst, 1 << 20)} bytes copied"
    except OSError as exc:
        return f"refused: {os.strerror(exc.errno or 0)} (errno {exc.errno})"
    finally:
        os.close(src)
        os.close(dst)
        target.unlink()


def one(name: str, source: Path, target: Path) -> tuple[float, float, float, float]:
    """One copy (or link, or rename) of `source` as `target`, then its deletion: (wall ms, CPU ms,
    wait for a CPU ms, deletion CPU ms)."""
    size = source.stat().st_size
    wall, cpu, waited = time.perf_counter(), time.thread_time(), waited_ms()
    if name == "tmpfs_link":
        os.link(source, target)
    elif name == "tmpfs_rename":
        os.rename(source, target)
    else:
        src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
        exclusive = 0 if name == "overwrite_cached" else os.O_EXCL
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | exclusive | os.O_CLOEXEC, 0o600)
        try:
            COPIES[name](src, dst, size)
        finally:
            os.close(src)
            os.close(dst)
    took = ((time.perf_counter() - wall) * 1000, (time.thread_time() - cpu) * 1000, waited_ms() - waited)
    deleting = time.thread_time()
    if name == "tmpfs_rename":
        os.rename(target, source)
    elif name != "overwrite_cached":
        target.unlink()
    return (*took, (time.thread_time() - deleting) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--target", type=Path, default=Path("/var/tmp"))
    args = parser.parse_args()
    names = [*COPIES, "tmpfs_link", "tmpfs_rename"]
    samples: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in names}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm, tempfile.TemporaryDirectory(dir=args.target) as out:
        source = Path(shm) / "big"
        source.write_bytes(os.urandom(args.mb << 20))
        cross = cross_fs_copy_file_range(source, Path(out))
        one("overwrite_cached", source, Path(out) / "overwrite_cached")  # the file it overwrites
        for _ in range(args.rounds):
            random.shuffle(names)
            for name in names:
                where = Path(shm) if name.startswith("tmpfs_") else Path(out)
                samples[name].append(one(name, source, where / name))
        load.append(os.getloadavg()[0])
    data: dict[str, Any] = {
        name: {
            key: summary([row[n] for row in rows])
            for n, key in enumerate(("wall_ms", "cpu_ms", "waited_ms", "delete_cpu_ms"))
        }
        for name, rows in samples.items()
    }
    data["copy_file_range_tmpfs_to_target"] = cross
    data["load"] = load
    lines = [
        f"| {args.mb} MB from a tmpfs | wall p50 ms | CPU p50 ms | min | max | wait for a CPU p50 ms "
        "| its deletion's CPU p50 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in sorted(samples, key=lambda n: statistics.median(r[1] for r in samples[n])):
        row = data[name]
        lines.append(
            f"| {name} | {row['wall_ms']['p50']:.1f} | {row['cpu_ms']['p50']:.1f} | {row['cpu_ms']['min']:.1f} "
            f"| {row['cpu_ms']['max']:.1f} | {row['waited_ms']['p50']:.1f} | {row['delete_cpu_ms']['p50']:.1f} |"
        )
    lines += [
        "",
        f"`copy_file_range` from the tmpfs to {args.target}'s filesystem: {cross}. "
        f"Load (1 min) at the start and end: {load[0]:.1f}, {load[1]:.1f}.",
    ]
    write_results("copy_methods", data, "\n".join(lines))


if __name__ == "__main__":
    main()
