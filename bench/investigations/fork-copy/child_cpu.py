"""Issue 31: where a forked child's start goes in CPU, by program (the gateway, the launcher,
bwrap, the agent) and, within each, by kernel and user function: what of it is per child and
could be once per fork?

    python bench/investigations/fork-copy/child_cpu.py [--forks 10] [--frequency 4000] [--name child_cpu]

One gateway (run as root) with the benchmark's small image, an empty fork parent and a tagged
snapshot of it. Taking turns, `--forks` times: fork(10) of the parent, then one cold create ->
Ready of its snapshot; each call alone under `perf record -g -p` (the gateway's threads and every
process it starts meanwhile; the deletes and the prune after it are not recorded). The samples
are split by command name (a process's name changes at its exec: `warmshell-launc` is the launcher
until it execs bwrap, `bwrap` both of bwrap's processes until the inner one execs the agent; the
gateway's threads by their names, `python` its event loop and `to_thread` workers). Per command:
CPU ms per start (samples / frequency / starts: a fork's ten children, or the one create; a
fork's snapshot of the parent is in its children's share), its top symbols (self time), and its
time under a few kernel functions that name a start's steps (namespaces, mounts, mountinfo,
exec; inclusive, from the call chains). Beside them the same recording around no call at all
(perf's start and the wait for it: what the gateway does anyway, in a lone create's column once,
in a child's a tenth). Needs perf.
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
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness and the benchmarks reused here

from harness import GatewayProcess, gateway_process, summary, write_results
from snapshots import SMALL, fork_measured, import_images, prune, snapshot, threads_cpu_ms

from warmshell.api.v1 import sandbox_pb2 as pb

# Kernel functions whose inclusive time (a sample anywhere under them) says what a start does.
STEPS = (
    "copy_net_ns",
    "cleanup_net",
    "create_user_ns",
    "copy_pid_ns",
    "copy_mnt_ns",
    "create_new_namespaces",
    "__x64_sys_mount",
    "__x64_sys_open_tree",
    "__x64_sys_move_mount",
    "__x64_sys_mount_setattr",
    "__x64_sys_pivot_root",
    "__x64_sys_umount",
    "show_mountinfo",
    "bprm_execve",
    "kernel_clone",
    "do_exit",
    "__x64_sys_seccomp",
    "__x64_sys_exit_group",
    "do_group_exit",
    "__x64_sys_write",
    "__x64_sys_read",
    "__x64_sys_openat",
    "do_mmap",
    "asm_exc_page_fault",
    "__x64_sys_unshare",
    "__x64_sys_setns",
    "__x64_sys_sethostname",
    "__x64_sys_clone3",
)


def samples_by(perf_data: Path) -> list[tuple[str, str, frozenset[str]]]:
    """(command, its own symbol, every symbol on its call chain) of each sample."""
    out = subprocess.run(
        ["perf", "script", "-i", str(perf_data), "-F", "comm,ip,sym"], capture_output=True, text=True, check=False
    ).stdout
    found = []
    for block in out.split("\n\n"):
        lines = [line.split() for line in block.strip().splitlines()]
        if not lines or not lines[0]:
            continue
        head, frames = lines[0], [f[1].split("+")[0] for f in lines[1:] if len(f) > 1]
        own = head[2] if len(head) > 2 else (frames[0] if frames else "[unknown]")
        # A process whose name perf did not record (`:PID`): one row for them all.
        comm = "(name not recorded)" if head[0].startswith(":") else head[0]
        found.append((comm, own, frozenset([own, *frames])))
    return found


async def recorded(
    gw: GatewayProcess, perf_data: Path, frequency: int, call: Awaitable[Any]
) -> tuple[float, float, Any]:
    """`call` awaited under `perf record` of the gateway and everything it starts: its wall ms,
    the gateway's threads' CPU ms over it (their schedstat: exact, to check perf's sampling of
    them against), and its result."""
    period = str(10**9 // frequency)
    perf = subprocess.Popen(
        # A fixed period of the cpu-clock, so that a sample is 1 / frequency s of CPU (with -F,
        # perf adapts the period per task: each of a start's short-lived processes would begin
        # with its own short one and be over-counted).
        ["perf", "record", "-g", "-e", "cpu-clock", "-c", period, "-p", str(gw.process.pid), "-o", str(perf_data)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    await asyncio.sleep(0.5)  # perf attached
    start, threads = time.perf_counter(), threads_cpu_ms(gw)
    result = await call
    wall, threads = (time.perf_counter() - start) * 1000, threads_cpu_ms(gw) - threads
    perf.send_signal(signal.SIGINT)
    perf.wait()
    return wall, threads, result


async def fork_only(gw: GatewayProcess, prefix: str) -> pb.ForkSandboxResponse:
    request = pb.ForkSandboxRequest(name="parent-empty", count=10, prefix=prefix, ready_timeout_ms=120_000)
    return await gw.stub.ForkSandbox(request, metadata=gw.metadata, timeout=300)


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Per kind (a fork(10)'s child, a lone cold create of the parent's snapshot), taking turns:
    the samples of the calls alone (the deletes and prunes after them are not recorded)."""
    found: dict[str, list[tuple[str, str, frozenset[str]]]] = {"fork10_child": [], "cold_create": [], "idle": []}
    walls: dict[str, list[float]] = {"fork10_child": [], "cold_create": [], "idle": []}
    gateway: dict[str, list[float]] = {"fork10_child": [], "cold_create": [], "idle": []}
    async with gateway_process() as gw:
        work.mkdir(exist_ok=True)
        await asyncio.to_thread(import_images, gw.state, work, 1)
        await gw.create_ready(name="parent-empty", spec=pb.SandboxSpec(image=SMALL))
        _, taken = await snapshot(gw, "parent-empty", "bench/child-cpu:1")
        image = f"sha256:{taken.digest[7:]}"
        await fork_measured(gw, "parent-empty", "warm", 10)  # caches and the store's first touch
        for n in range(args.forks):
            perf_data = work / f"fork{n}.data"
            call = fork_only(gw, f"c{n}")
            wall, threads, response = await recorded(gw, perf_data, args.frequency, call)
            walls["fork10_child"].append(wall)
            gateway["fork10_child"].append(threads / 10)
            found["fork10_child"] += samples_by(perf_data)
            for child in response.children:
                await gw.delete(child.name)
            await prune(gw)
            perf_data = work / f"cold{n}.data"
            call = gw.create_ready(name=f"cold-{n}", spec=pb.SandboxSpec(image=image))
            wall, threads, _ = await recorded(gw, perf_data, args.frequency, call)
            walls["cold_create"].append(wall)
            gateway["cold_create"].append(threads)
            found["cold_create"] += samples_by(perf_data)
            await gw.delete(f"cold-{n}")
            # The same recording around nothing: what the gateway does anyway over perf's start.
            wall, threads, _ = await recorded(gw, work / f"idle{n}.data", args.frequency, asyncio.sleep(0))
            walls["idle"].append(wall)
            gateway["idle"].append(threads)
            found["idle"] += samples_by(work / f"idle{n}.data")
    per = {"fork10_child": args.forks * 10, "cold_create": args.forks, "idle": args.forks}
    return {
        **{kind: breakdown(samples, 1000 / args.frequency / per[kind]) for kind, samples in found.items()},
        "wall_ms": {kind: summary(w) for kind, w in walls.items()},
        "gateway_threads_schedstat_ms": {kind: statistics.fmean(g) for kind, g in gateway.items()},
        "load": os.getloadavg()[0],
    }


