"""Issue 31: what a sandbox's bwrap costs against the number of mounts in the mount namespace it
starts in (bwrap reads and parses the whole of /proc/self/mountinfo once per bind mount it makes:
~12 times for a sandbox's command line).

    python bench/investigations/fork-copy/bwrap_mounts.py [--mounts -1 0 100 500] [--starts 30] [--rounds 2]
        [--trim] [--name NAME]

Run as root. For each count, in a private mount namespace of its own (`unshare -m`), that many
small tmpfs mounts are added and bwrap is started `--starts` times with a sandbox's options
(user, pid, ipc, uts and net namespaces, `--dev`, `--proc`, three tmpfs, a read-only /dev, two
read-only binds) running `/bin/true`; the counts take turns over `--rounds`. A count of -1 adds
none and detaches `/sys` and what is under it (here the cgroup hierarchies, 12 of the host's 20
mounts; a sandbox's bwrap uses none of them): what trimming the table before bwrap would save.
With `--trim`, this tree's `warmshell-launch` starts each bwrap, given the mounts it binds and
reads (`launch_ab.kept`, as a root gateway gives them), and detaches the rest first (the added
mounts among them, each its own call: siblings, as a host's many mounts are). Per count: the
CPU ms per start (getrusage of the reaped children: bwrap, and the launcher with `--trim`) and
the wall ms.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness

from harness import write_results

BWRAP = [
    "bwrap",
    *("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net"),
    *("--die-with-parent", "--new-session", "--as-pid-1", "--cap-drop", "ALL"),
    *("--bind", "/", "/", "--dev", "/dev", "--proc", "/proc"),
    *("--tmpfs", "/tmp", "--tmpfs", "/run", "--tmpfs", "/dev/shm", "--remount-ro", "/dev"),
    *("--ro-bind", "/usr/bin", "/run/x", "--ro-bind", "/etc", "/run/y", "--chdir", "/", "--", "/bin/true"),
]


def inner(mounts: int, starts: int, trim: bool) -> None:
    """In the private mount namespace: add the mounts, time the starts, print JSON."""
    program = BWRAP
    if trim:
        # Here: launch_ab imports this module.
        from launch_ab import BWRAP as ABSOLUTE
        from launch_ab import LAUNCH_BINARY, kept

        program = [str(LAUNCH_BINARY), *kept(ABSOLUTE), "--", *ABSOLUTE]
    base = Path(tempfile.mkdtemp(prefix="ws-bwrap-mounts-"))
    if mounts < 0:
        subprocess.run(["umount", "--recursive", "--lazy", "/sys"], check=True)
    try:
        for n in range(mounts):
            (base / str(n)).mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "t", str(base / str(n))], check=True)
        subprocess.run(program, check=True)  # caches
        before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        for _ in range(starts):
            subprocess.run(program, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000 / starts
        table = len(Path("/proc/self/mountinfo").read_text().splitlines())
        print(json.dumps({"mounts": table, "cpu_ms": cpu, "wall_ms": (time.perf_counter() - start) * 1000 / starts}))
    finally:
        shutil.rmtree(base, ignore_errors=True)  # the mounts go with the namespace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mounts", type=int, nargs="+", default=[-1, 0, 100, 500])
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trim", action="store_true", help="through this tree's launcher, trimming first")
    parser.add_argument("--name", default="bwrap_mounts", help="the results' name")
    parser.add_argument("--inner", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner is not None:
        inner(args.inner, args.starts, args.trim)
        return
    if os.geteuid() != 0:
        sys.exit("run as root: it mounts tmpfs in a mount namespace of its own")
    rows: dict[int, list[dict[str, float]]] = {n: [] for n in args.mounts}
    for turn in range(args.rounds):
        for n in args.mounts if turn % 2 == 0 else args.mounts[::-1]:
            # Private: nothing this namespace mounts or detaches reaches the host's.
            argv = ["unshare", "-m", "--propagation", "private", sys.executable, __file__]
            out = subprocess.run(
                [*argv, "--inner", str(n), "--starts", str(args.starts), *(["--trim"] if args.trim else [])],
                capture_output=True,
                text=True,
            )
            rows[n].append(json.loads(out.stdout.strip().splitlines()[-1]))
    lines = [
        "| mounts added | lines of its mountinfo | bwrap CPU ms per start (each round) | wall ms |",
        "|---|---|---|---|",
    ]
    for n, found in rows.items():
        cpus = ", ".join(f"{r['cpu_ms']:.2f}" for r in found)
        wall = statistics.median(r["wall_ms"] for r in found)
        lines.append(f"| {n} | {found[0]['mounts']:.0f} | {cpus} | {wall:.1f} |")
    lines += ["", f"Load (1 min) at the end: {os.getloadavg()[0]:.1f}."]
    write_results(args.name, {str(n): r for n, r in rows.items()}, "\n".join(lines))


if __name__ == "__main__":
    main()
