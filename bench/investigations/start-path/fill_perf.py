"""Issue 29's last check, the gateway's share of a member start taken apart: a pool fill per
source tree (trees alternating round by round) with `perf record -g` sampling the gateway's own
threads, each sample put in the first of `KINDS` its call stack shows, per thread.

    python bench/investigations/start-path/fill_perf.py --tree before=/tmp/before-tree/src \
        --tree after=src [--size 150] [--rounds 2]

perf's samples are CPU time (`cpu-clock` at `--frequency` Hz), so a loaded machine delays them
but does not add to them; the kernel's part of a thread is seen function by function, where
/proc only tells user from system time. Each tree's gateway runs as in `burst.py --src` (its
agent and launcher built), fills a warm-up pool of 8 and drains it (first-start work), then the
measured pool of `--size` while perf runs. Needs `perf` on PATH and perf events allowed
(root, or `kernel.perf_event_paranoid` <= 1). Results in `results/<name>.{json,md}`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness
import alternating
from harness import gateway_process, write_results
from warm_path import idle_members, write_profile

# (kind, kernel or library functions any of which on the stack puts a sample there), first match wins.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ext4: an inode made by mkdir (a directory)", ("ext4_mkdir",)),
    ("ext4: an inode made by open (a file created)", ("__ext4_new_inode",)),
    ("cgroup: a group made (mkdir in a hierarchy)", ("cgroup_mkdir",)),
    ("cgroup: a control file written", ("cgroup_file_write",)),
    ("file data copied (sendfile)", ("do_sendfile",)),
    ("the spawn: vfork and the child until exec", ("__x64_sys_vfork", "copy_process", "__vfork")),
    ("futex (the GIL, queues)", ("__x64_sys_futex",)),
    ("other system calls and faults", ("entry_SYSCALL_64_after_hwframe", "asm_exc_page_fault")),
)
USER = "user space (Python, libc)"


def thread_group(comm: str, tid: int, pid: int) -> str:
    """The thread's role: the event loop, the spawner threads, the rest."""
    if tid == pid:
        return "event loop"
    if comm.startswith("warmshell-spawn"):
        return "spawner threads"
    return "other threads"


def classify(stack: set[str]) -> str:
    return next((kind for kind, functions in KINDS if stack & set(functions)), USER)


def samples(data: Path, pid: int) -> collections.Counter[tuple[str, str]]:
    """(thread role, kind) -> samples, of the gateway's own threads (its children left out)."""
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "comm,pid,tid,ip,sym"], capture_output=True, text=True, check=True
    ).stdout
    counted: collections.Counter[tuple[str, str]] = collections.Counter()
    head: tuple[str, int, int] | None = None
    stack: set[str] = set()
    for line in [*script.splitlines(), ""]:
        if not line.strip():
            if head is not None and head[2] == pid:
                counted[(thread_group(*head), classify(stack))] += 1
            head, stack = None, set()
        elif line.startswith("\t"):  # a frame: address, then the function
            parts = line.split()
            if len(parts) > 1:
                stack.add(parts[1])
        else:  # a sample's head: "comm pid/tid"
            comm, _, ids = line.strip().rpartition(" ")
            owner, _, tid = ids.partition("/")
            head = (comm, int(tid), int(owner))
    return counted


async def fill(src: Path, size: int, frequency: int, data: Path) -> dict[str, Any]:
    """One gateway from `src`: warm-up, then a fill of `size` under perf; samples per member."""
    with tempfile.TemporaryDirectory(prefix="ws-fill-perf-") as tmp:
        pools = Path(tmp) / "pools"
        pools.mkdir()
        config = Path(tmp) / "gateway.toml"
        config.write_text(
            f"[local]\nmax_pool_replicas = {size}\npool_reload_interval_seconds = 0.2\nmember_check_seconds = 600\n"
        )
        async with gateway_process("--pools", str(pools), "--config", str(config), src=src) as gw:
            write_profile(pools, "warmup", 8, {"POOL": "warmup"})
            while await idle_members(gw, "warmup") < 8:
                await asyncio.sleep(0.05)
            (pools / "warmup.toml").unlink()
            await asyncio.sleep(2)  # drained
            pid = gw.process.pid
            command = ["perf", "record", "-q", "-g", "-F", str(frequency), "-p", str(pid), "-o", str(data)]
            perf = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await asyncio.sleep(1)  # attached
            start = time.perf_counter()
            write_profile(pools, "fill", size, {"POOL": "fill"})
            while await idle_members(gw, "fill") < size:
                await asyncio.sleep(0.05)
            wall = time.perf_counter() - start
            perf.send_signal(signal.SIGINT)
            await asyncio.to_thread(perf.wait, 60)
    counted = samples(data, pid)
    per_member = {f"{role} / {kind}": n * 1000 / frequency / size for (role, kind), n in counted.items()}
    return {"members_per_s": size / wall, "ms_per_member": per_member, "load": list(os.getloadavg())}


def table(trees: list[str], runs: dict[str, list[dict[str, Any]]]) -> str:
    first, last = trees[0], trees[-1]
    keys = sorted({key for rs in runs.values() for r in rs for key in r["ms_per_member"]})

    def median(tree: str, key: str) -> float:
        return statistics.median(r["ms_per_member"].get(key, 0.0) for r in runs[tree])

    out = "Gateway CPU ms per member start, by thread and by what its stack shows (medians over the rounds)\n\n"
    out += f"| thread / kind | {' | '.join(trees)} | {last} - {first} |\n|---|{'---|' * (len(trees) + 1)}\n"
    for role in ("event loop", "spawner threads", "other threads"):
        rows = [key for key in keys if key.startswith(role)]
        totals = {tree: sum(median(tree, key) for key in rows) for tree in trees}
        cells = " | ".join(f"**{totals[t]:.3f}**" for t in trees)
        out += f"| **{role}** | {cells} | **{totals[last] - totals[first]:+.3f}** |\n"
        for key in sorted(rows, key=lambda k: -max(median(t, k) for t in trees)):
            cells = " | ".join(f"{median(t, key):.3f}" for t in trees)
            out += f"| … {key.split(' / ', 1)[1]} | {cells} | {median(last, key) - median(first, key):+.3f} |\n"
    out += "\n| round | tree | members/s | load |\n|---|---|---|---|\n"
    for round_ in range(len(runs[first])):
        for tree in trees:
            r = runs[tree][round_]
            out += f"| {round_} | {tree} | {r['members_per_s']:.0f} | {r['load'][0]:.1f} |\n"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    alternating.add_tree_option(parser)
    parser.add_argument("--size", type=int, default=150, help="members in the measured fill (default 150)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each one fill per tree (default 2)")
    parser.add_argument("--frequency", type=int, default=2000, help="perf's samples per second (default 2000)")
    parser.add_argument("--name", default="fill_perf", help="results/NAME.{json,md} beside this script")
    args = parser.parse_args()
    trees = alternating.trees(args.tree)
    with tempfile.TemporaryDirectory(prefix="ws-fill-perf-data-") as tmp:
        runs = alternating.alternate(
            trees,
            args.rounds,
            lambda tree, src, round_: asyncio.run(
                fill(src, args.size, args.frequency, Path(tmp) / f"{tree}-{round_}.perf")
            ),
        )
    data = {"trees": trees, "size": args.size, "frequency": args.frequency, "runs": runs}
    write_results(args.name, data, table(list(trees), runs))


if __name__ == "__main__":
    main()
