"""Issue 31: what a sandbox's entry into its cgroup costs the start's wall, by how the launcher
enters: its pid written to `cgroup.procs` (as main's launcher did everywhere), or 0 written to a
cgroup v1 `tasks` file (the calling thread: what this tree's launcher does on v1).

    python bench/investigations/fork-copy/cgroup_entry.py [--rounds 20] [--pause 1.0]

Run as root on a cgroup v1 host. One fresh group in the `pids` hierarchy; `warmshell-launch
--cgroup=FILE -- /bin/true`, the two ways taking turns, each after `--pause` seconds of no
migration on the host's part (as a lone create after a quiet spell: a fork's ten children or a
pool's fill come seconds apart, a burst's after the first do not wait); and then the same with no
pause (back to back). Per way: wall ms of the launch (p50, min, max) and CPU ms (getrusage).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness

from harness import summary, write_results

from warmshell.drivers.local.runtime.launching import LAUNCH_BINARY

PIDS = Path("/sys/fs/cgroup/pids")


def launch(entry: Path) -> tuple[float, float]:
    before, began = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([str(LAUNCH_BINARY), f"--cgroup={entry}", "--", "/bin/true"], check=True)
    wall, after = (time.perf_counter() - began) * 1000, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--pause", type=float, default=1.0)
    args = parser.parse_args()
    if os.geteuid() != 0 or not (PIDS / "tasks").exists():
        sys.exit("run as root on a cgroup v1 host (a pids hierarchy with a tasks file)")
    group = PIDS / f"ws-bench-cgroup-entry-{os.getpid()}"
    group.mkdir()
    ways = {"pid_to_cgroup_procs": group / "cgroup.procs", "0_to_tasks": group / "tasks"}
    rows: dict[str, list[tuple[float, float]]] = {f"{way}_{when}": [] for way in ways for when in ("paused", "back")}
    try:
        for turn in range(args.rounds):
            order = list(ways.items()) if turn % 2 == 0 else list(ways.items())[::-1]
            for way, entry in order:
                time.sleep(args.pause)
                rows[f"{way}_paused"].append(launch(entry))
        for turn in range(args.rounds):
            for way, entry in ways.items() if turn % 2 == 0 else list(ways.items())[::-1]:
                rows[f"{way}_back"].append(launch(entry))
    finally:
        group.rmdir()
    data: dict[str, Any] = {
        key: {"wall_ms": summary([r[0] for r in found]), "cpu_ms": summary([r[1] for r in found])}
        for key, found in rows.items()
    }
    data["load"] = os.getloadavg()[0]
    lines = ["| entry | wall p50 ms | min | max | CPU p50 ms |", "|---|---|---|---|---|"]
    for key, found in rows.items():
        walls = [r[0] for r in found]
        cpu = statistics.median(r[1] for r in found)
        lines.append(f"| {key} | {statistics.median(walls):.2f} | {min(walls):.2f} | {max(walls):.2f} | {cpu:.2f} |")
    lines += ["", f"Pause before each paused launch: {args.pause} s. Load (1 min) at the end: {data['load']:.1f}."]
    write_results("cgroup_entry", data, "\n".join(lines))


if __name__ == "__main__":
    main()
