"""Issue 3 benchmark: warm vs cold create -> Ready on the local driver in one run, and a burst of
concurrent creates against a pool of the same size.

Warm: creates that match a profile's shape, against a pool sized for the run (100 by default) so
that every sample measures a hit rather than refill speed; before each create the script also
waits (untimed) until the pool has an idle member. Refills wait while a claim is in flight and
start at a lower CPU priority, so they do not compete with the measured activations. Cold: creates
of a shape no profile has. Burst: N concurrent creates against a pool of N, reporting how many
were served warm and that none failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from harness import GatewayProcess, create_latency_table, gateway_process, summary, write_results

from warmshell.api.v1 import sandbox_pb2 as pb

WARM_ENV = {"POOL": "warm"}
BURST_ENV = {"POOL": "burst"}
FILL_ENV = {"POOL": "fill"}
HZ = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process and of its children it has reaped (/proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return sum(int(x) for x in fields[11:15])


def pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


async def members(gw: GatewayProcess, pools: Path, size: int) -> dict:
    """Fill a fresh pool of `size` (a drained pool's refill): members per second, CPU per member
    (the gateway's own, with its host-side supervisors, plus everything each member runs — counted
    per process, so the load of others on a shared machine does not enter), and once idle the PSS
    of the processes each member adds and the gateway's growth."""
    gateway_pss, known = pss_kb(gw.process.pid), descendants(gw.process.pid)
    gateway_ticks, start = cpu_ticks(gw.process.pid), time.perf_counter()
    write_profile(pools, "fill", size, FILL_ENV)
    await wait_idle(gw, "fill", size, timeout=300)
    wall = time.perf_counter() - start
    added = descendants(gw.process.pid) - known
    ticks = cpu_ticks(gw.process.pid) - gateway_ticks + sum(cpu_ticks(p) for p in added)
    cpu_ms = ticks * 1000 / HZ
    await asyncio.sleep(2)  # let the members settle into idle
    added = descendants(gw.process.pid) - known
    result = {
        "size": size,
        "fill_wall_s": wall,
        "members_per_s": size / wall,
        "cpu_ms_per_member": cpu_ms / size,
        "processes_per_member": len(added) / size,
        "pss_mb_per_member": sum(pss_kb(p) for p in added) / size / 1024,
        "gateway_pss_kb_per_member": (pss_kb(gw.process.pid) - gateway_pss) / size,
    }
    write_profile(pools, "fill", 1, FILL_ENV)  # free the machine again
    return result


def write_profile(directory: Path, name: str, replicas: int, env: dict[str, str]) -> None:
    lines = ["version = 1", 'workspace = "default"', f"replicas = {replicas}", 'image = ""', "[environment]"]
    lines += [f'{k} = "{v}"' for k, v in env.items()]
    (directory / f"{name}.toml").write_text("\n".join(lines) + "\n")


async def idle_members(gw: GatewayProcess, pool: str) -> int:
    response = await gw.pools()
    return next((p.idle for p in response.pools if p.name == pool), 0)


async def wait_idle(gw: GatewayProcess, pool: str, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while await idle_members(gw, pool) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"pool {pool} never reached {count} idle members")
        await asyncio.sleep(0.02)


async def timed_create(gw: GatewayProcess, name: str, env: dict[str, str]) -> tuple[float, float, pb.Sandbox]:
    start = time.perf_counter()
    await gw.create(name=name, spec=pb.SandboxSpec(environment=env))
    ready = await gw.wait_ready(name)
    client_ms = (time.perf_counter() - start) * 1000
    timeline = ready.status.timeline
    return client_ms, (timeline.ready_us - timeline.requested_us) / 1000, ready


async def sequential(gw: GatewayProcess, label: str, count: int, env: dict[str, str], pool: str | None) -> dict:
    client, server, allocations = [], [], {"warm": 0, "cold": 0}
    for i in range(count):
        if pool is not None:
            await wait_idle(gw, pool, 1)
        c, s, ready = await timed_create(gw, f"{label}-{i}", env)
        client.append(c)
        server.append(s)
        allocations[ready.status.allocation] += 1
        await gw.delete(f"{label}-{i}")
    return {"client_ms": summary(client), "server_ms": summary(server), "allocations": allocations}


async def burst(gw: GatewayProcess, size: int) -> dict:
    await wait_idle(gw, "burst", size, timeout=300)
    start = time.perf_counter()
    results = await asyncio.gather(
        *(timed_create(gw, f"burst-{i}", BURST_ENV) for i in range(size)), return_exceptions=True
    )
    wall_ms = (time.perf_counter() - start) * 1000
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    ok = [r for r in results if not isinstance(r, BaseException)]
    warm = sum(1 for _, _, s in ok if s.status.allocation == "warm")
    for i in range(size):
        await gw.delete(f"burst-{i}")
    return {
        "size": size,
        "errors": errors,
        "warm": warm,
        "hit_rate": warm / size,
        "wall_ms": wall_ms,
        "client_ms": summary([c for c, _, _ in ok]) if ok else {},
    }


async def measure(count: int, pool_size: int, burst_size: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="ws-pools-") as tmp:
        pools = Path(tmp) / "pools"
        pools.mkdir()
        write_profile(pools, "warm", pool_size, WARM_ENV)
        config = Path(tmp) / "gateway.toml"
        config.write_text(f"[local]\nmax_pool_replicas = {max(pool_size, burst_size)}\n")
        args = ["--pools", str(pools), "--config", str(config)]
        async with gateway_process(*args) as gw:
            await wait_idle(gw, "warm", pool_size)
            fill = await members(gw, pools, burst_size)
            warm = await sequential(gw, "warm", count, WARM_ENV, "warm")
            cold = await sequential(gw, "cold", count, {"POOL": "none"}, None)
            write_profile(pools, "warm", 1, WARM_ENV)  # shrink: free the machine for the burst pool
            write_profile(pools, "burst", burst_size, BURST_ENV)
            burst_result = await burst(gw, burst_size)
    return {"warm": warm, "cold": cold, "burst": burst_result, "pool_size": pool_size, "members": fill}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--pool-size", type=int, default=100)
    parser.add_argument("--burst", type=int, default=50)
    parser.add_argument("--name", default="warm_path", help="results file name under bench/results/")
    args = parser.parse_args()
    data = asyncio.run(measure(args.count, args.pool_size, args.burst))
    warm, cold, burst_result = data["warm"], data["cold"], data["burst"]
    speedup = cold["client_ms"]["p50"] / warm["client_ms"]["p50"]
    data["cold_p50_over_warm_p50"] = speedup
    data["targets"] = {"warm_p50_le_10ms": warm["client_ms"]["p50"] <= 10, "speedup_ge_10": speedup >= 10,
                       "burst_no_errors": not burst_result["errors"]}  # fmt: skip
    table = create_latency_table((("warm", warm), ("cold", cold)), first_column="path")
    fill = data["members"]
    table += (
        f"\nMembers: a fresh pool of {fill['size']} filled at **{fill['members_per_s']:.1f} members/s**; "
        f"CPU **{fill['cpu_ms_per_member']:.1f} ms per member** to start and register; idle, "
        f"each member adds {fill['processes_per_member']:.0f} processes with "
        f"**{fill['pss_mb_per_member']:.2f} MB PSS** "
        f"and {fill['gateway_pss_kb_per_member']:.0f} KB to the gateway's PSS.\n"
    )
    table += (
        f"\nWarm p50 **{warm['client_ms']['p50']:.2f} ms** (target <= 10 ms); cold/warm p50 = **{speedup:.1f}x** "
        f"(target >= 10x).\n\nBurst: {burst_result['size']} concurrent creates against a pool of "
        f"{burst_result['size']}: {len(burst_result['errors'])} errors, {burst_result['warm']} warm "
        f"(hit rate {burst_result['hit_rate']:.0%}), all Ready after {burst_result['wall_ms']:.0f} ms"
        + (f"; per-create p50 {burst_result['client_ms']['p50']:.1f} ms." if burst_result["client_ms"] else ".")
        + "\n"
    )
    write_results(args.name, data, table)


if __name__ == "__main__":
    main()
