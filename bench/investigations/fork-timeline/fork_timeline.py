"""Issue 31: where a fork(10)'s wall time goes, step by step, and where one cold create of a
snapshot's image goes beside one of a plain image.

    python bench/investigations/fork-timeline/fork_timeline.py [--repeats 10] [--fork-mb 200]
        [--name fork_timeline] [--cold-only] [--versus SRC] [--untraced]

One gateway (run as root, under `traced_gateway.py` unless `--untraced`) with the benchmark's
images (`bench/snapshots.py`: the small tools image) and two fork parents (an empty /workspace,
`--fork-mb` MB in it). Each turn, in this order: fork(10) of the empty parent, fork(10) of the
full one, then a cold create -> Ready of the plain image, of the empty parent's snapshot and of
the full parent's (each a tagged snapshot taken once; which of the three goes first rotates
each turn; `--cold-only`: no forks). After each call the gateway's stamps are
read (SIGUSR2) and lined up with the client's own clock (the call's start, unix us): every step
as milliseconds from the call's start, p50 over the turns; for a fork's ten children the first,
the median and the last child to reach each step. Beside them: the gateway's CPU over the call
per thread (by name: the event loop, the spawner threads, asyncio's `to_thread` workers, gRPC's)
from `/proc/<pid>/task/*/schedstat`, and how many spawner threads were busy at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness and the benchmarks reused here

from harness import GatewayProcess, gateway_process, write_results
from snapshots import SMALL, fork_parents, import_images, prune, snapshot

from warmshell.api.v1 import sandbox_pb2 as pb

SNAPSHOT_STEPS = ("take", "thread", "begun", "frozen", "captured", "thawed", "committed", "returned")
CHILD_STEPS = (
    "create",
    "inserted",
    "driver",
    "hop",
    "thread",
    "prepared",
    "exec",
    "hello",
    "driver_done",
    "registered",
    "activated",
    "ready",
    "release_begin",
    "store_sent",
    "store_done",
    "released",
    "settled",
)


def now_us() -> int:
    return time.time_ns() // 1000


def thread_cpu_ms(pid: int) -> dict[str, float]:
    """The gateway's CPU so far per kind of thread (names without their numbers; Python's own
    threads keep the process's name: the main thread is the event loop, the others `to_thread`
    workers and the like), and `sandboxes`: what its reaped children used (bwrap, the launcher
    and, reaped by bwrap, the agent and its commands)."""
    found: dict[str, float] = defaultdict(float)
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            name = re.sub(r"[_-]?\d+$", "", (task / "comm").read_text().strip()) or "?"
            if name.startswith("python"):
                name = "event loop" if task.name == str(pid) else "other python threads"
            found[name] += int((task / "schedstat").read_text().split()[0]) / 1e6
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    found["sandboxes"] = sum(int(f) for f in fields[13:15]) * 1000 / os.sysconf("SC_CLK_TCK")
    return dict(found)


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before.get(name, 0.0) for name in after if after[name] - before.get(name, 0.0) > 0.05}


async def reaped(gw: GatewayProcess, before: dict[str, float], cpu: dict[str, float]) -> None:
    """Set `cpu["sandboxes"]`: the CPU of the sandboxes started since `before`, once the deletes
    have reaped them (their whole lives: start, idle, stop; clock ticks)."""
    for _ in range(100):
        now = thread_cpu_ms(gw.process.pid)
        if now["sandboxes"] > before["sandboxes"]:
            break
        await asyncio.sleep(0.01)
    cpu["sandboxes"] = now["sandboxes"] - before["sandboxes"]


async def stamps(gw: GatewayProcess) -> dict[str, Any]:
    """The traced gateway's stamps since the last read (empty when untraced: a plain gateway
    has no handler for SIGUSR2, whose default action would end it)."""
    if not any(str(arg).endswith("traced_gateway.py") for arg in gw.process.args):
        return {"snapshots": [], "children": {}}
    target = gw.state / "trace.json"
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
    gw.process.send_signal(signal.SIGUSR2)
    for _ in range(200):
        if target.exists():
            data: dict[str, Any] = json.loads(target.read_text())
            return data
        await asyncio.sleep(0.01)
    return {"snapshots": [], "children": {}}


def child_steps(traced: dict[str, int], timeline: pb.Timeline, start: int) -> dict[str, float]:
    """One child's steps, ms from `start` (the record's own timeline for registered, activated
    and ready)."""
    steps = {step: (at - start) / 1000 for step, at in traced.items()}
    for step in ("registered", "activated", "ready"):
        at = getattr(timeline, f"{step}_us")
        if at:
            steps[step] = (at - start) / 1000
    return steps


def busy_spawners(children: list[dict[str, float]]) -> int:
    """The most children ever between `thread` and `exec` at once (spawner threads busy)."""
    edges = sorted(
        [(c["thread"], 1) for c in children if "thread" in c and "exec" in c]
        + [(c["exec"], -1) for c in children if "thread" in c and "exec" in c]
    )
    most = busy = 0
    for _, change in edges:
        busy += change
        most = max(most, busy)
    return most


async def one_fork(gw: GatewayProcess, parent: str, prefix: str) -> dict[str, Any]:
    before = thread_cpu_ms(gw.process.pid)
    start = now_us()
    request = pb.ForkSandboxRequest(name=parent, count=10, prefix=prefix, ready_timeout_ms=120_000)
    response = await gw.stub.ForkSandbox(request, metadata=gw.metadata, timeout=300)
    end = now_us()
    cpu = cpu_delta(before, thread_cpu_ms(gw.process.pid))
    traced = await stamps(gw)
    snap = traced["snapshots"][-1] if traced["snapshots"] else {}
    children = [
        child_steps(traced["children"].get(c.sandbox.id, {}), c.sandbox.status.timeline, start)
        for c in response.children
    ]
    for child in response.children:
        await gw.delete(child.name)
    await prune(gw)
    await reaped(gw, before, cpu)
    await stamps(gw)  # the deletes' stamps are not the next call's
    return {
        "wall_ms": (end - start) / 1000,
        "snapshot": {step: (at - start) / 1000 for step, at in snap.items()},
        "children": children,
        "busy_spawners": busy_spawners(children),
        "cpu_ms": cpu,
    }


async def one_create(gw: GatewayProcess, name: str, image: str) -> dict[str, Any]:
    before = thread_cpu_ms(gw.process.pid)
    start = now_us()
    ready = await gw.create_ready(name=name, spec=pb.SandboxSpec(image=image))
    end = now_us()
    cpu = cpu_delta(before, thread_cpu_ms(gw.process.pid))
    traced = await stamps(gw)
    steps = child_steps(traced["children"].get(ready.id, {}), ready.status.timeline, start)
    await gw.delete(name)
    await reaped(gw, before, cpu)
    await stamps(gw)
    return {"wall_ms": (end - start) / 1000, "steps": steps, "cpu_ms": cpu}


async def prepared(gw: GatewayProcess, work: Path, fork_mb: int) -> dict[str, str]:
    """The gateway's images and fork parents; the three images a cold create is timed on."""
    work.mkdir()
    await asyncio.to_thread(import_images, gw.state, work, 1)
    await fork_parents(gw, fork_mb)
    _, empty = await snapshot(gw, "parent-empty", "bench/empty-snap:1")
    _, full = await snapshot(gw, "parent-full", "bench/full-snap:1")
    await stamps(gw)
    return {"cold_plain": SMALL, "cold_snapshot_empty": empty.digest, "cold_snapshot_full": full.digest}