def breakdown(samples: list[tuple[str, str, frozenset[str]]], scale: float) -> dict[str, Any]:
    """CPU ms per start by command; per command its top symbols and its time under `STEPS`."""
    per_comm = collections.Counter(c for c, _, _ in samples)
    symbols: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    steps: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for comm, symbol, chain in samples:
        symbols[comm][symbol] += 1
        for step in STEPS:
            if step in chain:
                steps[comm][step] += 1
    top = [c for c, _ in per_comm.most_common(8)]
    return {
        "per_start_cpu_ms": {c: n * scale for c, n in per_comm.most_common()},
        "top_symbols": {c: {s: n * scale for s, n in symbols[c].most_common(12)} for c in top},
        "steps": {c: {s: n * scale for s, n in steps[c].most_common()} for c in top},
    }


def table(data: dict[str, Any]) -> str:
    kinds = ("fork10_child", "cold_create", "idle")
    fork_cpu = data["fork10_child"]["per_start_cpu_ms"]
    comms = sorted({c for k in kinds for c in data[k]["per_start_cpu_ms"]}, key=lambda c: -fork_cpu.get(c, 0))
    lines = [
        "| command | a fork(10)'s child: CPU ms per child | a lone cold create: CPU ms "
        "| the same recording around no call: CPU ms |",
        "|---|---|---|---|",
    ]
    for comm in comms:
        cells = [f"{data[k]['per_start_cpu_ms'].get(comm, 0.0):.2f}" for k in kinds]
        lines.append(f"| {comm} | " + " | ".join(cells) + " |")
    totals = [f"**{sum(data[k]['per_start_cpu_ms'].values()):.2f}**" for k in kinds]
    lines.append("| **total** | " + " | ".join(totals) + " |")
    exact = " | ".join(f"{data['gateway_threads_schedstat_ms'][k]:.2f}" for k in kinds)
    lines.append(f"| the gateway's threads by their schedstat (exact, mean) | {exact} |")
    walls = data["wall_ms"]
    fork_wall, cold_wall = walls["fork10_child"]["p50"], walls["cold_create"]["p50"]
    lines += ["", f"Wall p50 (under perf): fork(10) {fork_wall:.1f} ms, cold create {cold_wall:.1f} ms."]
    for kind in kinds[:2]:
        for comm, top in data[kind]["top_symbols"].items():
            steps = ", ".join(f"{s} {ms:.3f}" for s, ms in data[kind]["steps"][comm].items())
            lines += ["", f"### {kind}: {comm}, ms per start", "", f"Kernel steps (inclusive): {steps}", ""]
            lines += ["Top symbols (self): " + ", ".join(f"{s} {ms:.3f}" for s, ms in top.items())]
    lines += ["", f"Load (1 min) at the end: {data['load']:.1f}."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forks", type=int, default=10)
    parser.add_argument("--frequency", type=int, default=4000)
    parser.add_argument("--name", default="child_cpu", help="the results' name")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: images of the image store need a gateway run as root")
    with tempfile.TemporaryDirectory(prefix="ws-child-cpu-") as tmp:
        data = asyncio.run(run(args, Path(tmp) / "work"))
    write_results(args.name, data, table(data))


if __name__ == "__main__":
    main()
