"""Issue 20 benchmark: gateway replicas on kubesim. In one run, on one kubesim (its own process),
with gateways as processes of their own behind a TCP balancer (the Service), pods reaching them
through it:

1. warm create -> Ready, one at a time, with 1 gateway on SQLite, 1 on Postgres and 3 on
   Postgres (the refill after each create is not measured: the next create waits for a full pool);
2. sustained creates/s each: a pool pre-filled to `--burst`, that many warm creates sent at once
   (through the balancer, so spread over the replicas), until every one is Ready;
3. kill -9 of one of 3 replicas holding sessions: the time until every affected sandbox is Ready
   again on a survivor;
4. the agent-sandbox scenario (their PR #1251): Poisson arrivals of warm creates at 45/s on
   kubesim's `default` timing, as many creates as the pool pre-filled to `--poisson-pool` (the
   issue's 10 s at 45/s: 450), 1 and 3 replicas: p50/p90/p99 create -> Ready and how many went
   cold. Each kubesim pod is a real process (PSS per pod is measured and reported): the pool is
   sized down, loudly and in the results, when the memory available above `--memory-reserve-mib`
   cannot hold it, and the run stops if available memory falls under half that reserve;
5. the highest rate sustained for `--sustain-seconds` on `default` timing with refills keeping up
   (no create goes cold, Ready p99 stays under 5 s), 3 replicas: `--rates` tried in order until
   one fails, then the midpoint between the last that held and it.

`--parts` runs a subset (fast, poisson, sustained).

Creates -> Ready are client-side: the CreateSandbox call until the watch (on the replica the
balancer picked) reports Ready. Postgres is `scripts/dev-postgres` (a throwaway server).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TypeVar

import grpc
from harness import summary, write_results
from memory import MemoryGuard, MemoryLow, available_mib, pods_pss_mib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubesim.controllers import client as kc  # noqa: E402
from tests.helpers.kubesim_process import ClusterProcess, kubesim_process  # noqa: E402
from tests.helpers.postgres import dev_postgres_server  # noqa: E402
from tests.helpers.replicas import ReplicaSet, balancer, replica_set, wait_phase  # noqa: E402
from tests.integration.drivers_kubernetes.conftest import IMAGE, NAMESPACE, driver_config  # noqa: E402
from warmshell.api.v1 import sandbox_pb2 as pb  # noqa: E402
from warmshell.core.fingerprints import SandboxShape  # noqa: E402
from warmshell.drivers.kubernetes import warmpools  # noqa: E402

POOL = "bench"
WARM_ENV = {"FOO": "bar"}
READY_P99_LIMIT_MS = 5000.0
API_TIMEOUT_SECONDS = 30.0
T = TypeVar("T")


class Setup:
    """One gateway configuration on a running kubesim: replicas, balancer, a pool."""

    def __init__(
        self, cluster: ClusterProcess, root: Path, *, store_url: str, password_file: Path, guard: MemoryGuard
    ) -> None:
        self.cluster = cluster
        self.guard = guard
        self.root = root
        self.store_url = store_url
        self.password_file = password_file
        self.stack = AsyncExitStack()
        self.replicas: ReplicaSet

    async def start(self, count: int) -> None:
        holder: list[ReplicaSet] = []
        front = await self.stack.enter_async_context(balancer(lambda: holder[0].backends() if holder else []))
        # kubesim is one Python process serving the API, the controllers and every pod's kubelet
        # work: with hundreds of pods on a loaded host it can take seconds to answer, which is the
        # host, not the gateway (a create that still fails is counted, not fatal).
        driver = driver_config(
            self.cluster,  # type: ignore[arg-type]
            self.root / "unused",
            gateway_address=front.address,
            api_timeout_seconds=API_TIMEOUT_SECONDS,
        )
        self.replicas = await self.stack.enter_async_context(
            replica_set(self.root, store_url=self.store_url, password_file=self.password_file, driver=driver)
        )
        self.replicas.settings["log_level"] = "WARNING"
        holder.append(self.replicas)
        for _ in range(count):
            await self.replicas.start_one()
        self.front = self.replicas.stub(front.address)
        self.direct = [self.replicas.stub(r.tcp) for r in self.replicas.replicas]

    async def pool(self, size: int) -> None:
        shape = SandboxShape(workspace="default", image=IMAGE, environment=WARM_ENV)
        template, pool = warmpools.render_pool_pair(
            self.replicas.driver, name=POOL, namespace=NAMESPACE, shape=shape, replicas=size
        )
        await self.cluster.admin.create(kc.TEMPLATES, NAMESPACE, template)
        await self.cluster.admin.create(kc.POOLS, NAMESPACE, pool)

    async def idle(self) -> int:
        total = 0
        for stub in self.direct:
            listed = await stub.ListPools(pb.ListPoolsRequest(), metadata=self.replicas.metadata)
            total += sum(p.idle for p in listed.pools if p.name == POOL)
        return total

    async def wait_idle(self, at_least: int, timeout: float = 600.0) -> None:
        async with asyncio.timeout(timeout):
            while await self.idle() < at_least:
                self.guard.check()
                await asyncio.sleep(0.1)  # pools have no watch

    async def pod_memory(self) -> dict[str, float]:
        """PSS of every pod process (kubesim's descendants) and per running pod, MiB."""
        listed = await self.cluster.admin.list_objects(kc.PODS, NAMESPACE)
        running = sum((p.get("status") or {}).get("phase") == "Running" for p in listed.get("items") or [])
        total = pods_pss_mib(self.cluster.pid)
        return {"pods_running": running, "pss_mib_total": total, "pss_mib_per_pod": total / max(running, 1)}

    async def create_ready(self, name: str, *, timeout: float = 120.0) -> tuple[float, pb.Sandbox]:
        md = self.replicas.metadata
        started = time.perf_counter()
        await self.front.CreateSandbox(
            pb.CreateSandboxRequest(name=name, spec=pb.SandboxSpec(environment=WARM_ENV)), metadata=md
        )
        ready = await wait_phase(self.front, md, name, timeout=timeout)
        return (time.perf_counter() - started) * 1000, ready

    async def delete_all(self) -> None:
        md = self.replicas.metadata
        listed = await self.front.ListSandboxes(pb.ListSandboxesRequest(all_workspaces=True), metadata=md)
        await asyncio.gather(
            *(self.front.DeleteSandbox(pb.SandboxRef(name=s.name), metadata=md) for s in listed.sandboxes)
        )
        await self.cluster.admin.delete(kc.POOLS, NAMESPACE, POOL)
        await self.cluster.admin.delete(kc.TEMPLATES, NAMESPACE, POOL)

    async def aclose(self) -> None:
        await self.stack.aclose()


async def sequential_and_burst(setup: Setup, *, sequential: int, pool: int, burst: int) -> dict[str, Any]:
    await setup.pool(max(pool, burst))
    await setup.wait_idle(pool)
    latencies, cold = [], 0
    for i in range(sequential + 3):
        await setup.wait_idle(pool)
        ms, ready = await setup.create_ready(f"seq-{i}")
        await setup.front.DeleteSandbox(pb.SandboxRef(name=f"seq-{i}"), metadata=setup.replicas.metadata)
        cold += ready.status.allocation != "warm"
        if i >= 3:
            latencies.append(ms)
    await setup.wait_idle(burst)
    started = time.perf_counter()
    results = await asyncio.gather(*(setup.create_ready(f"burst-{i}") for i in range(burst)))
    seconds = time.perf_counter() - started
    burst_cold = sum(r.status.allocation != "warm" for _, r in results)
    await setup.delete_all()
    return {
        "sequential_ms": summary(latencies),
        "sequential_not_warm": cold,
        "burst": {
            "n": burst,
            "seconds": seconds,
            "creates_per_second": burst / seconds,
            "ms": summary([ms for ms, _ in results]),
            "not_warm": burst_cold,
        },
    }


async def kill_one(setup: Setup, *, sandboxes: int) -> dict[str, Any]:
    """Sandboxes spread over 3 replicas; kill -9 the one holding most sessions; time to all Ready."""
    await setup.pool(sandboxes)
    await setup.wait_idle(sandboxes)
    names = [f"kill-{i}" for i in range(sandboxes)]
    readies = await asyncio.gather(*(setup.create_ready(n) for n in names))
    owners = [_owner(r) for _, r in readies]
    victim = max(setup.replicas.replicas, key=lambda r: owners.count(r.id))
    affected = [n for n, o in zip(names, owners, strict=True) if o == victim.id]
    survivor = next(i for i, r in enumerate(setup.replicas.replicas) if r is not victim)
    md = setup.replicas.metadata
    setup.replicas.kill(victim)
    killed = time.perf_counter()
    alive = {r.id for r in setup.replicas.replicas if r.alive}
    async with asyncio.timeout(120):
        while True:
            listed = await setup.direct[survivor].ListSandboxes(pb.ListSandboxesRequest(), metadata=md)
            by_name = {s.name: s for s in listed.sandboxes}
            if all(by_name[n].status.phase == pb.SANDBOX_PHASE_READY and _owner(by_name[n]) in alive for n in affected):
                break
            await asyncio.sleep(0.05)
    took = time.perf_counter() - killed
    await setup.delete_all()
    return {"sandboxes": sandboxes, "affected": len(affected), "seconds_to_all_ready": took}


def _owner(sandbox: pb.Sandbox) -> str:
    condition = next((c for c in sandbox.status.conditions if c.type == "SupervisorConnected"), None)
    if condition is None or condition.status != "True":
        return ""
    return condition.message.removeprefix("session ").split("/")[0]


async def poisson(setup: Setup, *, rate: float, wanted: int, seed: int, pod_mib: float) -> dict[str, Any]:
    """As many warm creates as the pool holds, with exponential gaps at `rate`/s, against a pool
    pre-filled to `wanted` (fewer, said loudly, when memory cannot hold them)."""
    pool = count = setup.guard.fit(wanted, pod_mib, "warm kubesim pods")
    await setup.pool(pool)
    filling, available_before = time.perf_counter(), available_mib()
    await setup.wait_idle(pool, timeout=1800)
    fill_seconds = time.perf_counter() - filling
    memory = await setup.pod_memory()
    # What PSS misses (page tables, each pod's namespaces and tmpfs root), if nobody else moved.
    memory["available_drop_mib_per_pod"] = (available_before - available_mib()) / max(pool, 1)
    rng = random.Random(seed)
    ready = [0]
    memory_low: list[str] = []
    follower = asyncio.create_task(_hold_pool_to_its_fill(setup, pool, ready, memory_low))

    async def one(name: str) -> tuple[float, pb.Sandbox] | str:
        try:
            result = await setup.create_ready(name, timeout=300)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        ready[0] += 1
        return result

    tasks = []
    started = time.perf_counter()
    for i in range(count):
        if memory_low:
            break
        tasks.append(asyncio.create_task(one(f"p-{i}")))
        await asyncio.sleep(rng.expovariate(rate))
    sent_seconds = time.perf_counter() - started
    everything = asyncio.gather(*tasks)
    await asyncio.wait([everything, follower], return_when=asyncio.FIRST_COMPLETED)
    if memory_low:  # tear down now (the caller's clean-up stops every pod): do not wait for the rest
        everything.cancel()
        await asyncio.gather(everything, return_exceptions=True)
        raise MemoryLow(memory_low[0])
    outcomes = await everything
    results = [r for r in outcomes if not isinstance(r, str)]
    failures = [r for r in outcomes if isinstance(r, str)]
    follower.cancel()
    await asyncio.gather(follower, return_exceptions=True)
    await setup.delete_all()
    return {
        "rate": rate,
        "count": len(outcomes),
        "failed": len(failures),
        "failures": failures[:5],
        "pool": pool,
        "pool_wanted": wanted,
        "pool_fill_seconds": fill_seconds,
        "pod_memory": memory,
        "sent_over_seconds": sent_seconds,
        "ms": summary([ms for ms, _ in results]),
        "not_warm": sum(r.status.allocation != "warm" for _, r in results),
    }


async def _hold_pool_to_its_fill(setup: Setup, pool: int, ready: list[int], memory_low: list[str]) -> None:
    """While the creates run, the pool's `spec.replicas` follows them down (pool - creates Ready),
    so agent-sandbox does not refill what they took: the scenario pre-fills the pool instead, and
    a refill of as many pods again would double what this host holds. It lags the adoptions (a
    few refills happen); lowering it ahead of them would delete idle members a create was about
    to take. Also watches memory: under the guard's floor the creates stop (`memory_low`) and
    the run is torn down."""
    asked = pool
    while True:
        if (target := max(0, pool - ready[0])) != asked:
            await setup.cluster.admin.patch(kc.POOLS, NAMESPACE, POOL, {"spec": {"replicas": target}})
            asked = target
        try:
            setup.guard.check()
        except MemoryLow as low:
            memory_low.append(str(low))
            print(f"\n*** MEMORY: {low} ***\n", file=sys.stderr, flush=True)
            return
        await asyncio.sleep(0.2)


async def sustained(setup: Setup, *, rates: list[float], seconds: float, pool: int) -> dict[str, Any]:
    """`rates` in order for `seconds` each (creates deleted once Ready, so the pool refills) until
    one fails (a create went cold, or Ready p99 over the limit), then the midpoint between the last
    that held and the first that failed: the highest rate found to hold is reported."""
    tried: list[dict[str, Any]] = []
    best = 0.0
    failed: float | None = None
    for rate in rates:
        row = await _sustain(setup, rate, seconds=seconds, pool=pool)
        tried.append(row)
        if not row["kept_up"]:
            failed = rate
            break
        best = rate
    if failed is not None and best and failed - best > 0.5:
        middle = round((best + failed) / 2, 1)
        row = await _sustain(setup, middle, seconds=seconds, pool=pool)
        tried.append(row)
        best = middle if row["kept_up"] else best
    return {"seconds": seconds, "pool": pool, "tried": tried, "highest_sustained_rate": best}


async def _sustain(setup: Setup, rate: float, *, seconds: float, pool: int) -> dict[str, Any]:
    """One rate for `seconds`, from a full pool of `pool`."""
    await setup.pool(pool)
    await setup.wait_idle(pool)
    rng = random.Random(int(rate * 1000))
    tasks = []

    async def one(name: str) -> tuple[float, pb.Sandbox]:
        result = await setup.create_ready(name, timeout=300)
        await setup.front.DeleteSandbox(pb.SandboxRef(name=name), metadata=setup.replicas.metadata)
        return result

    deadline = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < deadline:
        tasks.append(asyncio.create_task(one(f"s{rate:g}-{i}")))
        i += 1
        await asyncio.sleep(rng.expovariate(rate))
    results = await asyncio.gather(*tasks)
    cold = sum(r.status.allocation != "warm" for _, r in results)
    stats = summary([ms for ms, _ in results])
    kept_up = cold == 0 and stats["p99"] <= READY_P99_LIMIT_MS
    await setup.delete_all()
    return {
        "rate": rate,
        "creates": len(results),
        "not_warm": cold,
        "ms": stats,
        "kept_up": kept_up,
        "load_average": os.getloadavg(),
    }


async def with_setup(
    cluster: ClusterProcess,
    root: Path,
    name: str,
    *,
    replicas: int,
    store_url: str,
    password_file: Path,
    guard: MemoryGuard,
) -> Setup:
    setup = Setup(cluster, root / name, store_url=store_url, password_file=password_file, guard=guard)
    await setup.start(replicas)
    return setup


async def run(args: argparse.Namespace) -> dict[str, Any]:
    data: dict[str, Any] = {"load_average_start": os.getloadavg(), "available_mib_start": available_mib()}
    guard = MemoryGuard(args.memory_reserve_mib)
    parts = set(args.parts.split(","))
    with dev_postgres_server() as server, tempfile.TemporaryDirectory(prefix="ws-bench-replicas-") as tmp:
        root = Path(tmp)
        password = server.password_file
        if "fast" in parts:
            async with kubesim_process("fast") as cluster:
                configs = [
                    ("1 gateway, SQLite", 1, ""),
                    ("1 gateway, Postgres", 1, "pg"),
                    ("3 gateways, Postgres", 3, "pg"),
                ]
                data["fast"] = []
                for label, count, store in configs:
                    url = await server.create_database() if store else ""
                    setup = await with_setup(
                        cluster,
                        root,
                        f"fast-{len(data['fast'])}",
                        replicas=count,
                        store_url=url,
                        password_file=password,
                        guard=guard,
                    )
                    try:
                        result = await sequential_and_burst(
                            setup, sequential=args.sequential, pool=args.pool, burst=args.burst
                        )
                        if count == 3:
                            result["kill_9"] = await kill_one(setup, sandboxes=args.kill_sandboxes)
                    finally:
                        await setup.aclose()
                    data["fast"].append({"config": label, **result, "load_average": os.getloadavg()})
                    _checkpoint(args, data)
        if parts & {"poisson", "sustained"}:
            async with kubesim_process("default") as cluster:
                data["poisson"] = []
                for count in (1, 3):
                    if "poisson" not in parts and count == 1:
                        continue
                    url = await server.create_database()
                    setup = await with_setup(
                        cluster,
                        root,
                        f"poisson-{count}",
                        replicas=count,
                        store_url=url,
                        password_file=password,
                        guard=guard,
                    )
                    try:
                        if "poisson" in parts:
                            result = await _reported(
                                poisson(
                                    setup,
                                    rate=args.poisson_rate,
                                    wanted=args.poisson_pool,
                                    seed=1251,
                                    pod_mib=args.pod_mib,
                                )
                            )
                            data["poisson"].append({"replicas": count, **result, "load_average": os.getloadavg()})
                            _checkpoint(args, data)
                        if count == 3 and "sustained" in parts:
                            data["sustained"] = await sustained(
                                setup, rates=args.rates, seconds=args.sustain_seconds, pool=args.pool
                            )
                    finally:
                        await setup.aclose()
    return data


def _checkpoint(args: argparse.Namespace, data: dict[str, Any]) -> None:
    """The results so far, written (a later part that fails loses nothing of the earlier ones)."""
    write_results(args.name, {**data, "args": vars(args)}, table_for(data))


async def _reported(work: Awaitable[T]) -> T:
    """`work`, its failure printed at once (the clean-up of hundreds of pods that follows can take
    long, or fail itself, and hide it)."""
    try:
        return await work
    except BaseException:
        traceback.print_exc()
        raise


def table_for(data: dict[str, Any]) -> str:
    text = ""
    if data.get("fast"):
        text += _fast_table(data["fast"])
    if data.get("poisson"):
        text += _poisson_table(data["poisson"])
    if data.get("sustained"):
        text += _sustained_table(data["sustained"])
    text += (
        f"\nMemory available at the start: {data['available_mib_start']:.0f} MiB. The machine is shared (2 cores, "
        "other engineers' tests and benchmarks running): compare rows of this run with each other, not with "
        "other runs.\n"
    )
    return text


def _fast_table(rows: list[dict[str, Any]]) -> str:
    base = rows[0]["sequential_ms"]["p50"]
    text = "### Warm create -> Ready on kubesim `fast` (client-side, ms)\n\n"
    text += "| gateways | sequential p50 | p99 | p50 / 1 on SQLite | burst creates | creates/s | burst p50 | p99 "
    text += "| not warm | load avg |\n"
    text += "|---|---|---|---|---|---|---|---|---|---|\n"
    for row in rows:
        s, b = row["sequential_ms"], row["burst"]
        text += (
            f"| {row['config']} | {s['p50']:.1f} | {s['p99']:.1f} | {s['p50'] / base:.2f}x | {b['n']} "
            f"| {b['creates_per_second']:.1f} | {b['ms']['p50']:.0f} | {b['ms']['p99']:.0f} "
            f"| {b['not_warm'] + row['sequential_not_warm']} | {row['load_average'][0]:.1f} |\n"
        )
    kill = rows[-1].get("kill_9")
    if kill:
        text += (
            f"\nkill -9 of the replica holding {kill['affected']} of {kill['sandboxes']} sessions: every affected "
            f"sandbox Ready again on a survivor after **{kill['seconds_to_all_ready']:.2f} s** "
            "(heartbeat timeout in this setup: 3 s).\n"
        )
    return text


def _poisson_table(rows: list[dict[str, Any]]) -> str:
    text = "\n### Poisson arrivals of warm creates on kubesim `default` (create -> Ready, ms)\n\n"
    text += "| gateways | rate/s | creates | failed | pool (asked) | pool fill s | PSS per pod MiB | p50 | p90 | p99 "
    text += "| not warm | load avg |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    for row in rows:
        ms, memory = row["ms"], row["pod_memory"]
        text += (
            f"| {row['replicas']} | {row['rate']:g} | {row['count']} | {row['failed']} "
            f"| {row['pool']} ({row['pool_wanted']}) "
            f"| {row['pool_fill_seconds']:.0f} | {memory['pss_mib_per_pod']:.1f} | {ms['p50']:.0f} "
            f"| {ms['p90']:.0f} | {ms['p99']:.0f} | {row['not_warm']} | {row['load_average'][0]:.1f} |\n"
        )
        if row["pool"] < row["pool_wanted"]:
            text += f"\n**Reduced:** the pool was {row['pool']}, not {row['pool_wanted']}: memory did not allow it.\n\n"
    text += "\nagent-sandbox PR #1251 (45/s sustained, in-cluster): p50 92 / p90 182 / p99 376 ms.\n"
    return text


def _sustained_table(data: dict[str, Any]) -> str:
    seconds, pool = data["seconds"], data["pool"]
    text = f"\n### Highest rate sustained for {seconds:g} s, 3 gateways, pool {pool}, kubesim `default`\n\n"
    text += "| rate/s | creates | not warm | p50 | p99 | kept up | load avg |\n|---|---|---|---|---|---|---|\n"
    for row in data["tried"]:
        text += (
            f"| {row['rate']:g} | {row['creates']} | {row['not_warm']} | {row['ms']['p50']:.0f} "
            f"| {row['ms']['p99']:.0f} | {row['kept_up']} | {row['load_average'][0]:.1f} |\n"
        )
    return text + f"\nHighest sustained: **{data['highest_sustained_rate']:g}/s**.\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sequential", type=int, default=30)
    parser.add_argument("--pool", type=int, default=8)
    parser.add_argument("--burst", type=int, default=24)
    parser.add_argument("--kill-sandboxes", type=int, default=12)
    parser.add_argument("--poisson-rate", type=float, default=45.0)
    parser.add_argument("--poisson-pool", type=int, default=450, help="pool pre-filled, and creates sent")
    parser.add_argument("--pod-mib", type=float, default=40.0, help="memory to allow per kubesim pod (PSS ~25)")
    parser.add_argument("--memory-reserve-mib", type=float, default=8192.0, help="left available to others")
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--parts", default="fast,poisson,sustained")
    parser.add_argument("--sustain-seconds", type=float, default=60.0)
    parser.add_argument("--name", default="replicas")
    args = parser.parse_args()
    _checkpoint(args, asyncio.run(run(args)))


if __name__ == "__main__":
    main()
