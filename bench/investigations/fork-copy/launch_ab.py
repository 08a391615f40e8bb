"""Issue 31: a sandbox's start through this tree's `warmshell-launch` against another tree's (e.g.
main's, before the launcher left the host's /sys out of an image root's mount namespace): the
launcher making an image root, dropping to a sandbox uid and exec'ing bwrap with a sandbox's
options, bwrap running `/bin/true`.

    python bench/investigations/fork-copy/launch_ab.py --versus SRC [--rounds 40] [--bare] [--keep]
        [--host-root] [--name NAME]

Run as root. The image root is one empty layer on ext4 (as a store's layers are); bwrap binds the
namespace's `/` (what the launcher left in it) rather than the overlay, so that `/bin/true` is
there (`--bare`: the launcher runs `/bin/true` itself, no bwrap: its own wall, e.g. whether a
change to its mounts waits for the kernel). The two launchers take turns, which goes first
alternating. `--keep`: this tree's launcher is given the mounts bwrap binds and reads
(`sandboxing.kept_mounts`, as a root gateway gives it) and detaches the rest; `--host-root`: no
image root (the launcher then makes a mount namespace only to trim it). Per launcher: CPU ms per
start (getrusage of the reaped children: the launcher, bwrap and everything bwrap reaped) and wall
ms; and the pairs' ratio.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness
sys.path.insert(0, str(Path(__file__).resolve().parent))  # this topic's scripts

from bwrap_mounts import BWRAP as SANDBOX_BWRAP
from harness import summary, write_results

from warmshell.drivers.local.runtime import sandboxing
from warmshell.drivers.local.runtime.launching import LAUNCH_BINARY

# A sandbox's bwrap options (`bwrap_mounts`'), bwrap by its absolute path as the launcher needs.
BWRAP = [shutil.which("bwrap") or "/usr/bin/bwrap", *SANDBOX_BWRAP[1:]]


def kept(program: list[str]) -> list[str]:
    """The launcher's --keep options for `program` (bwrap's binds: its `--bind` and `--ro-bind` sources)."""
    binds = tuple((Path(program[i + 1]), program[i + 2]) for i, arg in enumerate(program) if arg.endswith("bind"))
    layout = sandboxing.SandboxLayout(
        bwrap=program[0],
        plan=sandboxing.RootPlan(binds),
        workspace_dir=Path("/nonexistent"),
        agent=Path(program[-1]),
        control_fd=0,
        seccomp_fd=0,
        hostname="",
        workspace_bytes=1,
    )
    trees, reads = sandboxing.kept_mounts(layout)
    return [*(f"--keep-tree={tree}" for tree in trees), *(f"--keep={path}" for path in reads)]


def start(launcher: Path, options: list[str], program: list[str]) -> tuple[float, float]:
    argv = [str(launcher), "--uid=1234567", *options]
    before, began = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([*argv, "--", *program], check=True)
    wall, after = (time.perf_counter() - began) * 1000, resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versus", type=Path, required=True, help="another tree's src/ (its launcher built)")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--bare", action="store_true", help="the launcher runs /bin/true: no bwrap")
    parser.add_argument("--keep", action="store_true", help="this tree's launcher detaches what bwrap does not need")
    parser.add_argument("--host-root", action="store_true", help="no image root")
    parser.add_argument("--name", default=None, help="the results' name")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: an image root's idmapped layers need it")
    launchers = {"this": LAUNCH_BINARY, "versus": args.versus / LAUNCH_BINARY.relative_to(LAUNCH_BINARY.parents[5])}
    rows: dict[str, list[tuple[float, float]]] = {key: [] for key in launchers}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        rootfs, layer = Path(tmp) / "rootfs", Path(tmp) / "layer"
        rootfs.mkdir()
        layer.mkdir()
        program = ["/bin/true"] if args.bare else BWRAP
        image = [] if args.host_root else [f"--rootfs={rootfs}", "--root-size=67108864", f"--layer={layer}"]
        options = {"this": image + (kept(program) if args.keep else []), "versus": image}
        for key, launcher in launchers.items():
            start(launcher, options[key], program)  # caches
        for turn in range(args.rounds):
            order = list(launchers.items())
            for key, launcher in order if turn % 2 == 0 else order[::-1]:
                rows[key].append(start(launcher, options[key], program))
    ratios = [a[0] / b[0] for a, b in zip(rows["this"], rows["versus"], strict=True)]
    data: dict[str, Any] = {
        key: {"cpu_ms": summary([r[0] for r in found]), "wall_ms": summary([r[1] for r in found])}
        for key, found in rows.items()
    }
    data["this_over_versus_cpu_pairs_p50"] = statistics.median(ratios)
    data["load"] = os.getloadavg()[0]
    lines = ["| launcher | CPU p50 ms per start | mean | wall p50 ms |", "|---|---|---|---|"]
    for key in launchers:
        lines.append(
            f"| {key} | {data[key]['cpu_ms']['p50']:.2f} | {data[key]['cpu_ms']['mean']:.2f} "
            f"| {data[key]['wall_ms']['p50']:.1f} |"
        )
    lines += [
        "",
        f"This over versus, CPU, p50 of the pairs: {data['this_over_versus_cpu_pairs_p50']:.2f}x. "
        f"Load (1 min) at the end: {data['load']:.1f}.",
    ]
    write_results(args.name or ("launch_ab_bare" if args.bare else "launch_ab"), data, "\n".join(lines))


if __name__ == "__main__":
    main()
