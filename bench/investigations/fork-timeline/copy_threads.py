"""Issue 31: does a fork's copy of a large file from a sandbox's tmpfs into the image store (ext4)
get faster with two threads, each copying half the file, on this 2-core host under its load?

    python bench/investigations/fork-timeline/copy_threads.py [--mb 200] [--rounds 20]

A file of `--mb` MB of random bytes on /dev/shm (a tmpfs, as a sandbox's /workspace is) is copied
into a new file under the state-like directory `--target` (ext4 here) the way `capture` copies it
(`posix_fallocate`, then `splice` through a 1 MiB pipe: `capture._copy_across`), by one thread
or by two (each its own pipe, each a half at its own offsets); the copy is deleted after each
round, and the variants take turns (which goes first alternates). Per round: wall ms, and the
process's CPU ms (every thread, user and system, from `getrusage`).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness

from harness import summary, write_results

from warmshell.drivers.local.imagestore import capture


def splice_range(source: int, target: int, offset: int, count: int) -> None:
    """`capture._copy_across`'s loop with the target's offset explicit too, so that two threads
    may each copy a range of one file (each through a pipe of its own)."""
    pipe_out, pipe_in = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(pipe_in, fcntl.F_SETPIPE_SZ, 1 << 20)
        done = 0
        while done < count:
            got = os.splice(source, pipe_in, min(count - done, 1 << 20), offset_src=offset + done)
            written = 0
            while written < got:
                written += os.splice(pipe_out, target, got - written, offset_dst=offset + done + written)
            done += got
    finally:
        os.close(pipe_out)
        os.close(pipe_in)


def cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1000


def waited_ms() -> float:
    """How long the calling thread has waited on a run queue for a CPU (its schedstat), ms."""
    return int(Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").read_text().split()[1]) / 1e6


def copy(source: Path, target: Path, threads: int) -> tuple[float, float, float]:
    """Copy `source` into the new file `target` with `threads` threads: (wall ms, CPU ms, and
    the calling thread's wait for a CPU meanwhile, ms: with one thread, the copy's own)."""
    size = source.stat().st_size
    start, cpu, waited = time.perf_counter(), cpu_ms(), waited_ms()
    src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.posix_fallocate(dst, 0, size)
        if threads == 1:
            capture._copy_across(src, dst, 0, size)
        else:
            bounds = [size * n // threads // (1 << 20) * (1 << 20) for n in range(threads)] + [size]
            workers = [
                threading.Thread(target=splice_range, args=(src, dst, bounds[n], bounds[n + 1] - bounds[n]))
                for n in range(threads)
            ]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
    finally:
        os.close(src)
        os.close(dst)
    return (time.perf_counter() - start) * 1000, cpu_ms() - cpu, waited_ms() - waited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--target", type=Path, default=Path("/var/tmp"))
    args = parser.parse_args()
    samples: dict[str, tuple[list[float], list[float], list[float]]] = {
        "one_thread": ([], [], []),
        "two_threads": ([], [], []),
    }
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm, tempfile.TemporaryDirectory(dir=args.target) as out:
        source = Path(shm) / "big"
        source.write_bytes(os.urandom(args.mb << 20))
        pair = [("one_thread", 1), ("two_threads", 2)]
        for turn in range(args.rounds):
            for key, threads in pair if turn % 2 == 0 else pair[::-1]:
                target = Path(out) / key
                for column, value in zip(samples[key], copy(source, target, threads), strict=True):
                    column.append(value)
                target.unlink()
    data: dict[str, Any] = {
        key: {"wall_ms": summary(w), "cpu_ms": summary(c), "waited_ms": summary(q)}
        for key, (w, c, q) in samples.items()
    }
    ratios = [b / a for a, b in zip(samples["one_thread"][0], samples["two_threads"][0], strict=True)]
    data["two_over_one_wall_pairs_p50"] = statistics.median(ratios)
    data["load"] = os.getloadavg()[0]
    lines = [
        f"| copy of {args.mb} MB tmpfs -> ext4 | wall p50 ms | p90 | CPU p50 ms | the caller's wait for a CPU p50 ms |",
        "|---|---|---|---|---|",
    ]
    for key in ("one_thread", "two_threads"):
        row = data[key]
        lines.append(
            f"| {key} | {row['wall_ms']['p50']:.1f} | {row['wall_ms']['p90']:.1f} | {row['cpu_ms']['p50']:.1f} "
            f"| {row['waited_ms']['p50']:.1f} |"
        )
    lines += [
        "",
        f"Two threads over one, wall, p50 of the pairs: {data['two_over_one_wall_pairs_p50']:.2f}x; "
        f"load (1 min) at the end {data['load']:.1f}.",
    ]
    write_results("copy_threads", data, "\n".join(lines))


if __name__ == "__main__":
    main()
