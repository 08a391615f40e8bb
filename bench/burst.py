"""Issue 14 benchmark: a burst of warm creates against the local driver, in one run.

One gateway (a subprocess, real bwrap'd members) and, in order:

- cold create -> Ready p50 (a shape no profile has): the baseline every ratio is taken against;
- sequential warm create -> Ready p50/p90/p99 with refills running (a small pool refilled while
  the creates go on; no waiting for an idle member between creates), and the server's timeline
  of each warm one step by step (requested -> claimed -> activated -> Ready);
- bursts of N concurrent creates against an idle pool of N (10, 50, 200): wall time until all are
  Ready, per-create p50/p99, the gateway's CPU per create (its host-side supervisors included:
  they run in the gateway process), the CPU the claimed members' own processes spent from
  activation to Ready, and the CPU of the refill spawns that ran during the burst — every figure
  read from /proc per process, so other load on a shared machine does not enter it;
- the refill rate: a fresh pool filled from nothing (members/s from writing its profile, and
  between the 10th and 90th percent of the fill: the gateway sees the profile at its next poll of
  the pools directory, a refill after a claim at once), with the CPU of one member start split
  into the member's processes (bwrap, the agent) and the gateway's share;
- PSS per idle member (`smaps_rollup`, summed over its processes) plus the gateway's PSS growth
  per member (its host-side supervisor);
- sequential warm creates with `--scale` idle members held (1,000 by default), against the same
  creates with a small pool: flat create latency means a ratio near 1;
- the cost of a sandbox start broken down, by hand in this process: bubblewrap with the driver's
  layout running `/bin/true` (wall and CPU from wait4), with the current launch (the staged /etc
  bound once, `warmshell-launch`) and with the previous one (every allowed /etc entry bound on
  its own, `prlimit` + `setpriv` in front) in alternating rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import warm_path
from harness import GatewayProcess, gateway_process, gc_pauses, summary, write_results
from warm_path import descendants, idle_members, pss_kb, wait_idle, write_profile

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.core.config import LocalDriverConfig
from warmshell.drivers.local.runtime import etcstage, launching, limits, sandboxing, seccomp

SEQ_ENV = {"POOL": "seq"}
BURST_ENV = {"POOL": "burst"}
FILL_ENV = {"POOL": "fill"}
COLD_ENV = {"POOL": "none"}
CREATES_PER_CLIENT = 25
# A warm create's server timeline, step by step: (label, from, to) of `Timeline` fields.
WARM_STEPS = (
    ("requested -> claimed", "requested_us", "claimed_us"),
    ("claimed -> activated", "claimed_us", "activated_us"),
    ("activated -> ready", "activated_us", "ready_us"),
)


# How a create waits for Ready: in the create itself, as the SDK does (False: CreateSandbox then
# WatchSandbox, as the CLI and older clients do; `--create-and-watch`).
ONE_CALL = True


async def timed_create(gw: GatewayProcess, name: str, env: dict[str, str]) -> tuple[float, float, pb.Sandbox]:
    """(client ms, server timeline ms, the Ready sandbox) of one create."""
    if not ONE_CALL:
        return await warm_path.timed_create(gw, name, env)
    start = time.perf_counter()
    ready = await gw.create_ready(name=name, spec=pb.SandboxSpec(environment=env))
    client_ms = (time.perf_counter() - start) * 1000
    timeline = ready.status.timeline
    return client_ms, (timeline.ready_us - timeline.requested_us) / 1000, ready


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def steal_ms() -> float:
    """CPU time the hypervisor took from this VM's cores since boot (`/proc/stat` steal, in ms):
    a create can wait for a core that is not there."""
    with open("/proc/stat") as handle:
        fields = handle.readline().split()
    return int(fields[8]) * 1000 / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of a process, in ns (/proc/PID/task/*/schedstat: exact, where the
    tick-sampled utime/stime of a process that runs for a few milliseconds often reads 0)."""
    return sum(thread_ns(pid).values())


