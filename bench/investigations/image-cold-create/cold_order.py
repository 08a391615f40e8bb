"""Issue 31: a cold create of a snapshot's image against one of the plain image, step by step,
with and without the benchmark's fork(10) of the 200 MB parent just before, which of the two goes
first alternating each turn.

    python bench/investigations/image-cold-create/cold_order.py [--repeats 30] [--fork-mb 200]
        [--name cold_order] [--no-fork]

`bench/snapshots.py`'s A/B part always runs, in this order: fork(10) of the empty parent, fork(10)
of the 200 MB parent (its children deleted, its image pruned), a cold create of that parent's
tagged snapshot, then one of the plain image. So its snapshot create is always the first create
after a 200 MB copy into the store and its prune, and its plain create always the second. Here each
turn is: (unless `--no-fork`) fork(10) of the 200 MB parent as the benchmark does it, then the two
cold creates, the snapshot's first on even turns and the plain image's first on odd ones. Each
create's steps come from `fork-timeline/traced_gateway.py` (ms from the call's start), its CPU per
gateway thread and its sandbox's (reaped) CPU, and the host's: all CPUs' busy time over the call
(`/proc/stat`), the pressure stall totals (`/proc/pressure/{cpu,io,memory}`, `some`), and dirty and
writeback page-cache bytes at the call's start (`/proc/meminfo`). Rows are by kind and position.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness and snapshots.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fork-timeline"))  # the traced gateway, its helpers

from fork_timeline import (
    CHILD_STEPS,
    child_steps,
    cpu_delta,
    now_us,
    one_create,
    one_fork,
    prepared,
    stamps,
    thread_cpu_ms,
)
from harness import GatewayProcess, gateway_process, write_results
from snapshots import fork_measured

from warmshell.api.v1 import sandbox_pb2 as pb

HERE = Path(__file__).resolve().parent


def host_counters() -> dict[str, float]:
    """The host's counters a create's wait could show in: busy CPU ms over all CPUs, the
    pressure stalls' `some` totals (ms), and dirty / writeback MB (not a counter: the level)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(f) for f in fields]
    busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
    found = {
        "host_busy_ms": busy * 1000 / os.sysconf("SC_CLK_TCK"),
        "iowait_ms": ticks[4] * 1000 / os.sysconf("SC_CLK_TCK"),
    }
    for kind in ("cpu", "io", "memory"):
        some = Path(f"/proc/pressure/{kind}").read_text().splitlines()[0]
        found[f"psi_{kind}_ms"] = int(some.rsplit("total=", 1)[1]) / 1000
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    for key in ("Dirty", "Writeback"):
        found[f"{key.lower()}_mb_at_start"] = int(meminfo[key].split()[0]) / 1024
    return found


async def measured_create(gw: Any, name: str, image: str) -> dict[str, Any]:
    before = host_counters()
    sample = await one_create(gw, name, image)  # its deletion and the reap are inside the window
    after = host_counters()
    host = {k: after[k] - before[k] for k in after if not k.endswith("_at_start")}
    host.update({k: v for k, v in before.items() if k.endswith("_at_start")})
    sample["host"] = host
    return sample


def sandboxes_group(gw: GatewayProcess) -> Path | None:
    """The gateway's cpuacct group of sandboxes (`.../warmshell/<gateway>`, found from a running
    sandbox's process: the fork parents'): its `cpuacct.usage` counts, to the nanosecond, what
    every sandbox of this gateway ran once placed in its group (removed groups' time stays)."""
    mount = next(p for p in Path("/sys/fs/cgroup").iterdir() if "cpuacct" in p.name.split(","))
    pending = [gw.process.pid]
    while pending:
        pid = pending.pop()
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
                _, controllers, path = line.split(":", 2)
                if "cpuacct" in controllers.split(",") and "/warmshell/" in path and pid != gw.process.pid:
                    return (mount / path.lstrip("/")).parent
            for task in Path(f"/proc/{pid}/task").iterdir():
                pending += [int(c) for c in (task / "children").read_text().split()]
    return None


# Each gateway's group, found once (the search walks its process tree).
_GROUPS: dict[int, Path | None] = {}


def group_cpu_ms(group: Path | None) -> float:
    return int((group / "cpuacct.usage").read_text()) / 1e6 if group is not None else float("nan")


