"""Issue 14: the gateway's share of a local member start, measured on a pool fill alone.

    python bench/investigations/member-start/member_fill.py [--size 200] [--rounds 3] [--before-src DIR]
        [--trace] [--py-spy FILE] [--cprofile FILE]

Each round starts a real gateway (a subprocess, real bwrap'd members, host-side supervisors in
the gateway process) per source tree, this one and `--before-src DIR` (e.g. `git archive <commit>
src` with its agent and launcher built), alternating. In each gateway:

1. a warm-up pool of 8 is filled and drained (first-start work: the staged /etc, imports);
2. **fill**: a fresh pool of `--size` is written and the clock runs until all are idle
   (registered): members/s, and the gateway's CPU per member start from
   `/proc/<pid>/task/*/schedstat` (exact ns), per thread by name (the event loop, the spawner,
   asyncio's `to_thread` workers, gRPC's threads), plus the tail it spends in the moment after
   the last registration; the members' own processes (bwrap, agent) apart;
3. **drain**: the profile is removed and the clock runs until every member process is gone and
   its files removed: the gateway's CPU per member stop, per thread.

The fill's window is also read for the whole machine: /proc/stat's busy, idle and steal time
against the CPU charged to the gateway, its members, each kind of kernel thread (kworkers, RCU,
ksoftirqd: work no process is charged for), this benchmark and every other process on the
machine, so a fill that does not keep both cores busy shows it, and the rate between the 10th and
90th percent of the fill apart from the first member's wait (the gateway sees a new profile at
its next pools-directory poll, up to `pool_reload_interval_seconds` = 0.2 s after it is written:
a refill after a claim does not wait for that). `--trace` runs the gateways under
`traced_gateway.py` and times every start's steps: waiting for a spawn slot, for the spawner
thread, in it, bwrap and the agent until the hello, the hello to the registration.

Nothing else runs in the gateway during a window: no creates, no client but this one polling
ListPools every 50 ms (its cost is in the figures: ~0.1 ms per member at 100 members/s). The idle
members' liveness checks are moved out of the way (`local.member_check_seconds = 600`).

`--py-spy FILE` samples every thread of the *now* gateway during its fills and, apart, its drains
(collapsed stacks per round); `--cprofile FILE` runs the *now* gateway under
`profiled_gateway.py` and records its event loop during the fills only (`--cprofile-window
drain`: the drains; thread CPU clock).
Profiling inflates the figures of the rounds it runs in: read those for where the time goes,
the unprofiled ones for how much.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness and the benchmarks reused here

from burst import cpu_ns, load
from harness import GatewayProcess, gateway_process, write_results
from warm_path import descendants, idle_members, write_profile

FILL_ENV = {"POOL": "fill"}
WARMUP = 8
POLL = 0.05


TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


def threads_ns(pid: int) -> dict[str, int]:
    """CPU ns of each thread of `pid`, grouped by name ("loop" for the main thread, numbers and
    `_` stripped from the others: `asyncio_3` and `asyncio_7` are both `asyncio`), from schedstat
    (exact); `<name>:system` is the kernel's share of it from the tick-sampled stat (coarse)."""
    out: collections.Counter[str] = collections.Counter()
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as handle:
                ns = int(handle.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/comm") as handle:
                name = handle.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as handle:
                system_ticks = int(handle.read().rsplit(")", 1)[1].split()[12])
        except (OSError, ValueError, IndexError):
            continue
        group = "loop" if int(tid) == pid else re.sub(r"[_\-]?\d+$", "", name) or name
        out[group] += ns
        out[f"{group}:system"] += int(system_ticks * TICK_NS)
    return dict(out)


STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")


def machine_stat() -> dict[str, int]:
    """The whole machine's CPU time so far by kind (ns, summed over the CPUs) from /proc/stat:
    what ran whether or not a process is charged for it (kworkers, softirq, a namespace's
    teardown), and the time the hypervisor gave to other guests (steal)."""
    with open("/proc/stat") as handle:
        ticks = handle.readline().split()[1:]
    return {name: int(int(value) * TICK_NS) for name, value in zip(STAT_FIELDS, ticks, strict=False)}


def tasks_ns() -> dict[int, tuple[int, str, int, int]]:
    """Every process on the machine: pid -> (parent pid, name, CPU ns of all its threads, CPU ns
    of the children it reaped: tick-sampled)."""
    out: dict[int, tuple[int, str, int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                head, _, rest = handle.read().rpartition(")")
            fields = rest.split()
            ppid, reaped = int(fields[1]), int((int(fields[13]) + int(fields[14])) * TICK_NS)
            name = head.partition("(")[2]
            ns = 0
            for tid in os.listdir(f"/proc/{entry}/task"):
                with open(f"/proc/{entry}/task/{tid}/schedstat") as handle:
                    ns += int(handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry)] = (ppid, name, ns, reaped)
    return out


def machine_split(
    before: tuple[dict[str, int], dict[int, tuple[int, str, int, int]]],
    after: tuple[dict[str, int], dict[int, tuple[int, str, int, int]]],
    gateway: int,
    members: set[int],
) -> dict[str, float]:
    """Where the machine's CPU went in a window, in ns: /proc/stat's kinds, and the CPU charged
    to the gateway, its members, each kind of kernel thread, this benchmark and every other
    process; `uncharged` is the busy time no process alive at the end is charged with (processes
    that started and ended meanwhile, anyone's, and interrupts)."""
    stat_before, tasks_before = before
    stat_after, tasks_after = after
    out: dict[str, float] = {f"stat:{k}": stat_after[k] - stat_before[k] for k in STAT_FIELDS}
    out["busy"] = sum(out[f"stat:{k}"] for k in BUSY_FIELDS)
    charged = collections.Counter[str]()
    me = os.getpid()
    for pid, (ppid, name, ns, reaped) in tasks_after.items():
        delta = ns - tasks_before[pid][2] if pid in tasks_before else ns
        if pid == gateway or pid in members:  # what ran in a process of theirs that ended meanwhile
            earlier = tasks_before[pid][3] if pid in tasks_before else 0
            charged["reaped by the gateway and members"] += reaped - earlier
        if pid == gateway:
            group = "gateway"
        elif pid in members:
            group = "members"
        elif pid == 2 or ppid == 2:
            group = "kthread:" + (re.sub(r"[/:\-]?\d.*$", "", name) or name)
        elif pid == me:
            group = "benchmark"
        else:
            group = "other processes"
        charged[group] += delta
    out |= {f"charged:{k}": float(v) for k, v in charged.items()}
    out["charged"] = float(sum(charged.values()))
    out["uncharged"] = out["busy"] - out["charged"]
    out["ended_processes"] = float(len(set(tasks_before) - set(tasks_after)))
    return out


def total(threads: dict[str, int]) -> int:
    return sum(ns for name, ns in threads.items() if not name.endswith(":system"))


def minus(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {name: ns - before.get(name, 0) for name, ns in after.items() if ns - before.get(name, 0) > 0}


async def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL)


async def quiet(gw: GatewayProcess, limit_s: float = 5.0) -> float:
    """Wait until the gateway spends under 2 ms of CPU per 100 ms (at most `limit_s`); seconds waited."""
    start = time.monotonic()
    previous = cpu_ns(gw.process.pid)
    while time.monotonic() - start < limit_s:
        await asyncio.sleep(0.1)
        now = cpu_ns(gw.process.pid)
        if now - previous < 2_000_000:
            break
        previous = now
    return time.monotonic() - start


async def _exists(path: Path) -> bool:
    return path.exists()


class Windows:
    """What runs around each measured window (profilers); nothing by default."""

    def open(self, window: str) -> None:
        pass

    def close(self, window: str) -> None:
        pass


async def fill_and_drain(
    gw: GatewayProcess, pools: Path, size: int, pool: str, windows: Windows | None = None
) -> dict[str, Any]:
    """Fill a fresh pool of `size`, then drain it; the gateway's CPU in each window."""
    windows = windows or Windows()
    pid = gw.process.pid
    known = descendants(pid)
    await quiet(gw)
    windows.open("fill")
    machine_before = (machine_stat(), tasks_ns())
    threads_before, start = threads_ns(pid), time.perf_counter()
    write_profile(pools, pool, size, FILL_ENV)
    samples: list[tuple[float, int, dict[str, int]]] = []  # (s since start, idle members, /proc/stat)

    async def filled() -> bool:
        idle = await idle_members(gw, pool)
        samples.append((time.perf_counter() - start, idle, machine_stat()))
        return idle >= size

    await wait_until(filled, max(300, size), f"{size} idle members")
    wall = time.perf_counter() - start
    threads_filled = threads_ns(pid)
    machine_after = (machine_stat(), tasks_ns())
    windows.close("fill")
    members = descendants(pid) - known
    member_ns = sum(cpu_ns(p) for p in members)
    machine = machine_split(machine_before, machine_after, pid, members)
    await quiet(gw)
    threads_settled = threads_ns(pid)

    instances = gw.state / "instances"
    windows.open("drain")
    threads_drain_start = threads_ns(pid)
    (pools / f"{pool}.toml").unlink()
    drain_start = time.perf_counter()

    async def drained() -> bool:
        gone = not (descendants(pid) & members)
        return gone and not any(instances.glob("*.json"))

    await wait_until(drained, 300, "the pool's members to stop")
    drain_wall = time.perf_counter() - drain_start
    await quiet(gw)
    threads_drained = threads_ns(pid)
    windows.close("drain")
    fill_threads = minus(threads_filled, threads_before)
    tail = minus(threads_settled, threads_filled)
    drain_threads = minus(threads_drained, threads_drain_start)
    return {
        "size": size,
        "fill_start": start,
        "wall_s": wall,
        "members_per_s": size / wall,
        "gateway_cpu_ms_per_start": total(fill_threads) / 1e6 / size,
        "gateway_loop_cpu_ms_per_start": fill_threads.get("loop", 0) / 1e6 / size,
        "gateway_threads_cpu_ms_per_start": (total(fill_threads) - fill_threads.get("loop", 0)) / 1e6 / size,
        "gateway_tail_cpu_ms_per_start": total(tail) / 1e6 / size,
        "member_cpu_ms_per_start": member_ns / 1e6 / size,
        "fill_threads_ms_per_start": {k: v / 1e6 / size for k, v in sorted(fill_threads.items())},
        "drain_wall_s": drain_wall,
        "gateway_cpu_ms_per_stop": total(drain_threads) / 1e6 / size,
        "drain_threads_ms_per_stop": {k: v / 1e6 / size for k, v in sorted(drain_threads.items())},
        "load": load(),
        "machine_ms_per_start": {k: v / 1e6 / size for k, v in sorted(machine.items()) if k != "ended_processes"},
        "machine_ended_processes": machine["ended_processes"],
        "machine_busy_cores": machine["busy"] / 1e9 / wall,
        "machine_steal_cores": machine["stat:steal"] / 1e9 / wall,
        "steady": steady(samples, size),
    }


def steady(samples: list[tuple[float, int, dict[str, int]]], size: int) -> dict[str, float]:
    """The fill between its 10th and 90th percent of members (past the first starts, before the
    last stragglers): members/s there and how busy the machine's cores were, from the polls."""
    low = next((s for s in samples if s[1] >= size * 0.1), None)
    high = next((s for s in samples if s[1] >= size * 0.9), None)
    if low is None or high is None or high[0] <= low[0]:
        return {}
    seconds = high[0] - low[0]
    busy = sum(high[2][k] - low[2][k] for k in BUSY_FIELDS) / 1e9
    idle = sum(high[2][k] - low[2][k] for k in ("idle", "iowait")) / 1e9
    return {
        "first_member_s": next((s[0] for s in samples if s[1] > 0), float("nan")),
        "members_per_s": (high[1] - low[1]) / seconds,
        "busy_cores": busy / seconds,
        "idle_cores": idle / seconds,
        "steal_cores": (high[2]["steal"] - low[2]["steal"]) / 1e9 / seconds,
    }


class PySpy(Windows):
    """py-spy sampling every thread of a process during each window, one file per window kind
    (`FILE` for the fills, `FILE` with `.drain` before its suffix for the drains)."""

    def __init__(self, pid: int, out: Path) -> None:
        self._pid, self._out, self._parts = pid, out, 0
        self._process: subprocess.Popen[bytes] | None = None

    def _file(self, window: str) -> Path:
        return self._out if window == "fill" else self._out.with_suffix(f".{window}{self._out.suffix}")

    def open(self, window: str) -> None:
        part = self._file(window).with_suffix(f".part{self._parts}")
        self._parts += 1
        command = ["py-spy", "record", "--pid", str(self._pid), "--threads", "--nonblocking", "--rate", "250"]
        command += ["--format", "raw", "--output", str(part)]
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached before the window opens

    def close(self, window: str) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGINT)
            self._process.wait(timeout=60)
            self._process = None

    def merge(self) -> None:
        """Sum each window kind's parts into its file (collapsed stacks, most samples first)."""
        for window in ("fill", "drain"):
            final = self._file(window)
            stacks: collections.Counter[str] = collections.Counter()
            for part in sorted(final.parent.glob(final.stem + ".part*")):
                for line in part.read_text().splitlines():
                    stack, _, count = line.rpartition(" ")
                    if stack:
                        stacks[stack] += int(count)
                part.unlink()
            final.write_text("".join(f"{stack} {count}\n" for stack, count in stacks.most_common()))


class CProfileWindows(Windows):
    """`profiled_gateway.py`'s signals: record the event loop in one kind of window only."""

    def __init__(self, process: subprocess.Popen[bytes], window: str) -> None:
        self._process, self._window = process, window

    def open(self, window: str) -> None:
        if window == self._window:
            self._process.send_signal(signal.SIGUSR1)

    def close(self, window: str) -> None:
        if window == self._window:
            self._process.send_signal(signal.SIGUSR2)


STEPS = (
    ("queued", "slot", "waiting for a spawn slot"),
    ("slot", "hop", "slot to the spawner hop (the instance, its uid, the fleet)"),
    ("hop", "thread", "queued for the spawner thread"),
    ("thread", "exec", "the spawner thread's work (directories, cgroup, /etc check, Popen)"),
    ("exec", "hello", "bwrap and the agent until its hello"),
    ("hello", "registered", "the hello to the supervisor's registration"),
    ("queued", "registered", "the whole start"),
)


def trace_steps(stamps: dict[str, dict[str, float]], start: float, wall: float) -> dict[str, Any]:
    """Per step of a start (`traced_gateway.py`'s stamps of the members queued in the fill): its
    p50 / p90 in ms, and how many members were in it on average over the fill (its summed time
    over the fill's wall time: the spawner thread's utilisation for its own step)."""
    runs = [s for s in stamps.values() if start <= s.get("queued", 0.0) <= start + wall and "registered" in s]
    out: dict[str, Any] = {"members": len(runs)}
    if runs:
        first = min(s["queued"] for s in runs)
        out["first_queued_s"] = first - start
        out["members_per_s"] = len(runs) / (max(s["registered"] for s in runs) - first)
    for first, last, _ in STEPS:
        spans = sorted((s[last] - s[first]) * 1e3 for s in runs if first in s and last in s)
        if spans:
            out[f"{first}-{last}"] = {
                "p50_ms": statistics.median(spans),
                "p90_ms": spans[int(len(spans) * 0.9)],
                "in_flight": sum(spans) / 1e3 / wall,
            }
    return out


async def one_gateway(args: argparse.Namespace, tree: str, src: Path | None, round_: int) -> dict[str, Any]:
    profiled = tree == "now"
    cprofile = args.cprofile if profiled and args.cprofile else None
    with tempfile.TemporaryDirectory(prefix="ws-member-fill-") as tmp:
        pools = Path(tmp) / "pools"
        pools.mkdir()
        config = Path(tmp) / "gateway.toml"
        config.write_text(
            f"[local]\nmax_pool_replicas = {max(args.size, WARMUP)}\npool_reload_interval_seconds = 0.2\n"
            "member_check_seconds = 600\n"
        )
        env = {"PYTHONPATH": str(src)} if src else {}
        trace = Path(tmp) / "trace.json"
        entry = Path(__file__).with_name("traced_gateway.py") if args.trace else None
        if args.trace:
            env["WARMSHELL_TRACE"] = str(trace)
        gateway = gateway_process(
            "--pools", str(pools), "--config", str(config), cprofile=cprofile, env=env, entry=entry
        )
        async with gateway as gw:
            await fill_and_drain(gw, pools, WARMUP, "warmup")
            windows: Windows | None = None
            if profiled and args.py_spy:
                windows = PySpy(gw.process.pid, args.py_spy.with_suffix(f".r{round_}{args.py_spy.suffix}"))
            elif cprofile:
                windows = CProfileWindows(gw.process, args.cprofile_window)
            result = await fill_and_drain(gw, pools, args.size, f"fill{round_}", windows)
            if isinstance(windows, PySpy):
                windows.merge()
            if args.trace:
                gw.process.send_signal(signal.SIGUSR2)
                await wait_until(lambda: _exists(trace), 10, "the gateway's trace")
                result["steps"] = trace_steps(json.loads(trace.read_text()), result["fill_start"], result["wall_s"])
    return result | {"tree": tree, "round": round_, "profiled": bool(cprofile or (profiled and args.py_spy))}


METRICS = (
    ("members_per_s", "members/s", 1),
    ("gateway_cpu_ms_per_start", "gateway CPU ms per member start", 2),
    ("gateway_loop_cpu_ms_per_start", "… its event loop", 2),
    ("gateway_threads_cpu_ms_per_start", "… its other threads", 2),
    ("gateway_tail_cpu_ms_per_start", "gateway CPU ms per start after the last registration", 2),
    ("member_cpu_ms_per_start", "member processes' CPU ms per start (bwrap, agent)", 2),
    ("gateway_cpu_ms_per_stop", "gateway CPU ms per member stop (drain)", 2),
)


def table(data: dict[str, Any]) -> str:
    runs = [r for r in data["runs"] if not r["profiled"]] or data["runs"]
    trees = [t for t in ("now", "before") if any(r["tree"] == t for r in runs)]
    med = {t: {k: statistics.median(r[k] for r in runs if r["tree"] == t) for k, _, _ in METRICS} for t in trees}
    n = {t: sum(1 for r in runs if r["tree"] == t) for t in trees}
    rounds = ", ".join(f"{count} of {tree}" for tree, count in n.items())
    out = f"A fresh pool of {data['size']} filled, then drained, in a real gateway; "
    out += f"medians of the unprofiled rounds ({rounds})"
    out += ", trees alternating.\n\n" if len(trees) > 1 else ".\n\n"
    out += "| figure | " + " | ".join(trees) + (" | now / before |" if len(trees) > 1 else " |") + "\n"
    out += "|---|" + "---|" * len(trees) + ("---|" if len(trees) > 1 else "") + "\n"
    for key, label, digits in METRICS:
        cells = [f"{med[t][key]:.{digits}f}" for t in trees]
        ratio = [f"{med['now'][key] / med['before'][key]:.2f}" if med["before"][key] else "-"] if len(trees) > 1 else []
        out += f"| {label} | " + " | ".join(cells + ratio) + " |\n"
    for window, key in (
        ("fill, per member start", "fill_threads_ms_per_start"),
        ("drain, per member stop", "drain_threads_ms_per_stop"),
    ):
        out += f"\nGateway CPU ms by thread, {window} (medians):\n\n| thread | " + " | ".join(trees) + " |\n"
        out += "|---|" + "---|" * len(trees) + "\n"
        names = sorted({name for r in runs for name in r[key]})
        for name in names:
            cells = [f"{statistics.median(r[key].get(name, 0.0) for r in runs if r['tree'] == t):.3f}" for t in trees]
            out += f"| {name} | " + " | ".join(cells) + " |\n"
    out += machine_table(runs, trees)
    if any("steps" in r for r in runs):
        out += steps_table(runs, trees)
    out += "\n| round | tree | members/s | gateway ms/start | loop | threads | ms/stop | load | profiled |\n"
    out += "|---|---|---|---|---|---|---|---|---|\n"
    for r in data["runs"]:
        out += (
            f"| {r['round']} | {r['tree']} | {r['members_per_s']:.1f} | {r['gateway_cpu_ms_per_start']:.2f} "
            f"| {r['gateway_loop_cpu_ms_per_start']:.2f} | {r['gateway_threads_cpu_ms_per_start']:.2f} "
            f"| {r['gateway_cpu_ms_per_stop']:.2f} | {r['load'][0]} | {'yes' if r['profiled'] else ''} |\n"
        )
    out += f"\nLoad average at start {data['load_start']}, at end {data['load_end']} (a shared 2-core machine).\n"
    return out


MACHINE_ROWS = (
    ("busy", "the whole machine's busy CPU (/proc/stat: user + nice + system + irq + softirq)"),
    ("charged:gateway", "… charged to the gateway"),
    ("charged:members", "… to the fill's members (bwrap, agent)"),
    ("kthreads", "… to kernel threads (kworkers, RCU, ksoftirqd, …)"),
    ("charged:reaped by the gateway and members", "… to processes of theirs that ended meanwhile"),
    ("uncharged", "… to no process alive at the end (anyone's that ended meanwhile, interrupts)"),
    ("charged:benchmark", "… to this benchmark (its ListPools polls)"),
    ("charged:other processes", "… to every other process (the other users of the machine)"),
    ("stat:softirq", "softirq (within the above)"),
    ("stat:steal", "steal (the hypervisor ran another guest)"),
)


def machine_table(runs: list[dict[str, Any]], trees: list[str]) -> str:
    """Whole-machine CPU per member start in the fill window, and the rates that bound the fill."""

    def value(run: dict[str, Any], key: str) -> float:
        split = run["machine_ms_per_start"]
        if key == "kthreads":
            return sum(v for k, v in split.items() if k.startswith("charged:kthread:"))
        return float(split.get(key, 0.0))

    out = "\nThe whole machine in the fill window, CPU ms per member start (medians):\n\n"
    out += "| figure | " + " | ".join(trees) + " |\n|---|" + "---|" * len(trees) + "\n"
    for key, label in MACHINE_ROWS:
        cells = [f"{statistics.median(value(r, key) for r in runs if r['tree'] == t):.2f}" for t in trees]
        out += f"| {label} | " + " | ".join(cells) + " |\n"
    rows = (
        ("cores busy (of 2) over the fill", lambda r: r.get("machine_busy_cores")),
        ("members/s between the 10th and 90th percent of the fill", lambda r: r["steady"].get("members_per_s")),
        ("… cores busy then", lambda r: r["steady"].get("busy_cores")),
        ("… cores idle then", lambda r: r["steady"].get("idle_cores")),
        ("the first member idle, s after the profile was written", lambda r: r["steady"].get("first_member_s")),
    )
    for label, get in rows:
        cells = []
        for t in trees:
            values = [v for r in runs if r["tree"] == t and (v := get(r)) is not None]
            cells.append(f"{statistics.median(values):.2f}" if values else "-")
        out += f"| {label} | " + " | ".join(cells) + " |\n"
    return out


def steps_table(runs: list[dict[str, Any]], trees: list[str]) -> str:
    """Each step of a start (`--trace`): p50 / p90 ms and the members in it on average."""
    out = (
        "\nEach member start's steps (`--trace`, medians over rounds): p50 / p90 ms, members in the step on average\n\n"
    )
    out += "| step | " + " | ".join(trees) + " |\n|---|" + "---|" * len(trees) + "\n"
    for first, last, label in STEPS:
        key = f"{first}-{last}"
        cells = []
        for t in trees:
            steps = [r["steps"][key] for r in runs if r["tree"] == t and key in r.get("steps", {})]
            if not steps:
                cells.append("-")
                continue
            p50, p90, flight = (statistics.median(s[k] for s in steps) for k in ("p50_ms", "p90_ms", "in_flight"))
            cells.append(f"{p50:.2f} / {p90:.2f}, {flight:.2f}")
        out += f"| {label} | " + " | ".join(cells) + " |\n"
    spans = (
        ("first_queued_s", "the first member queued (s since the profile was written)"),
        (
            "members_per_s",
            "members/s from the first queued to the last registered",
        ),
    )
    for key, label in spans:
        cells = []
        for t in trees:
            values = [r["steps"][key] for r in runs if r["tree"] == t and key in r.get("steps", {})]
            cells.append(f"{statistics.median(values):.3f}" if values else "-")
        out += f"| {label} | " + " | ".join(cells) + " |\n"
    return out


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    trees: dict[str, Path | None] = {"now": None, **({"before": args.before_src} if args.before_src else {})}
    data: dict[str, Any] = {"load_start": load(), "size": args.size, "runs": []}
    for round_ in range(args.rounds):
        for tree, src in trees.items():
            print(time.strftime("%H:%M:%S"), f"round {round_}: {tree}", file=sys.stderr, flush=True)
            data["runs"].append(await one_gateway(args, tree, src, round_))
    data["load_end"] = load()
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=200, help="members in the fresh pool (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each a gateway per tree (default 3)")
    parser.add_argument("--before-src", type=Path, help="also run the warmshell package under DIR, alternating")
    parser.add_argument("--py-spy", type=Path, help="sample the now gateway's fills with py-spy into FILE")
    parser.add_argument("--cprofile", type=Path, help="record the now gateway's event loop in its fills into FILE")
    parser.add_argument("--cprofile-window", choices=("fill", "drain"), default="fill", help="what --cprofile records")
    parser.add_argument("--trace", action="store_true", help="time each start's steps (traced_gateway.py)")
    parser.add_argument("--name", default="member_fill", help="writes results/NAME.{json,md} beside this script")
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        sys.exit("bubblewrap is needed")
    if args.py_spy and shutil.which("py-spy") is None:
        sys.exit("--py-spy needs py-spy on PATH")
    data = asyncio.run(measure(args))
    write_results(args.name, data, table(data))


if __name__ == "__main__":
    main()