def thread_ns(pid: int) -> dict[str, int]:
    """CPU ns of a process's main thread (its event loop) and of all its other threads."""
    split = {"main": 0, "other": 0}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return split
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as handle:
                ns = int(handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        split["main" if int(tid) == pid else "other"] += ns
    return split


def say(*what: object) -> None:
    print(time.strftime("%H:%M:%S"), *what, file=sys.stderr, flush=True)


def ms(ns: float) -> float:
    return ns / 1e6


async def delete_all(gw: GatewayProcess, names: list[str], concurrency: int = 20) -> None:
    """Delete these sandboxes (those whose create failed do not exist)."""
    slots = asyncio.Semaphore(concurrency)

    async def one(name: str) -> None:
        async with slots:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await gw.delete(name)

    await asyncio.gather(*(one(n) for n in names))


@contextlib.asynccontextmanager
async def clients(gw: GatewayProcess, count: int) -> AsyncIterator[list[GatewayProcess]]:
    """`count` clients of the gateway, each on a connection of its own: a burst comes from many
    callers, and one connection carries at most 128 streams (each create here holds a watch)."""
    channels = [
        grpc.aio.insecure_channel(
            f"unix://{gw.state / 'gateway.sock'}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(count)
    ]
    try:
        yield [dataclasses.replace(gw, channel=c, stub=sandbox_pb2_grpc.SandboxServiceStub(c)) for c in channels]
    finally:
        await asyncio.gather(*(c.close(grace=None) for c in channels))


async def sequential(
    gw: GatewayProcess, label: str, count: int, env: dict[str, str], until: asyncio.Future[Any] | None = None
) -> dict[str, Any]:
    """`count` creates one after the other (with `until`: as many as run before it is done), each
    deleted before the next; no waiting for the pool. Also why any went cold (`why_cold`) and the
    collector's pauses meanwhile."""
    client, server, warm, allocations = [], [], [], {"warm": 0, "cold": 0}
    steps: dict[str, list[float]] = {step: [] for step, _, _ in WARM_STEPS}
    cold_before, paused, stolen, started = await why_cold(gw), gc_pauses(gw), steal_ms(), time.perf_counter()
    for i in itertools.count():
        if (until is None and i == count) or (until is not None and until.done()):
            break
        c, s, ready = await timed_create(gw, f"{label}-{i}", env)
        client.append(c)
        server.append(s)
        allocations[ready.status.allocation] += 1
        if ready.status.allocation == "warm":
            warm.append(c)
            timeline = ready.status.timeline
            for step, start, end in WARM_STEPS:
                steps[step].append((getattr(timeline, end) - getattr(timeline, start)) / 1000)
        await gw.delete(f"{label}-{i}")
    after = gc_pauses(gw)
    return {
        "client_ms": summary(client),
        "server_ms": summary(server),
        "warm_client_ms": summary(warm) if warm else {},
        "warm_steps_ms": {step: summary(values) for step, values in steps.items() if values},
        "allocations": allocations,
        "why_cold": why_cold_since(cold_before, await why_cold(gw)),
        "gc": {key: after[key] - paused[key] for key in after},
        # Of the cores' wall time during the creates, the share the hypervisor took.
        "steal_share": (steal_ms() - stolen) / (1000 * (os.cpu_count() or 1) * (time.perf_counter() - started)),
        "load": load(),
    }


async def settle(gw: GatewayProcess, pool: str, size: int, timeout: float) -> None:
    """Wait until the pool holds `size` idle members, then until the machine stops spending CPU on
    it (the last registrations' follow-up work), at most a few seconds."""
    await wait_idle(gw, pool, size, timeout=timeout)
    previous = cpu_ns(gw.process.pid)
    for _ in range(20):
        await asyncio.sleep(0.25)
        now = cpu_ns(gw.process.pid)
        if now - previous <= 5_000_000:  # under 20 ms of CPU in 250 ms
            return
        previous = now


async def burst(gw: GatewayProcess, pools: Path, size: int, run: int) -> dict[str, Any]:
    """`size` concurrent creates against an idle pool of `size`."""
    say(f"burst of {size}: filling its pool")
    write_profile(pools, "burst", size, BURST_ENV)
    await settle(gw, "burst", size, timeout=max(120, size))
    members = descendants(gw.process.pid)
    names = [f"burst{run}-{i}" for i in range(size)]
    async with clients(gw, (size + CREATES_PER_CLIENT - 1) // CREATES_PER_CLIENT) as callers:
        await asyncio.gather(*(c.pools() for c in callers))  # connected before the clock starts
        member_ns = {p: cpu_ns(p) for p in members}
        gateway_before, threads_before = cpu_ns(gw.process.pid), thread_ns(gw.process.pid)
        start = time.perf_counter()
        results = await asyncio.gather(
            *(timed_create(callers[i // CREATES_PER_CLIENT], n, BURST_ENV) for i, n in enumerate(names)),
            return_exceptions=True,
        )
        wall_ms = (time.perf_counter() - start) * 1000
    gateway_ns = cpu_ns(gw.process.pid) - gateway_before
    threads_after = thread_ns(gw.process.pid)
    now = descendants(gw.process.pid)
    # Each claimed member's processes (bwrap, the agent) from before the burst until all are Ready.
    activated = sum(cpu_ns(p) - member_ns[p] for p in members & now)
    refills = now - members
    refill_ns = sum(cpu_ns(p) for p in refills)
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    ok = [r for r in results if not isinstance(r, BaseException)]
    warm = sum(1 for _, _, s in ok if s.status.allocation == "warm")
    await delete_all(gw, names)
    write_profile(pools, "burst", 1, BURST_ENV)
    client = [c for c, _, _ in ok]
    return {
        "size": size,
        "errors": errors,
        "warm": warm,
        "wall_ms": wall_ms,
        "client_ms": summary(client) if client else {},
        "server_ms": summary([s for _, s, _ in ok]) if ok else {},
        "gateway_cpu_ms_per_create": ms(gateway_ns) / size,
        "gateway_cpu_ms_main_thread": ms(threads_after["main"] - threads_before["main"]),
        "gateway_cpu_ms_other_threads": ms(threads_after["other"] - threads_before["other"]),
        "member_cpu_ms_per_activation": ms(activated) / size,
        "refill_processes_during_burst": len(refills) // 2,
        "refill_cpu_ms_during_burst": ms(refill_ns),
        "load": load(),
    }


async def why_cold(gw: GatewayProcess) -> dict[str, int]:
    """The gateway's counts so far of cold creates by reason (ListPools) and of idle members it
    replaced because they did not answer a liveness probe (its log, at WARNING)."""
    pools = await gw.pools()
    log = (gw.state / "gateway.log").read_text(errors="replace")
    return {
        **{f"cold: {reason}": count for reason, count in pools.misses_by_reason.items()},
        "claimed members that missed their probe": log.count("did not answer its liveness probe"),
        "idle members that missed a liveness check": log.count("did not answer its liveness check"),
    }


def why_cold_since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What `why_cold` counted between two readings."""
    return {key: after[key] - before.get(key, 0) for key in after if after[key] - before.get(key, 0)}


async def quiesce(gw: GatewayProcess, timeout: float = 120) -> None:
    """Until the gateway is quiet: the same processes under it for a second and under 10 ms of its
    CPU in that second. The bursts before the fill leave hundreds of sandboxes and drained members
    stopping; a fill that overlapped them would count their teardown as its own work."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before, cpu = descendants(gw.process.pid), cpu_ns(gw.process.pid)
        await asyncio.sleep(1.0)
        if descendants(gw.process.pid) == before and cpu_ns(gw.process.pid) - cpu < 10_000_000:
            return
    raise TimeoutError(f"the gateway was still busy after {timeout:.0f} s")


def steady_rate(samples: list[tuple[float, int]], size: int) -> dict[str, float]:
    """From (seconds, idle members) polls of a fill: when the first member was idle (the gateway
    sees a new profile at its next pools-directory poll, up to `pool_reload_interval_seconds`
    after it was written; a refill after a claim starts at once), and the rate between the 10th
    and 90th percent of the fill (the rate the host sustains, apart from that wait and the
    pipeline's start and end)."""
    first = next((t for t, idle in samples if idle > 0), float("nan"))
    low = next(((t, idle) for t, idle in samples if idle >= size * 0.1), None)
    high = next(((t, idle) for t, idle in samples if idle >= size * 0.9), None)
    steady = (high[1] - low[1]) / (high[0] - low[0]) if low and high and high[0] > low[0] else float("nan")
    return {"first_idle_s": first, "steady_members_per_s": steady}


async def poll_cost_ms(gw: GatewayProcess, polls: int = 25) -> float:
    """The gateway's CPU per ListPools poll as `fill` makes them, measured on the quiet gateway
    right before it: the fill's own polls (one per 20 ms, ~1 ms each) are the benchmark's cost,
    not a start's, yet land in the gateway's CPU per member start, the more the slower the fill."""
    before = cpu_ns(gw.process.pid)
    for _ in range(polls):
        await idle_members(gw, "fill")
    return ms(cpu_ns(gw.process.pid) - before) / polls


async def fill(gw: GatewayProcess, pools: Path, size: int) -> dict[str, Any]:
    """Fill a fresh pool of `size` from nothing; members/s, CPU per member start, idle PSS."""
    await quiesce(gw)
    per_poll_ms = await poll_cost_ms(gw)
    gateway_pss, known = pss_kb(gw.process.pid), descendants(gw.process.pid)
    gateway_ns, start = cpu_ns(gw.process.pid), time.perf_counter()
    write_profile(pools, "fill", size, FILL_ENV)
    samples: list[tuple[float, int]] = []  # (s since the profile was written, idle members)
    deadline = start + max(300, size)
    while not samples or samples[-1][1] < size:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"pool fill never reached {size} idle members")
        samples.append((time.perf_counter() - start, await idle_members(gw, "fill")))
        await asyncio.sleep(0.02)
    wall = time.perf_counter() - start
    gateway_ms = ms(cpu_ns(gw.process.pid) - gateway_ns)
    added = descendants(gw.process.pid) - known
    member_ms = ms(sum(cpu_ns(p) for p in added))
    await settle(gw, "fill", size, timeout=60)
    added = descendants(gw.process.pid) - known
    return {
        "size": size,
        "wall_s": wall,
        "members_per_s": size / wall,
        **steady_rate(samples, size),
        "cpu_ms_per_member": (gateway_ms + member_ms) / size,
        "gateway_cpu_ms_per_member": gateway_ms / size,
        # Of it, the benchmark's ListPools polls (their count times each one's cost above).
        "poll_cpu_ms_per_member": per_poll_ms * len(samples) / size,
        "member_processes_cpu_ms_per_member": member_ms / size,
        "processes_per_member": len(added) / size,
        "pss_mb_per_member": sum(pss_kb(p) for p in added) / size / 1024,
        "gateway_pss_kb_per_member": (pss_kb(gw.process.pid) - gateway_pss) / size,
        "load": load(),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ws-burst-") as tmp:
        pools = Path(tmp) / "pools"
        pools.mkdir()
        write_profile(pools, "seq", args.seq_pool, SEQ_ENV)
        config = Path(tmp) / "gateway.toml"
        largest = max([args.scale, args.fill, args.seq_pool, *args.bursts])
        settings = f"[local]\nmax_pool_replicas = {largest}\npool_reload_interval_seconds = 0.2\n"
        config.write_text(settings + "".join(f"{line}\n" for line in args.local))
        data: dict[str, Any] = {"load_start": load()}
        if args.start_rounds:
            say("a sandbox start, broken down")
            data["start"] = start_breakdown(args.start_rounds)
        async with gateway_process("--pools", str(pools), "--config", str(config), src=args.src) as gw:
            await settle(gw, "seq", args.seq_pool, timeout=120)
            say("cold baseline")
            data["cold"] = await sequential(gw, "cold", args.cold, COLD_ENV)
            say("sequential warm")
            data["sequential"] = await sequential(gw, "seq", args.sequential, SEQ_ENV)
            write_profile(pools, "seq", 1, SEQ_ENV)
            data["bursts"] = [await burst(gw, pools, size, run) for run, size in enumerate(args.bursts)]
            say(f"refill rate: a fresh pool of {args.fill}")
            data["fill"] = await fill(gw, pools, args.fill)
            (pools / "fill.toml").unlink()  # drained: its members stop
            if args.scale:
                write_profile(pools, "seq", args.seq_pool, SEQ_ENV)
                await settle(gw, "seq", args.seq_pool, timeout=120)
                small = await sequential(gw, "small", args.scale_creates, SEQ_ENV)
                say(f"filling {args.scale} idle members")
                write_profile(pools, "fill", args.scale, FILL_ENV)
                await settle(gw, "fill", args.scale, timeout=max(300, args.scale))
                say(f"{args.scale} idle held")
                held = await sequential(gw, "held", args.scale_creates, SEQ_ENV)
                data["scale"] = {
                    "idle_held": args.scale,
                    "small_pool": small,
                    "with_idle_held": held,
                }
            data["load_end"] = load()
    return data


def bwrap_argvs(tmp: Path) -> dict[str, list[str]]:
    """The driver's bwrap command line running `/bin/true`, as launched now and before."""
    root = os.geteuid() == 0
    tmp.chmod(0o711)  # a sandbox's own uid resolves the bind sources
    workspace = tmp / "workspace"
    workspace.mkdir(mode=0o777)
    stage = etcstage.EtcStage(tmp / "etc", Path("/etc"), sandboxing.ETC_ALLOWED)
    stage.refresh()
    entries, names = sandboxing.list_root(Path("/")), os.listdir("/etc")
    plans = {
        "now": sandboxing.host_root_plan(entries, names, staged_etc=stage.directory, etc_dirs=stage.subdirectories),
        "before": sandboxing.host_root_plan(entries, names),
    }
    bounds = limits.Bounds.of(LocalDriverConfig())
    rlimits = limits.prlimit_argv(bounds, uid_per_sandbox=root)
    uid = 2_000_000 if root else None
    # Both at the caller's priority, so their wall times compare (a refill adds --priority=19).
    as_uid = [f"--uid={uid}"] if root else []
    setpriv = ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if root else []
    prefixes = {
        "now": [str(launching.LAUNCH_BINARY), *limits.rlimit_options(bounds, uid_per_sandbox=root), *as_uid, "--"],
        "before": [*rlimits, *setpriv],
    }
    argvs = {}
    for name, plan in plans.items():
        layout = sandboxing.SandboxLayout(
            bwrap=shutil.which("bwrap") or "bwrap", plan=plan, workspace_dir=workspace, agent=launching.AGENT_BINARY,
            control_fd=0, seccomp_fd=3, hostname="b", instance_id="li-bench", tmp_bytes=bounds.tmp_bytes,
            workspace_bytes=bounds.workspace_bytes,
            run_bytes=bounds.run_bytes, shm_bytes=bounds.shm_bytes,
        )  # fmt: skip
        argv = sandboxing.bwrap_argv(layout)
        argvs[name] = [*prefixes[name], *argv[: argv.index("--")], "--", "/bin/true"]
    return argvs


def timed_start(argv: list[str], program: bytes) -> tuple[float, float]:
    """Run one sandbox start to its end, `program` as its seccomp filter (the `--seccomp` fd of
    `argv` is set here): (wall ms, CPU ms of it and its children, from wait4)."""
    read, write = os.pipe()
    os.write(write, program)
    os.close(write)
    argv[argv.index("--seccomp") + 1] = str(read)
    start = time.perf_counter()
    child = subprocess.Popen(argv, pass_fds=(read,), stdin=subprocess.DEVNULL)
    os.close(read)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"bwrap failed ({child.returncode}): {argv}")
    return (time.perf_counter() - start) * 1000, (usage.ru_utime + usage.ru_stime) * 1000


def start_breakdown(rounds: int) -> dict[str, Any]:
    """bwrap starting `/bin/true` with the driver's layout, now and before, alternating."""
    program = seccomp.program()
    samples: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ws-burst-bwrap-") as tmp:
        argvs = bwrap_argvs(Path(tmp))
        for _ in range(rounds):
            for name, argv in argvs.items():
                wall, cpu = timed_start(argv, program)
                sample = samples.setdefault(name, {"wall_ms": [], "cpu_ms": []})
                sample["wall_ms"].append(wall)
                sample["cpu_ms"].append(cpu)
        binds = {name: argv.count("--ro-bind") + argv.count("--bind") for name, argv in argvs.items()}
    return {
        name: {"wall_ms": summary(v["wall_ms"]), "cpu_ms": summary(v["cpu_ms"]), "binds": binds[name]}
        for name, v in samples.items()
    } | {"load": load()}


def table(data: dict[str, Any]) -> str:
    cold = data["cold"]["client_ms"]["p50"]
    seq = data["sequential"]
    s = seq["client_ms"]
    out = f"Cold create -> Ready p50 (the baseline): **{cold:.1f} ms** (n={data['cold']['client_ms']['n']}).\n\n"
    out += "| sequential warm create -> Ready | n | p50 ms | p90 ms | p99 ms | p99/p50 | served |\n"
    out += "|---|---|---|---|---|---|---|\n"
    for label, view in (("client (API call -> Ready event)", "client_ms"), ("server timeline", "server_ms")):
        v = seq[view]
        out += (
            f"| {label} | {v['n']} | {v['p50']:.2f} | {v['p90']:.2f} | {v['p99']:.2f} "
            f"| {v['p99'] / v['p50']:.1f} | {seq['allocations']} |\n"
        )
    out += f"\nWarm p50 is {cold / s['p50']:.1f}x faster than cold (load {seq['load']}).\n\n"
    out += (
        "| burst (N creates, idle pool of N) | all Ready after ms | / cold p50 | per-create p50 ms | p99 ms "
        "| warm | errors | gateway CPU ms/create | … net of refills | member CPU ms/activation "
        "| refill spawns during burst (CPU ms) | load |\n" + "|---" * 12 + "|\n"
    )
    for b in data["bursts"]:
        c = b["client_ms"] or {"p50": float("nan"), "p99": float("nan")}
        out += (
            f"| {b['size']} | {b['wall_ms']:.0f} | {b['wall_ms'] / cold:.1f}x | {c['p50']:.1f} | {c['p99']:.1f} "
            f"| {b['warm']}/{b['size']} | {len(b['errors'])} | {b['gateway_cpu_ms_per_create']:.2f} "
            f"| {net_of_refills(b, data['fill']):.2f} | {b['member_cpu_ms_per_activation']:.2f} "
            f"| {b['refill_processes_during_burst']} "
            f"({b['refill_cpu_ms_during_burst']:.0f}) | {b['load']} |\n"
        )
    f = data["fill"]
    out += (
        f"\nRefill: a fresh pool of {f['size']} filled at **{f['members_per_s']:.1f} members/s** from writing its "
        f"profile (the first member idle after {f['first_idle_s']:.2f} s), "
        f"**{f['steady_members_per_s']:.1f} members/s** between its 10th and 90th percent; "
        f"CPU per member start **{f['cpu_ms_per_member']:.2f} ms** ({f['member_processes_cpu_ms_per_member']:.2f} ms "
        f"in the member's processes: bwrap and the agent; {f['gateway_cpu_ms_per_member']:.2f} ms in the gateway: "
        f"spawning, the host-side supervisor, its registration; of it {f['poll_cpu_ms_per_member']:.2f} ms this "
        f"benchmark's ListPools polls during the fill). Idle, each member is "
        f"{f['processes_per_member']:.0f} processes with **{f['pss_mb_per_member']:.3f} MB PSS**, plus "
        f"**{f['gateway_pss_kb_per_member']:.0f} KB** of the gateway's PSS (load {f['load']}).\n"
    )
    if "scale" in data:
        sc = data["scale"]
        small, held = sc["small_pool"]["client_ms"], sc["with_idle_held"]["client_ms"]
        out += (
            f"\nScale: sequential warm create -> Ready with {sc['idle_held']} idle members held: p50 "
            f"{held['p50']:.2f} ms / p99 {held['p99']:.2f} ms, against {small['p50']:.2f} / {small['p99']:.2f} ms "
            f"with a small pool (p50 ratio {held['p50'] / small['p50']:.2f}; served "
            f"{sc['with_idle_held']['allocations']}; cold creates and missed probes during it: "
            f"{sc['with_idle_held'].get('why_cold') or 'none'}).\n"
        )
        held_warm, held_gc = sc["with_idle_held"].get("warm_client_ms"), sc["with_idle_held"].get("gc", {})
        if held_warm:
            small_warm = sc["small_pool"].get("warm_client_ms") or small
            out += (
                f"The warm creates alone: p99 {held_warm['p99']:.2f} ms held against {small_warm['p99']:.2f} ms; "
                f"the collector's full passes during the held creates: {held_gc.get('gen2_collections', 0)} "
                f"({held_gc.get('gen2_paused_ms', 0):.0f} ms); steal (the hypervisor's share of the cores) during "
                f"them {sc['with_idle_held'].get('steal_share', 0):.1%}, during the small pool's "
                f"{sc['small_pool'].get('steal_share', 0):.1%}.\n"
            )
    if "start" in data:
        st = data["start"]
        out += (
            "\n| one sandbox start, bwrap with the driver's layout running /bin/true | binds | wall p50 ms "
            "| CPU p50 ms |\n|---|---|---|---|\n"
        )
        for name, label in (
            ("before", "before: each /etc entry bound, prlimit + setpriv"),
            ("now", "now: staged /etc, warmshell-launch"),
        ):
            v = st[name]
            out += f"| {label} | {v['binds']} | {v['wall_ms']['p50']:.2f} | {v['cpu_ms']['p50']:.2f} |\n"
        out += f"\n(load {st['load']})\n"
    out += f"\nLoad average at start {data['load_start']}, at end {data['load_end']} (shared 2-core machine).\n"
    return out


def net_of_refills(burst: dict[str, Any], fill: dict[str, Any]) -> float:
    """The gateway's CPU per create of a burst less its refills' share: the refill spawns that ran
    during it, each at the gateway CPU per member start of this run's fill."""
    refills = burst["refill_processes_during_burst"] * fill["gateway_cpu_ms_per_member"]
    return float(burst["gateway_cpu_ms_per_create"] - refills / burst["size"])


def targets(data: dict[str, Any]) -> dict[str, bool]:
    """The issue's targets, as far as this run shows them."""
    seq = data["sequential"]["client_ms"]
    result = {"sequential_p99_le_3x_p50": seq["p99"] <= 3 * seq["p50"]}
    for b in data["bursts"]:
        bound = {50: 300.0, 200: 1200.0}.get(b["size"])
        if bound is not None:
            result[f"burst_{b['size']}_all_ready_within_{bound:.0f}ms"] = b["wall_ms"] <= bound and not b["errors"]
        result[f"burst_{b['size']}_no_cold_while_idle"] = b["warm"] == b["size"]
        result[f"burst_{b['size']}_gateway_cpu_le_3ms"] = b["gateway_cpu_ms_per_create"] <= 3
        result[f"burst_{b['size']}_gateway_cpu_net_of_refills_le_3ms"] = net_of_refills(b, data["fill"]) <= 3
    fill = data["fill"]
    result["refill_ge_200_per_s"] = fill["members_per_s"] >= 200
    result["refill_steady_ge_200_per_s"] = fill["steady_members_per_s"] >= 200
    result["idle_pss_le_1mb"] = fill["pss_mb_per_member"] + fill["gateway_pss_kb_per_member"] / 1024 <= 1
    if "scale" in data:
        sc = data["scale"]
        result["flat_with_idle_held"] = (
            sc["with_idle_held"]["client_ms"]["p50"] <= 1.5 * sc["small_pool"]["client_ms"]["p50"]
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cold", type=int, default=30, help="cold creates for the baseline (default 30)")
    parser.add_argument("--sequential", type=int, default=500, help="sequential warm creates (default 500)")
    parser.add_argument("--seq-pool", type=int, default=10, help="pool size for the sequential run (default 10)")
    parser.add_argument("--bursts", type=int, nargs="+", default=[10, 50, 200], help="burst sizes (default 10 50 200)")
    parser.add_argument("--fill", type=int, default=200, help="fresh pool size for the refill rate (default 200)")
    parser.add_argument("--scale", type=int, default=1000, help="idle members held for the flat-latency run (0: skip)")
    parser.add_argument("--scale-creates", type=int, default=50, help="sequential creates in the scale run")
    parser.add_argument("--start-rounds", type=int, default=50, help="rounds of the start breakdown (0: skip)")
    parser.add_argument("--local", action="append", default=[], metavar="KEY=VALUE", help="extra [local] config line")
    parser.add_argument("--quick", action="store_true", help="a small run: 100 sequential, bursts 10 50, scale 200")
    parser.add_argument(
        "--create-and-watch",
        action="store_true",
        help="clients create, then watch until Ready (as the CLI does) instead of one create that waits",
    )
    parser.add_argument("--name", default="burst", help="results file name under bench/results/")
    parser.add_argument(
        "--src", type=Path, default=None, help="run the gateway from this tree's src/ (an older one to compare)"
    )
    args = parser.parse_args()
    global ONE_CALL
    ONE_CALL = not args.create_and_watch
    if args.quick:
        args.sequential, args.bursts, args.fill, args.scale, args.cold = 100, [10, 50], 100, 200, 15
        args.start_rounds = 20
    data = asyncio.run(measure(args))
    data["targets"] = targets(data)
    write_results(args.name, data, table(data))


if __name__ == "__main__":
    main()
