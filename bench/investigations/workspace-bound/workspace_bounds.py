"""What a bounded /workspace costs per sandbox start (issue 13): the same bubblewrap command line
the local driver builds, its agent replaced by /bin/true, with /workspace as

- a host directory bound there (no bound: the baseline),
- a sized tmpfs mounted by bwrap in the sandbox's mount namespace (the default),
- a loop-mounted ext4 image of the same size (a disk-backed bound: truncate, mkfs, mount, umount),
- and, where the host's filesystem has project quotas, a quota (detected; this host has none).

Variants run interleaved, so a shared machine's noise falls on all of them alike; the figure
that matters is each variant's cost over the baseline. Loop images need root.

    python bench/investigations/workspace-bound/workspace_bounds.py  # 40 starts per variant, a few seconds each
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness and the benchmarks reused here

from harness import summary, write_results

from warmshell.drivers.local.runtime import sandboxing

SIZE = 1 << 30


def base_argv(workspace: Path, size: int | None) -> list[str]:
    plan = sandboxing.host_root_plan(sandboxing.list_root(Path("/")), os.listdir("/etc"))
    layout = sandboxing.SandboxLayout(
        bwrap=shutil.which("bwrap") or "bwrap",
        plan=plan,
        workspace_dir=workspace,
        agent=Path("/bin/true"),
        control_fd=0,
        seccomp_fd=-1,
        hostname="bench",
        workspace_bytes=size,
        tmp_bytes=256 << 20,
        run_bytes=16 << 20,
        shm_bytes=64 << 20,
    )
    argv = sandboxing.bwrap_argv(layout)
    at = argv.index("--seccomp")  # no seccomp fd here; it costs the same in every variant
    return argv[:at] + argv[at + 2 :]


def run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)


def host_directory(scratch: Path, index: int) -> None:
    workspace = scratch / f"dir-{index}"
    workspace.mkdir()
    run(base_argv(workspace, None))
    shutil.rmtree(workspace)


def tmpfs(scratch: Path, index: int) -> None:
    run(base_argv(scratch / "unused", SIZE))


def loop_image(scratch: Path, index: int) -> None:
    image, workspace = scratch / f"img-{index}", scratch / f"mnt-{index}"
    workspace.mkdir()
    with image.open("wb") as sparse:
        sparse.truncate(SIZE)
    run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", str(image)])
    run(["mount", "-o", "loop", str(image), str(workspace)])
    try:
        run(base_argv(workspace, None))
    finally:
        run(["umount", str(workspace)])
        image.unlink()
        workspace.rmdir()


def project_quota_support(path: Path) -> str:
    """Why this host cannot give a directory a project quota, or "" when it can."""
    best = ("", "", "")
    for line in Path("/proc/mounts").read_text().splitlines():
        _, target, fstype, options, *_ = line.split()
        if str(path.resolve()).startswith(target) and len(target) >= len(best[0]):
            best = (target, fstype, options)
    target, fstype, options = best
    if fstype not in ("ext4", "xfs"):
        return f"{target} is {fstype}, not ext4 or xfs"
    if not {"prjquota", "pquota", "pqnoenforce"} & set(options.split(",")):
        return f"{target} ({fstype}) is mounted without project quotas ({options})"
    return ""


def main(count: int) -> None:
    variants: dict[str, Callable[[Path, int], None]] = {"host directory (no bound)": host_directory, "tmpfs": tmpfs}
    if os.geteuid() == 0:
        variants["loop-mounted ext4 image"] = loop_image
    scratch = Path(tempfile.mkdtemp(prefix="workspace-bounds-", dir="/var/tmp"))
    times: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for index in range(count):
            for name, start in variants.items():
                begin = time.perf_counter()
                start(scratch, index)
                times[name].append((time.perf_counter() - begin) * 1000)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    quota = project_quota_support(scratch.parent)
    load = os.getloadavg()
    baseline = summary(times["host directory (no bound)"])["p50"]
    data = {
        "starts_per_variant": count,
        "workspace_size_bytes": SIZE,
        "load_average": load,
        "ms": {name: summary(values) for name, values in times.items()},
        "project_quota": quota or "supported",
    }
    rows = ["| /workspace | p50 ms | p99 ms | over the baseline (p50) |", "|---|---|---|---|"]
    for name, values in times.items():
        stats = summary(values)
        rows.append(f"| {name} | {stats['p50']:.2f} | {stats['p99']:.2f} | {stats['p50'] - baseline:+.2f} ms |")
    rows += [
        "",
        f"One bwrap start each (the local driver's command line, agent = /bin/true), {count} per variant,",
        f"interleaved; size {SIZE >> 20} MiB. Project quotas: {quota or 'supported (not measured)'}.",
        f"Load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (a shared machine: compare the rows, not runs).",
    ]
    write_results("workspace_bounds", data, "\n".join(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=40, help="starts per variant")
    main(parser.parse_args().count)