async def bare_create(gw: GatewayProcess, name: str, image: str) -> tuple[dict[str, Any], str]:
    """One cold create as `bench/snapshots.py` times it: nothing read from the gateway between
    it and the call before or after (its stamps are read once the turn is over), deleted at once."""
    group = (
        _GROUPS[gw.process.pid]
        if gw.process.pid in _GROUPS
        else _GROUPS.setdefault(gw.process.pid, sandboxes_group(gw))
    )
    before, counters, group_before = thread_cpu_ms(gw.process.pid), host_counters(), group_cpu_ms(group)
    start = now_us()
    ready = await gw.create_ready(name=name, spec=pb.SandboxSpec(image=image))
    end = now_us()
    after, cpu = host_counters(), cpu_delta(before, thread_cpu_ms(gw.process.pid))
    cpu["sandbox_group_to_ready"] = group_cpu_ms(group) - group_before
    await gw.delete(name)
    host = {k: after[k] - counters[k] for k in after if not k.endswith("_at_start")}
    host.update({k: v for k, v in counters.items() if k.endswith("_at_start")})
    # "sandboxes": children the gateway reaped inside the window: earlier sandboxes (the fork's
    # deleted children, the create before) ending while this create runs, not this one's.
    cpu["reaped_in_window"] = cpu.pop("sandboxes", 0.0)
    sample = {"wall_ms": (end - start) / 1000, "start": start, "timeline": ready.status.timeline, "cpu_ms": cpu}
    return {**sample, "host": host}, ready.id


async def bench_turn(
    gw: GatewayProcess, turn: int, kinds: list[tuple[str, str]], args: argparse.Namespace
) -> list[Any]:
    """The benchmark's own turn: fork(10) of both parents (`snapshots.fork_measured`: the children
    deleted and the image pruned, nothing waited for), then (after `--settle-ms`) the two creates
    back to back."""
    fork_wall = float("nan")
    if not args.no_fork:
        await fork_measured(gw, "parent-empty", f"e{turn}", 10)
        fork_wall, _ = await fork_measured(gw, "parent-full", f"f{turn}", 10)
    await asyncio.sleep(args.settle_ms / 1000)
    if args.warmup:  # a create neither row counts, between the forks (or the pause) and the pair
        await gw.create_ready(name=f"warmup-{turn}", spec=pb.SandboxSpec(image=kinds[-1][1]))
        await gw.delete(f"warmup-{turn}")
    samples = [(kind, *await bare_create(gw, f"{kind}-{turn}", image)) for kind, image in kinds]
    traced = await stamps(gw)
    for _, sample, sandbox_id in samples:
        timeline = sample.pop("timeline")
        sample["steps"] = child_steps(traced["children"].get(sandbox_id, {}), timeline, sample.pop("start"))
        sample["fork_wall_ms"] = fork_wall
    return [(kind, sample) for kind, sample, _ in samples]


@contextlib.contextmanager
def keep_warm(every_ms: float) -> Iterator[None]:
    """A thread moving one sleeping child between two cpu groups every `every_ms` ms (0: none):
    a `cgroup.procs` writer that keeps the kernel's threadgroup rwsem's `rcu_sync` from going
    idle (see `placement_gap.py`), so no sandbox's placement waits for a grace period."""
    if not every_ms:
        yield
        return
    parent = Path("/sys/fs/cgroup/cpu/ws-keep-warm")
    groups = [parent / "a", parent / "b"]
    for group in (parent, *groups):
        group.mkdir(exist_ok=True)
    child, stop = subprocess.Popen(["sleep", "3600"]), threading.Event()

    def run() -> None:
        n = 0
        while not stop.wait(every_ms / 1000):
            (groups[n % 2] / "cgroup.procs").write_text(str(child.pid))
            n += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        child.kill()
        child.wait()
        for group in (*groups, parent):
            while group.exists():
                with contextlib.suppress(OSError):
                    group.rmdir()


async def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    entry = HERE.parent / "fork-timeline" / "traced_gateway.py"
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    forks: list[dict[str, Any]] = []
    with keep_warm(args.keep_warm_ms):
        async with gateway_process(entry=entry) as gw:
            images = await prepared(gw, work / "gw", args.fork_mb)
            kinds = {"snapshot": images["cold_snapshot_full"], "plain": images["cold_plain"]}
            for turn in range(args.repeats):
                order = list(kinds.items()) if turn % 2 == 0 else list(kinds.items())[::-1]
                if args.bench_order:
                    for position, (kind, sample) in enumerate(await bench_turn(gw, turn, order, args), start=1):
                        sample["turn"] = turn
                        rows[f"{kind}_{'first' if position == 1 else 'second'}"].append(sample)
                    continue
                if not args.no_fork:
                    fork = await one_fork(gw, "parent-full", f"f{turn}")
                    forks.append({"wall_ms": fork["wall_ms"], "cpu_ms": fork["cpu_ms"]})
                for position, (kind, image) in enumerate(order, start=1):
                    sample = await measured_create(gw, f"{kind}-{turn}", image)
                    sample["turn"] = turn
                    rows[f"{kind}_{'first' if position == 1 else 'second'}"].append(sample)
    load = os.getloadavg()[0]
    return {
        "rows": dict(rows),
        "forks": forks,
        "load": load,
        "no_fork": args.no_fork,
        "bench_order": args.bench_order,
        "keep_warm_ms": args.keep_warm_ms,
    }