async def one_turn(gw: GatewayProcess, turn: int, cold: dict[str, str], args: argparse.Namespace, into: Any) -> None:
    """One turn on one gateway: the two forks (unless `--cold-only`), then the three cold creates,
    which of them goes first rotating with the turn."""
    if not args.cold_only:
        into["forks"]["fork10_empty"].append(await one_fork(gw, "parent-empty", f"e{turn}"))
        into["forks"][f"fork10_{args.fork_mb}mb"].append(await one_fork(gw, "parent-full", f"f{turn}"))
    order = list(cold.items())
    order = order[turn % len(order) :] + order[: turn % len(order)]
    for key, image in order:
        into["creates"][key].append(await one_create(gw, f"{key.replace('_', '-')}-{turn}", image))


async def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Each tree's samples (this one; with `--versus DIR` also that `src/`, both gateways up at
    once, taking turns: which goes first alternates)."""
    entry = None if args.untraced else Path(__file__).with_name("traced_gateway.py")
    trees = {"this": None, **({"versus": args.versus} if args.versus else {})}
    data: dict[str, Any] = {}
    async with contextlib.AsyncExitStack() as stack:
        gateways = {}
        for side, src in trees.items():
            gw = await stack.enter_async_context(gateway_process(entry=entry, src=src))
            gateways[side] = (gw, await prepared(gw, work / side, args.fork_mb))
            data[side] = {"forks": defaultdict(list), "creates": defaultdict(list)}
        for turn in range(args.repeats):
            sides = list(gateways.items())
            for side, (gw, cold) in sides if turn % 2 == 0 else sides[::-1]:
                await one_turn(gw, turn, cold, args, data[side])
    data["load"] = os.getloadavg()[0]
    return data


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cpu_rows(samples: list[dict[str, Any]]) -> str:
    names = sorted({name for s in samples for name in s["cpu_ms"]})
    return ", ".join(f"{name} {p50([s['cpu_ms'].get(name, 0.0) for s in samples]):.1f}" for name in names)


def fork_table(key: str, samples: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"### {key} ({len(samples)} forks; wall p50 {p50([s['wall_ms'] for s in samples]):.1f} ms)",
        "",
        "| step | first child p50 ms | median child p50 ms | last child p50 ms |",
        "|---|---|---|---|",
    ]
    for step in SNAPSHOT_STEPS:
        values = [s["snapshot"][step] for s in samples if step in s["snapshot"]]
        if values:
            lines.append(f"| snapshot: {step} | {p50(values):.1f} | | |")
    for step in CHILD_STEPS:
        per_fork = [sorted(c[step] for c in s["children"] if step in c) for s in samples]
        per_fork = [v for v in per_fork if v]
        if per_fork:
            first, mid, last = (p50([v[i] for v in per_fork]) for i in (0, len(per_fork[0]) // 2, -1))
            lines.append(f"| child: {step} | {first:.1f} | {mid:.1f} | {last:.1f} |")
    busy = p50([float(s["busy_spawners"]) for s in samples])
    lines += ["", f"Spawner threads busy at once, p50 of the most: {busy:.0f}. "]
    lines += [f"Gateway CPU over the call by thread, p50 ms: {cpu_rows(samples)}.", ""]
    return lines


def create_table(creates: dict[str, list[dict[str, Any]]]) -> list[str]:
    keys = list(creates)
    lines = ["| step | " + " | ".join(f"{k} p50 ms" for k in keys) + " |", "|---" * (len(keys) + 1) + "|"]
    lines.append("| wall | " + " | ".join(f"{p50([s['wall_ms'] for s in creates[k]]):.1f}" for k in keys) + " |")
    for step in CHILD_STEPS:
        cells = []
        for key in keys:
            values = [s["steps"][step] for s in creates[key] if step in s["steps"]]
            cells.append(f"{p50(values):.1f}" if values else "")
        if any(cells):
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines.append("")
    for key in keys:
        lines.append(f"- {key}: gateway CPU by thread, p50 ms: {cpu_rows(creates[key])}")
    return lines


def table(data: dict[str, Any], args: argparse.Namespace) -> str:
    lines = []
    for side in ("this", "versus"):
        if side not in data:
            continue
        if side == "versus":
            lines += [f"# The gateway of `{args.versus}`, taking turns with this tree's", ""]
        lines += ["## fork(10): steps in ms from the call's start", ""]
        for key, samples in data[side]["forks"].items():
            lines += fork_table(key, samples)
        lines += ["## One cold create -> Ready: steps in ms from the call's start", ""]
        lines += create_table(data[side]["creates"])
        lines.append("")
    lines += [f"Load (1 min) at the end: {data['load']:.1f}."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--fork-mb", type=int, default=200)
    parser.add_argument("--name", default="fork_timeline")
    parser.add_argument("--cold-only", action="store_true", help="the cold creates alone, no forks")
    parser.add_argument("--versus", type=Path, help="also a gateway of this src/ directory, taking turns")
    parser.add_argument("--untraced", action="store_true", help="a plain gateway: CPU and wall, no steps")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: images of the image store need a gateway run as root")
    with tempfile.TemporaryDirectory(prefix="ws-fork-timeline-") as tmp:
        data = asyncio.run(measure(args, Path(tmp)))
    write_results(args.name, data, table(data, args))


if __name__ == "__main__":
    main()
