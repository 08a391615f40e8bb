"""Issue 14 (gateway side): the gateway's CPU per warm create, and where a burst's creates wait.

Gateway CPU is the gateway process's own utime + stime (`/proc/<pid>/stat`, all its threads: the
event loop, aiosqlite's worker, gRPC's pollers; the host-side supervisors of local sandboxes run
in it too) read around a batch of N creates and divided by N. Each create is what the SDK does:
one CreateSandbox that waits for Ready (`--create-and-watch`: CreateSandbox, then WatchSandbox
until Ready, as the CLI does). Pools are sized so that no member is spawned while
a batch runs (checked: the count of the gateway's descendant processes is reported), so refill
cost — lane 14a's, in its own processes — stays out of the figure. The cold creates of the same
run are the baseline (their CPU and latency, same gateway, same machine conditions).

Phases: cold (sequential, baseline), warm sequential, warm burst (B concurrent creates against an
idle pool of B: wall, per-create Ready p50/p99 and when each CreateSandbox RPC returned), and
optionally a tail run (`--tail N`: N sequential warm creates against a small pool that refills
all the time, p50/p99 and the ratio). `--py-spy FILE` records the gateway with py-spy during the
warm sequential batch (collapsed stacks) and prints where the time went.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness and the benchmarks reused here

from harness import GatewayProcess, gateway_process, gc_pauses, summary, write_results
from warm_path import descendants, idle_members, wait_idle, write_profile

from warmshell.api.v1 import sandbox_pb2 as pb

HZ = os.sysconf("SC_CLK_TCK")
BURST_ENV = {"POOL": "burst"}
TAIL_ENV = {"POOL": "tail"}
COLD_ENV = {"POOL": "none"}


def own_cpu_ms(pid: int) -> float:
    """utime + stime of the process itself (every thread; not its children)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / HZ