def p50_cells(rows: dict[str, list[dict[str, Any]]], keys: list[str], value: Any) -> str:
    """One table row's cells: the p50 of `value(sample)` in each column."""
    return " | ".join(f"{p50([value(s) for s in rows[k]]):.1f}" for k in keys)


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(data: dict[str, Any]) -> str:
    rows = data["rows"]
    keys = [k for k in ("snapshot_first", "plain_first", "snapshot_second", "plain_second") if k in rows]
    head = "| step | " + " | ".join(f"{k} p50 ms" for k in keys) + " |"
    lines = [head, "|---" * (len(keys) + 1) + "|"]
    lines.append("| wall | " + " | ".join(f"{p50([s['wall_ms'] for s in rows[k]]):.1f}" for k in keys) + " |")
    for step in CHILD_STEPS:
        cells = [p50([s["steps"][step] for s in rows[k] if step in s["steps"]]) for k in keys]
        if not all(c != c for c in cells):
            lines.append(f"| {step} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    lines.append(
        "| exec -> hello | "
        + " | ".join(
            f"{p50([s['steps']['hello'] - s['steps']['exec'] for s in rows[k] if 'hello' in s['steps']]):.1f}"
            for k in keys
        )
        + " |"
    )
    threads = sorted({n for k in keys for s in rows[k] for n in s["cpu_ms"]})
    for name in threads:
        lines.append(f"| CPU: {name} | {p50_cells(rows, keys, lambda s, n=name: s['cpu_ms'].get(n, 0.0))} |")
    for name in sorted(rows[keys[0]][0]["host"]):
        lines.append(f"| host: {name} | {p50_cells(rows, keys, lambda s, n=name: s['host'][n])} |")
    span = "the create alone" if data.get("bench_order") else "the create, its delete and the reap"
    lines += ["", f"Samples per column: {len(rows[keys[0]])}. The host rows span {span}."]
    if data["forks"]:
        fork = p50([f["wall_ms"] for f in data["forks"]])
        lines.append(f"fork(10) of the 200 MB parent before each pair: wall p50 {fork:.1f} ms.")
    snap = {s["turn"]: s["wall_ms"] for k in keys if k.startswith("snapshot") for s in rows[k]}
    plain = {s["turn"]: s["wall_ms"] for k in keys if k.startswith("plain") for s in rows[k]}
    both = sorted(set(snap) & set(plain))
    for label, turns in (("snapshot first", both[0::2]), ("plain first", both[1::2]), ("all", both)):
        ratios = sorted(snap[t] / plain[t] for t in turns)
        if ratios:
            spread = f"{ratios[0]:.2f}-{ratios[-1]:.2f}"
            lines.append(f"- snapshot/plain wall in one turn, {label}: p50 {p50(ratios):.2f}x ({spread})")
    lines.append(f"\nLoad (1 min) at the end: {data['load']:.1f}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--fork-mb", type=int, default=200)
    parser.add_argument("--name", default="cold_order")
    parser.add_argument("--no-fork", action="store_true", help="the two cold creates alone each turn")
    parser.add_argument(
        "--bench-order", action="store_true", help="bench/snapshots.py's turn: both forks, creates back to back"
    )
    parser.add_argument("--settle-ms", type=float, default=0.0, help="with --bench-order: a pause after the forks")
    parser.add_argument("--warmup", action="store_true", help="with --bench-order: an uncounted create before the pair")
    parser.add_argument("--keep-warm-ms", type=float, default=0.0, help="a cgroup.procs write every N ms meanwhile")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: images of the image store need a gateway run as root")
    with tempfile.TemporaryDirectory(prefix="ws-cold-order-") as tmp:
        data = asyncio.run(measure(args, Path(tmp)))
    write_results(args.name, data, table(data))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
