"""Issue 31: what one write of a pid to a cgroup v1 `cgroup.procs` costs against the time since the
previous such write on the host (the launcher places each sandbox that way before its mounts).

    python bench/investigations/image-cold-create/placement_gap.py [--rounds 30]

Each sample: a fresh `sleep` child and a fresh group under `/sys/fs/cgroup/cpu/<--parent>/`, a
pause of `gap` ms, then the timed write of the child's pid to the group's `cgroup.procs` (wall,
and this thread's CPU over it), then the child killed and the group removed (neither writes
`cgroup.procs`). The gaps' order is shuffled each round. A writer of `cgroup.procs` takes the
kernel's `cgroup_threadgroup_rwsem` for writing, whose `rcu_sync` waits for an RCU grace period
unless a writer left it less than about a grace period ago: the wait should show as wall without
CPU, after a gap and not back to back. Run as root; other writers on the host (any sandbox's
start) shorten the gaps, so a quiet host gives the clean curve.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness

from harness import write_results

GAPS_MS = (0, 2, 5, 10, 20, 50, 100, 300)


def one_write(parent: Path, n: int, gap_ms: float, last_end: float) -> tuple[dict[str, float], float]:
    """One sample at `gap_ms`: its wall and CPU ms, and the time since the previous write's end."""
    child = subprocess.Popen(["sleep", "30"])
    group = parent / f"g{n}"
    group.mkdir()
    try:
        time.sleep(gap_ms / 1000)
        since = (time.perf_counter() - last_end) * 1000
        cpu, start = time.thread_time(), time.perf_counter()
        (group / "cgroup.procs").write_text(str(child.pid))
        end = time.perf_counter()
        sample = {"wall_ms": (end - start) * 1000, "cpu_ms": (time.thread_time() - cpu) * 1000, "since_ms": since}
    finally:
        child.kill()
        child.wait()
        while True:  # the group empties once the killed child is gone from it
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.001)
    return sample, end


def measure(args: argparse.Namespace) -> dict[str, Any]:
    parent = Path("/sys/fs/cgroup/cpu") / args.parent
    parent.mkdir(exist_ok=True)
    samples: dict[str, list[dict[str, float]]] = {str(g): [] for g in GAPS_MS}
    last_end, n = time.perf_counter(), 0
    try:
        for _ in range(args.rounds):
            for gap in random.sample(GAPS_MS, len(GAPS_MS)):
                sample, last_end = one_write(parent, n, gap, last_end)
                samples[str(gap)].append(sample)
                n += 1
    finally:
        parent.rmdir()
    return {"samples": samples, "load": os.getloadavg()[0]}


def table(data: dict[str, Any]) -> str:
    lines = [
        "| pause ms | since the previous write p50 ms | write wall p50 ms | p90 ms | write CPU p50 ms |",
        "|---|---|---|---|---|",
    ]
    for gap, rows in data["samples"].items():
        walls = sorted(r["wall_ms"] for r in rows)
        p90 = walls[int(0.9 * (len(walls) - 1))]
        since = statistics.median(r["since_ms"] for r in rows)
        cpu = statistics.median(r["cpu_ms"] for r in rows)
        lines.append(f"| {gap} | {since:.1f} | {statistics.median(walls):.2f} | {p90:.2f} | {cpu:.3f} |")
    lines += [
        "",
        f"Samples per row: {len(next(iter(data['samples'].values())))}. Load (1 min) at the end: {data['load']:.1f}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--parent", default="ws-placement-gap")
    parser.add_argument("--name", default="placement_gap")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: it makes cgroups")
    data = measure(args)
    write_results(args.name, data, table(data))


if __name__ == "__main__":
    main()