def thread_cpu_ms(pid: int) -> dict[str, float]:
    """CPU of each live thread of the process, by thread name (`comm`; threads of one name summed)."""
    result: collections.Counter[str] = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as handle:
                comm = handle.read().strip()
                name = "event loop" if int(tid) == pid else "other Python threads" if comm == "python" else comm
            with open(f"/proc/{pid}/task/{tid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        result[name] += (int(fields[11]) + int(fields[12])) * 1000 / HZ
    return dict(result)


def load() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


# How a create waits for Ready: in the create itself, as the SDK does (False: CreateSandbox then
# WatchSandbox, as the CLI and older clients do; `--create-and-watch`).
ONE_CALL = True


async def one_create(gw: GatewayProcess, name: str, env: dict[str, str], start: float) -> tuple[float, float, str]:
    """(ms until CreateSandbox returned, ms until Ready, allocation), both from `start`."""
    if ONE_CALL:
        ready = await gw.create_ready(name=name, spec=pb.SandboxSpec(environment=env))
        returned = (time.perf_counter() - start) * 1000
        return returned, returned, ready.status.allocation
    await gw.create(name=name, spec=pb.SandboxSpec(environment=env))
    returned = (time.perf_counter() - start) * 1000
    ready = await gw.wait_ready(name)
    return returned, (time.perf_counter() - start) * 1000, ready.status.allocation


async def quiet(gw: GatewayProcess, timeout: float = 15) -> None:
    """Wait until the gateway has been idle for a moment (the previous phase's deletes and pool
    drains finished), so a window counts only its own batch."""
    deadline = time.monotonic() + timeout
    before = own_cpu_ms(gw.process.pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        now = own_cpu_ms(gw.process.pid)
        if now - before <= 10:  # at most one clock tick in 300 ms
            return
        before = now


class Window:
    """Gateway CPU, processes, GC pauses and load around a batch."""

    def __init__(self, gw: GatewayProcess) -> None:
        self._gw = gw
        self._pid = gw.process.pid

    def __enter__(self) -> Window:
        self._gc = gc_pauses(self._gw)
        self.load_before = load()
        self._processes = len(descendants(self._pid))
        self._cpu = own_cpu_ms(self._pid)
        self._threads = thread_cpu_ms(self._pid)
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu_ms = own_cpu_ms(self._pid) - self._cpu
        after = thread_cpu_ms(self._pid)
        self.threads = {k: v - self._threads.get(k, 0.0) for k, v in after.items() if v - self._threads.get(k, 0.0)}
        self.wall_ms = (time.perf_counter() - self._wall) * 1000
        self.spawned = len(descendants(self._pid)) - self._processes
        after = gc_pauses(self._gw)
        self.gc = {key: after[key] - self._gc[key] for key in after}
        self.load_after = load()

    def result(self, count: int) -> dict:
        return {
            "gateway_cpu_ms_per_create": self.cpu_ms / count,
            "gateway_cpu_ms": self.cpu_ms,
            "gateway_cpu_ms_by_thread": self.threads,
            "wall_ms": self.wall_ms,
            "processes_added_during_batch": self.spawned,
            "gc": self.gc,
            "load_before": self.load_before,
            "load_after": self.load_after,
        }


class PySpy:
    """py-spy recording the gateway while a batch runs (raw collapsed stacks, one file per batch)."""

    def __init__(self, pid: int, path: str) -> None:
        self._pid, self._path, self._batches = pid, path, 0
        self.files: list[Path] = []

    async def __aenter__(self) -> None:
        output = Path(f"{self._path}.{self._batches}")
        self._batches += 1
        self.files.append(output)
        self._process = subprocess.Popen(
            [
                "py-spy",
                "record",
                "--pid",
                str(self._pid),
                "--rate",
                "1000",
                "--format",
                "raw",
                "--nonblocking",
                "--output",
                str(output),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        await asyncio.sleep(1.5)  # attached and sampling

    async def __aexit__(self, *exc: object) -> None:
        self._process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        await asyncio.to_thread(self._process.wait, 60)


class CProfile:
    """The gateway's cProfile (see `profiled_gateway.py`) recording while a batch runs; the
    statistics accumulate over batches in one file."""

    def __init__(self, pid: int, path: Path) -> None:
        self._pid, self.path = pid, path

    async def __aenter__(self) -> None:
        os.kill(self._pid, signal.SIGUSR1)
        await asyncio.sleep(0.2)

    async def __aexit__(self, *exc: object) -> None:
        mtime = self.path.stat().st_mtime_ns if self.path.exists() else 0
        os.kill(self._pid, signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while (not self.path.exists() or self.path.stat().st_mtime_ns == mtime) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.2)  # written


def cprofile_summary(path: Path, creates: int, top: int = 45) -> list[dict]:
    """The functions with the most own time: calls and own/inclusive µs per create."""
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    rows = []
    for (filename, line, function), (_, calls, own, inclusive, _) in stats.items():
        where = filename.rsplit("site-packages/", 1)[-1].rsplit("src/", 1)[-1]
        rows.append(
            {
                "function": f"{function} ({where}:{line})",
                "calls_per_create": calls / creates,
                "own_us_per_create": own * 1e6 / creates,
                "inclusive_us_per_create": inclusive * 1e6 / creates,
            }
        )
    return sorted(rows, key=lambda r: -r["own_us_per_create"])[:top]


Recorder = PySpy | CProfile


async def sequential(
    gw: GatewayProcess, label: str, count: int, env: dict[str, str], spy: Recorder | None = None
) -> dict:
    ready_ms, allocations = [], collections.Counter[str]()
    await quiet(gw)
    async with spy if spy is not None else contextlib.nullcontext():
        with Window(gw) as window:
            for i in range(count):
                _, ready, allocation = await one_create(gw, f"{label}-{i}", env, time.perf_counter())
                ready_ms.append(ready)
                allocations[allocation] += 1
    for i in range(count):
        await gw.delete(f"{label}-{i}")
    return {**window.result(count), "ready_ms": ready_ms, "allocations": allocations}


async def fill(gw: GatewayProcess, pools: Path, name: str, size: int, env: dict[str, str]) -> float:
    """Fill a fresh pool of `size`; the gateway's CPU per member started (polled slowly, so that
    the polling's own ListPools calls stay out of the figure)."""
    await quiet(gw)
    before = own_cpu_ms(gw.process.pid)
    write_profile(pools, name, size, env)
    deadline = time.monotonic() + 300
    while await idle_members(gw, name) < size:
        if time.monotonic() > deadline:
            raise RuntimeError(f"pool {name} never reached {size} idle members")
        await asyncio.sleep(0.25)
    await asyncio.sleep(0.5)  # let the fill settle
    return (own_cpu_ms(gw.process.pid) - before) / size


async def warm_rounds(gw: GatewayProcess, pools: Path, rounds: int, count: int, spy: Recorder | None) -> dict:
    """`rounds` batches of `count` sequential warm creates, each against a fresh pool large
    enough that every create is warm. The pool refills (one member at a time while creates run),
    so the batch's CPU includes member starts; the gateway's CPU per member start, measured on
    the round's own fill, gives the figure net of them."""
    total: dict = {"ready_ms": [], "allocations": collections.Counter(), "cpu": 0.0, "spawned": 0, "wall": 0.0,
                   "threads": collections.Counter(), "gc": collections.Counter(), "refill_cpu": 0.0,
                   "fill_cpu": 0.0}  # fmt: skip
    for r in range(rounds):
        env = {"POOL": f"seq{r}"}
        per_member = await fill(gw, pools, f"seq{r}", count * 3 // 2 + 2, env)
        batch = await sequential(gw, f"warm{r}", count, env, spy)
        # Each member is two processes (bwrap and the agent); the claimed ones were there before.
        total["refill_cpu"] += batch["processes_added_during_batch"] / 2 * per_member
        total["fill_cpu"] += per_member
        (pools / f"seq{r}.toml").unlink()  # drain: the next round's pool takes its place
        total["ready_ms"] += batch["ready_ms"]
        total["allocations"] += batch["allocations"]
        total["cpu"] += batch["gateway_cpu_ms"]
        total["threads"] += batch["gateway_cpu_ms_by_thread"]
        total["gc"] += batch["gc"]
        total["spawned"] += batch["processes_added_during_batch"]
        total["wall"] += batch["wall_ms"]
        total.setdefault("load_before", batch["load_before"])
        total["load_after"] = batch["load_after"]
    n = rounds * count
    return {
        "gateway_cpu_ms_per_create": total["cpu"] / n,
        "gateway_cpu_ms_per_member_start": total["fill_cpu"] / rounds,
        "members_started_during_batches": total["spawned"] / 2,
        "gateway_cpu_ms_per_create_net_of_refills": (total["cpu"] - total["refill_cpu"]) / n,
        "gateway_cpu_ms": total["cpu"],
        "gateway_cpu_ms_by_thread": dict(total["threads"]),
        "gc": dict(total["gc"]),
        "wall_ms": total["wall"],
        "processes_added_during_batch": total["spawned"],
        "load_before": total["load_before"],
        "load_after": total["load_after"],
        "rounds": rounds,
        "ready_ms": summary(total["ready_ms"]),
        "allocations": dict(total["allocations"]),
    }


async def burst(gw: GatewayProcess, size: int) -> dict:
    await quiet(gw)
    with Window(gw) as window:
        start = time.perf_counter()
        results = await asyncio.gather(
            *(one_create(gw, f"burst-{i}", BURST_ENV, start) for i in range(size)), return_exceptions=True
        )
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    ok = [r for r in results if not isinstance(r, BaseException)]
    for i in range(size):
        await gw.delete(f"burst-{i}")
    return {
        **window.result(size),
        "size": size,
        "errors": errors,
        "allocations": dict(collections.Counter(a for _, _, a in ok)),
        "rpc_returned_ms": summary([r for r, _, _ in ok]) if ok else {},
        "ready_ms": summary([r for _, r, _ in ok]) if ok else {},
    }


async def tail(count: int, pool_size: int, gc_young_threshold: int | None = None) -> dict:
    """Sequential warm creates against a small pool whose refills run throughout, on a gateway of
    its own with the default refill settings (and `gc_young_threshold` when given)."""
    with tempfile.TemporaryDirectory(prefix="ws-create-tail-") as tmp:
        pools = Path(tmp) / "pools"
        pools.mkdir()
        write_profile(pools, "tail", pool_size, TAIL_ENV)
        config = Path(tmp) / "gateway.toml"
        config.write_text(f"gc_young_threshold = {gc_young_threshold}\n" if gc_young_threshold else "")
        async with gateway_process("--pools", str(pools), "--config", str(config)) as gw:
            await wait_idle(gw, "tail", pool_size, timeout=300)
            ready_ms, allocations = [], collections.Counter[str]()
            with Window(gw) as window:
                for i in range(count):
                    _, ready, allocation = await one_create(gw, f"tail-{i}", TAIL_ENV, time.perf_counter())
                    ready_ms.append(ready)
                    allocations[allocation] += 1
                    await gw.delete(f"tail-{i}")  # inside the window: a steady state of create + delete
    stats = summary(ready_ms)
    return {
        **window.result(count),
        "gc_young_threshold": gc_young_threshold or "gateway default",
        "pool_size": pool_size,
        "ready_ms": stats,
        "p99_over_p50": stats["p99"] / stats["p50"],
        "slowest_ms": sorted(ready_ms)[-5:],
        "allocations": dict(allocations),
    }


def py_spy_summary(paths: list[Path], top: int = 40) -> list[tuple[str, float]]:
    """Inclusive share of samples per function (function file), from py-spy's raw output."""
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    lines = [line for path in paths if path.exists() for line in path.read_text().splitlines()]
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        frames = {frame.split(" (")[0] + " " + frame.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1]
                  for frame in stack.split(";")}  # fmt: skip
        for frame in frames:
            inclusive[frame] += count
    return [(frame, 100 * n / total) for frame, n in inclusive.most_common(top)] if total else []


async def measure(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="ws-create-cpu-") as tmp:
        pools = Path(tmp) / "pools"
        pools.mkdir()
        config = Path(tmp) / "gateway.toml"
        # Refills wait for a pause of 10 min: within a batch, no member starts (the batches check).
        config.write_text(f"[local]\nmax_pool_replicas = {max(args.count, args.burst) * 3 // 2 + 2}\n"
                          "refill_delay_seconds = 600\n")  # fmt: skip
        cprofile = Path(tmp) / "gateway.pstats" if args.cprofile else None
        async with gateway_process("--pools", str(pools), "--config", str(config), cprofile=cprofile) as gw:
            cold = await sequential(gw, "cold", args.cold, COLD_ENV)
            cold = {**cold, "ready_ms": summary(cold["ready_ms"]), "allocations": dict(cold["allocations"])}
            spy: Recorder | None = PySpy(gw.process.pid, args.py_spy) if args.py_spy else None
            if cprofile is not None:
                spy = CProfile(gw.process.pid, cprofile)
            warm = await warm_rounds(gw, pools, args.rounds, args.count, spy)
            await fill(gw, pools, "burst", args.burst * 3 // 2 + 2, BURST_ENV)
            burst_result = await burst(gw, args.burst)
            if cprofile is not None:
                profile = cprofile_summary(cprofile, args.rounds * args.count)
                shutil.copy(cprofile, args.cprofile)
    tail_result = await tail(args.tail, args.tail_pool) if args.tail else None
    # The same run at other collector thresholds (700 is the interpreter's): what the setting is worth.
    tail_gc = [await tail(args.tail, args.tail_pool, gc_young_threshold=t) for t in args.gc_thresholds if args.tail]
    data = {"cold": cold, "warm": warm, "burst": burst_result, "tail": tail_result, "tail_by_gc_threshold": tail_gc}
    if isinstance(spy, PySpy):
        data["py_spy_inclusive_percent"] = py_spy_summary(spy.files)
    if cprofile is not None:
        data["cprofile_warm_sequential"] = profile
    return data


def gc_cell(gc: dict) -> str:
    """ "runs / ms paused / over 10 ms", with the per-generation split."""
    runs = sum(v for k, v in gc.items() if k.endswith("_collections"))
    paused = sum(v for k, v in gc.items() if k.endswith("_paused_ms"))
    split = ", ".join(
        f"gen{g}: {gc.get(f'gen{g}_collections', 0)} / {gc.get(f'gen{g}_paused_ms', 0):.0f}" for g in range(3)
    )
    return f"{runs} / {paused:.1f} / {gc.get('pauses_over_10ms', 0)} ({split})"


def table(data: dict) -> str:
    cold, warm, burst_result, tail_result = data["cold"], data["warm"], data["burst"], data["tail"]
    rows = [("cold (baseline), sequential", cold), ("warm, sequential", warm), ("warm, burst", burst_result)]
    if tail_result:
        rows.append((f"warm, sequential, refilling pool of {tail_result['pool_size']}", tail_result))
    for other in data.get("tail_by_gc_threshold") or []:
        rows.append((f"… the same, gc_young_threshold = {other['gc_young_threshold']}", other))
    text = "| creates | n | gateway CPU ms/create | Ready p50 ms | p99 ms | GC runs / ms paused / over 10 ms "
    text += "| processes added | load before/after |\n|---|---|---|---|---|---|---|---|\n"
    for label, r in rows:
        text += (
            f"| {label} | {r['ready_ms']['n']} | **{r['gateway_cpu_ms_per_create']:.2f}** | {r['ready_ms']['p50']:.1f} "
            f"| {r['ready_ms']['p99']:.1f} | {gc_cell(r['gc'])} | {r['processes_added_during_batch']} "
            f"| {r['load_before']} / {r['load_after']} |\n"
        )
    for label, r in rows:
        threads = sorted(r["gateway_cpu_ms_by_thread"].items(), key=lambda kv: -kv[1])
        per = ", ".join(f"{name} {ms / r['ready_ms']['n']:.2f}" for name, ms in threads)
        text += f"\nGateway CPU ms/create by thread, {label}: {per}.\n"
    b = burst_result
    if b["rpc_returned_ms"]:
        text += (
            f"\nBurst of {b['size']}: {len(b['errors'])} errors, served {b['allocations']}; all Ready after "
            f"{b['wall_ms']:.0f} ms; CreateSandbox RPCs returned at p50 {b['rpc_returned_ms']['p50']:.0f} ms, "
            f"min {b['rpc_returned_ms']['min']:.0f}, max {b['rpc_returned_ms']['max']:.0f} ms after the start.\n"
        )
    text += (
        f"\nWarm sequential: {warm['members_started_during_batches']:.0f} members started during the batches "
        f"(refills), at {warm['gateway_cpu_ms_per_member_start']:.2f} ms of gateway CPU each (measured on each "
        f"round's fill): **{warm['gateway_cpu_ms_per_create_net_of_refills']:.2f} ms** per create net of them.\n"
    )
    text += (
        f"\nWarm/cold gateway CPU per create: "
        f"{warm['gateway_cpu_ms_per_create'] / cold['gateway_cpu_ms_per_create']:.2f}; target: warm <= 3 ms.\n"
    )
    if tail_result:
        text += (
            f"\nTail: p99/p50 = **{tail_result['p99_over_p50']:.2f}** (target <= 3); "
            f"slowest {[round(ms) for ms in tail_result['slowest_ms']]} ms.\n"
        )
    if data.get("py_spy_inclusive_percent"):
        text += "\nWhere the warm batch's samples were (py-spy, inclusive %):\n\n| frame | % |\n|---|---|\n"
        text += "".join(f"| `{frame}` | {share:.1f} |\n" for frame, share in data["py_spy_inclusive_percent"])
    if data.get("cprofile_warm_sequential"):
        text += (
            "\nThe warm sequential batches' event loop under cProfile (its overhead inflates small functions: "
            "read the ranking and the calls, not the absolute times):\n\n"
            "| function | calls/create | own µs/create | inclusive µs/create |\n|---|---|---|---|\n"
        )
        text += "".join(
            f"| `{r['function']}` | {r['calls_per_create']:.1f} | {r['own_us_per_create']:.0f} "
            f"| {r['inclusive_us_per_create']:.0f} |\n"
            for r in data["cprofile_warm_sequential"]
        )
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=60, help="sequential warm creates per round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of sequential warm creates")
    parser.add_argument("--burst", type=int, default=50, help="concurrent warm creates")
    parser.add_argument("--cold", type=int, default=30, help="sequential cold creates (the baseline)")
    parser.add_argument("--tail", type=int, default=0, help="sequential warm creates with refills running")
    parser.add_argument("--tail-pool", type=int, default=20, help="pool size of the tail run")
    parser.add_argument(
        "--gc-thresholds",
        type=lambda text: [int(t) for t in text.split(",") if t],
        default=[],
        help="repeat the tail run at each of these gc_young_threshold values (e.g. 700,5000)",
    )
    parser.add_argument("--py-spy", default="", help="record the warm sequential batch with py-spy to this file")
    parser.add_argument(
        "--cprofile", default="", help="record the warm sequential batches' event loop with cProfile to this file"
    )
    parser.add_argument("--name", default="create_cpu", help="writes results/NAME.{json,md} beside this script")
    parser.add_argument(
        "--create-and-watch",
        action="store_true",
        help="clients create, then watch until Ready (as the CLI does) instead of one create that waits",
    )
    args = parser.parse_args()
    global ONE_CALL
    ONE_CALL = not args.create_and_watch
    data = asyncio.run(measure(args))
    write_results(args.name, data, table(data))


if __name__ == "__main__":
    main()
