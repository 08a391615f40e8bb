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
   cold. The pool's `spec.replicas` is lowered as each create is *sent* (to what is left of the
   pre-fill plus `--poisson-surplus`), so the pool controller refills at most the surplus while
   the creates run. Each kubesim pod is a real process (PSS per pod is measured and reported):
   the pre-fill plus the surplus is sized down, loudly and in the results, when the memory
   available above `--memory-reserve-mib` cannot hold them at `--pod-mib` each; the pre-fill is
   paced (`--fill-step` pods at a time, each step waited for, and it stops early, loudly, when the
   MemAvailable measured per pod says the rest would not fit), and the run stops if available
   memory falls under `--memory-floor-mib`;
5. the highest rate sustained for `--sustain-seconds` on `default` timing, with `--sustain-replicas`
   gateways (3) on Postgres (and with `--sustain-sqlite` one gateway on SQLite first): a search
   (`ratesearch`) doubling from `--search-start` until a step fails, then bisecting between the
   highest that held and the lowest that failed down to `--resolution`.
   A step holds when no create fails or goes cold, Ready p99 stays under 5 s, and the refills
   keep up: the pool's deficit of idle members (sampled from its status every 0.5 s) does not
   grow while the creates arrive. Every step starts from a full pool and a quiet cluster. Each
   reports the CPU per create of every process (kubesim's API server and controllers, its pods,
   each gateway, Postgres, this process) net of what each spends idle, and the gateways'
   kubesim requests per create; `--profile-dir` adds py-spy stacks.

6. (`--parts cpu`) where the CPU of a warm create goes, before and after a change: one gateway on
   SQLite (`--cpu-replicas 1`, the default) and/or several on Postgres behind the balancer
   (`--cpu-replicas 3`, or `1,3` for both in each round), a pool of `--pool`, warm creates at
   `--cpu-rate` for `--cpu-seconds` (each deleted once Ready), for `--cpu-rounds` rounds
   alternating the tree under test with `--before-src` (an older tree's `src/`, in its whole
   tree: run by kubesim, its pods and the gateways alike, its pool, gateway settings and kubesim
   image rules rendered by its own code, `treeparts`). Each run reports the CPU per create of every process
   (each gateway, Postgres, kubesim's API server, and its controllers process apart on a tree
   older than the controllers in the API server's process), the gateways' by thread (their event
   loops, the SQLite worker, gRPC's, asyncpg has none), with py-spy on PATH each event loop's
   busy samples by part of the code (summed over the gateways), and the gateways' API requests
   per create (writes apart).

`--parts` runs a subset (fast, poisson, sustained, cpu; the first three by default).

`--pods` says how kubesim runs the warmshell image's pods: `fork` (the default) forks each pod's
supervisor from kubesim's pre-imported fork server (its default rule for the image: one import
shared copy-on-write, as a node's pre-pulled image shares its files), `shim` execs the tests' pod
shim (bubblewrap and a fresh Python per pod, ~18 MiB and ~0.25 s of CPU each). Both run the real
supervisor with its volumes at their mount paths.

Creates -> Ready are client-side: the SDK's one CreateSandbox call that answers once the sandbox
is Ready (on the replica the balancer picked), a watch only when it answers before that;
`--watch-create` has the client create and then watch until Ready (two calls, as before issue 35).
Postgres is `scripts/dev-postgres` (a throwaway server).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fnmatch
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import cpuparts
import grpc
import ratesearch
import treeparts
from harness import summary, write_results
from memory import MemoryGuard, MemoryLow, available_mib, descendants, is_kubesim_process, pods_pss_mib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubesim.controllers import client as kc  # noqa: E402
from tests.helpers.kubesim_process import ClusterProcess, kubesim_process  # noqa: E402
from tests.helpers.postgres import DevPostgres, dev_postgres_server  # noqa: E402
from tests.helpers.replicas import ReplicaSet, balancer, replica_set, wait_phase  # noqa: E402
from tests.integration.drivers_kubernetes.conftest import IMAGE, IMAGES, NAMESPACE, driver_config  # noqa: E402
from warmshell.api.v1 import sandbox_pb2 as pb  # noqa: E402
from warmshell.core.fingerprints import SandboxShape  # noqa: E402
from warmshell.drivers.kubernetes.warm import warmpools  # noqa: E402
from warmshell.sdk import calls  # noqa: E402

POOL = "bench"
WARM_ENV = {"FOO": "bar"}
# A create has settled once Ready or Error (a provisioning timeout): waiting on past Error is waiting for nothing.
_SETTLED = (pb.SANDBOX_PHASE_READY, pb.SANDBOX_PHASE_ERROR)
READY_P99_LIMIT_MS = 5000.0
API_TIMEOUT_SECONDS = 30.0
IDLE_SECONDS = 5.0  # the idle CPU baseline before each sustained rate
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
        self.postgres_pid = 0  # the server's postmaster, for CPU figures (0: not known)
        self.logs_dir: Path | None = None  # where the replicas' logs are copied on close
        self.log_level = "WARNING"
        self.short_intervals = True  # the tests' heartbeats and relists (see ReplicaSet)
        # How the client waits for Ready: the SDK's one CreateSandbox that answers once Ready (False),
        # or a CreateSandbox answered at once and a WatchSandbox (True; the client before issue 35).
        self.watch_create = False
        # An older tree under test (`--before-src`): its driver settings and pool, as it renders them.
        self.tree: treeparts.TreeParts | None = None

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
        if self.tree is not None:
            self.tree.render(
                kubeconfig=self.cluster.kubeconfig,
                gateway_address=front.address,
                api_timeout_seconds=API_TIMEOUT_SECONDS,
                name=POOL,
                environment=WARM_ENV,
            )
            driver = self.tree.config  # type: ignore[assignment]
        self.replicas = await self.stack.enter_async_context(
            replica_set(self.root, store_url=self.store_url, password_file=self.password_file, driver=driver)
        )
        self.replicas.settings["log_level"] = self.log_level
        self.replicas.short_intervals = self.short_intervals
        holder.append(self.replicas)
        for _ in range(count):
            await self.replicas.start_one()
        self.front = self.replicas.stub(front.address)
        self.direct = [self.replicas.stub(r.tcp) for r in self.replicas.replicas]

    async def pool(self, size: int) -> None:
        if self.tree is not None:
            template, pool = self.tree.pool_pair(size)
        else:
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

    async def create_ready(
        self, name: str, *, timeout: float = 120.0, phases: tuple[int, ...] = (pb.SANDBOX_PHASE_READY,)
    ) -> tuple[float, pb.Sandbox]:
        md = self.replicas.metadata
        started = time.perf_counter()
        request = pb.CreateSandboxRequest(name=name, spec=pb.SandboxSpec(environment=WARM_ENV))
        deadline = None
        if not self.watch_create:  # the SDK's request: one call that answers once Ready (or failed)
            deadline = calls.ask_ready(request, ready_timeout=timeout, call_timeout=API_TIMEOUT_SECONDS)
        created = await self.front.CreateSandbox(request, metadata=md, timeout=deadline)
        if created.status.phase in phases:
            return (time.perf_counter() - started) * 1000, created
        # Still Provisioning (the replica stopping, or the client that watches): watch the rest.
        ready = await wait_phase(self.front, md, name, phases=phases, timeout=timeout)
        return (time.perf_counter() - started) * 1000, ready

    async def not_ready(self, name: str) -> str:
        """Why a create never reached Ready: its phase and its Ready condition, from its record."""
        got = await self.front.GetSandbox(pb.SandboxRef(name=name), metadata=self.replicas.metadata)
        ready = [c for c in got.status.conditions if c.type == "Ready"]
        why = f"{ready[0].reason}: {ready[0].message}" if ready else "no Ready condition"
        return f"not Ready ({pb.SandboxPhase.Name(got.status.phase)}): {why}"

    async def delete_all(self) -> None:
        md = self.replicas.metadata
        listed = await self.front.ListSandboxes(pb.ListSandboxesRequest(all_workspaces=True), metadata=md)
        # A few hundred deletes at once on one connection went past its stream limit (the server
        # refused streams: UNAVAILABLE, RST_STREAM 7) and lost the part's results with them.
        slots = asyncio.Semaphore(32)

        async def delete(name: str) -> None:
            async with slots:
                await self.front.DeleteSandbox(pb.SandboxRef(name=name), metadata=md)

        await asyncio.gather(*(delete(s.name) for s in listed.sandboxes))
        await self.cluster.admin.delete(kc.POOLS, NAMESPACE, POOL)
        await self.cluster.admin.delete(kc.TEMPLATES, NAMESPACE, POOL)

    async def wait_pods_gone(self, timeout: float = 600.0) -> None:
        """Until kubesim runs no pod (the next part sizes itself to the memory they free)."""
        async with asyncio.timeout(timeout):
            while (await self.cluster.admin.list_objects(kc.PODS, NAMESPACE)).get("items"):
                await asyncio.sleep(1.0)

    async def aclose(self) -> None:
        await self.stack.aclose()
        if self.logs_dir is not None:  # the replicas' logs outlive the run's temporary directory
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            for replica in self.replicas.replicas:
                (self.logs_dir / f"{self.root.name}-{replica.id}.log").write_text(replica.log())


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


def _stat_seconds(pid: int) -> tuple[float, float]:
    """(utime + stime, cutime + cstime) of one process, seconds (0s when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def tree_cpu_seconds(pid: int, *, own_if: Callable[[int], bool] = lambda _: False) -> tuple[float, float]:
    """CPU seconds of a process itself and of its descendants: every live descendant's own and
    reaped children's time, plus the children it reaped itself (an ended pod's CPU reaches its
    parent's cutime when reaped, so a difference of two readings is the CPU between them).
    Descendants for which `own_if` holds count as the process itself (their own time only)."""
    own, reaped = _stat_seconds(pid)
    below = reaped
    for child in descendants(pid):
        mine, theirs = _stat_seconds(child)
        if own_if(child):
            own += mine
            below += theirs
        else:
            below += mine + theirs
    return own, below


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy since boot (/proc/stat)."""
    with open("/proc/stat") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class CpuSplit:
    """CPU seconds per part of a run (kubesim's API/controllers, its pods, each gateway, Postgres,
    this process: the client and the balancer standing in for the Service) and of the whole
    machine (what is not ours is other engineers' load)."""

    def __init__(self, setup: Setup) -> None:
        self._setup = setup
        self._postgres = setup.postgres_pid
        self._start = self._read()

    def _read(self) -> dict[str, float]:
        kubesim, pods = tree_cpu_seconds(self._setup.cluster.pid, own_if=is_kubesim_process)
        parts = {"kubesim": kubesim, "kubesim pods": pods}
        for replica in self._setup.replicas.replicas:
            parts[f"gateway {replica.id}"] = sum(tree_cpu_seconds(replica.process.pid))
        parts["postgres"] = sum(tree_cpu_seconds(self._postgres)) if self._postgres else 0.0
        times = os.times()
        parts["bench (client, balancer)"] = times.user + times.system
        parts["machine"] = machine_busy_seconds()
        return parts

    def delta_ms(self) -> dict[str, float]:
        """CPU ms of each part since this was made, and of the rest of the machine."""
        now = self._read()
        split = {k: (now[k] - self._start.get(k, 0.0)) * 1000 for k in now}
        ours = sum(v for k, v in split.items() if k != "machine")
        split["others on the machine"] = max(0.0, split.pop("machine") - ours)
        return split

    def per_create_ms(self, creates: int) -> dict[str, float]:
        """CPU ms per create of each part since this was made."""
        return {k: v / max(creates, 1) for k, v in self.delta_ms().items()}


async def idle_cpu_ms_per_second(setup: Setup, seconds: float) -> dict[str, float]:
    """What each part spends per second with a full pool and no creates (heartbeats, leases,
    informers' resyncs, idle pods)."""
    cpu = CpuSplit(setup)
    await asyncio.sleep(seconds)
    return {k: v / seconds for k, v in cpu.delta_ms().items()}


FILL_MARGIN = 1.25  # on the measured MemAvailable per pod: a start's transient, claimed pods' extra


async def paced_fill(setup: Setup, wanted: int, *, step: int, surplus: int) -> tuple[int, list[dict[str, float]]]:
    """Fill the pool towards `wanted` `step` pods at a time: raise `spec.replicas`, wait until
    every member is idle on the gateways, and measure what a pod costs in MemAvailable so far.
    The next step goes only if it and the `surplus` the run refills fit above the guard's reserve
    at that cost (x FILL_MARGIN); else the fill stops where it is, said loudly. Before, the whole
    pre-fill was asked at once: 450 supervisors starting together took MemAvailable from 22 GiB
    to 2.9 GiB and the load to ~1,400. Returns the pool reached and each step's figures."""
    available_before = available_mib()
    asked = min(step, wanted)
    await setup.pool(asked)
    started, steps = time.perf_counter(), []
    while True:
        await setup.wait_idle(asked, timeout=900)
        available = available_mib()
        per_pod = max((available_before - available) / asked, 1.0)
        seconds = time.perf_counter() - started
        steps.append({"pods": asked, "seconds": seconds, "available_mib": available, "mib_per_pod": per_pod})
        print(f"fill: {asked} pods idle, {available:.0f} MiB available, {per_pod:.1f} MiB per pod", file=sys.stderr)
        if asked >= wanted:
            return asked, steps
        room_pods = int((available - setup.guard.reserve_mib) // (per_pod * FILL_MARGIN)) - surplus
        target = min(asked + step, wanted, asked + max(room_pods, 0))
        if target < min(asked + step, wanted):
            print(
                f"\n*** MEMORY: the fill stops at {target} of {wanted} pods: {available:.0f} MiB available, "
                f"{setup.guard.reserve_mib:.0f} MiB kept for others, {per_pod:.1f} MiB per pod measured "
                f"(x{FILL_MARGIN:g}), {surplus} more for the run's refills. ***\n",
                file=sys.stderr,
                flush=True,
            )
            if target <= asked:
                return asked, steps
        await setup.cluster.admin.patch(kc.POOLS, NAMESPACE, POOL, {"spec": {"replicas": target}})
        asked = target


async def poisson(
    setup: Setup, *, rate: float, wanted: int, seed: int, pod_mib: float, surplus: int, fill_step: int
) -> dict[str, Any]:
    """As many warm creates as the pool holds, with exponential gaps at `rate`/s, against a pool
    pre-filled to `wanted` in paced steps (fewer, said loudly, when memory cannot hold them)."""
    fits = setup.guard.fit(wanted + surplus, pod_mib, "warm kubesim pods (pool and surplus)") - surplus
    if fits <= 0:
        raise MemoryLow(f"not even {surplus + 1} kubesim pods fit in the memory available")
    available_before = available_mib()
    pool, fill_steps = await paced_fill(setup, fits, step=fill_step, surplus=surplus)
    count = pool
    fill_seconds = fill_steps[-1]["seconds"]
    memory = await setup.pod_memory()
    # What PSS misses (page tables, each pod's namespaces and tmpfs root), if nobody else moved.
    memory["available_drop_mib_per_pod"] = (available_before - available_mib()) / max(pool, 1)
    rng = random.Random(seed)
    available_before_creates = available_mib()
    refill = RefillStop(setup, pool, surplus)
    follower = asyncio.create_task(refill.run())

    async def one(name: str) -> tuple[float, pb.Sandbox] | str:
        try:
            ready = await setup.create_ready(name, timeout=300, phases=_SETTLED)
            return ready if ready[1].status.phase == pb.SANDBOX_PHASE_READY else await setup.not_ready(name)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        except AssertionError:  # never Ready: a failed create, described by its record
            return await setup.not_ready(name)

    tasks = []
    cpu = CpuSplit(setup)
    started = time.perf_counter()
    # Arrivals at absolute times: a sleep per gap after each send let every late wake-up of this
    # busy loop add up (450 creates at 45/s once took 24.6 s to send); a late send now goes at
    # once and the next keeps its own time.
    due = started
    for i in range(count):
        if refill.memory_low:
            break
        tasks.append(asyncio.create_task(one(f"p-{i}")))
        refill.sent()
        due += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
    sent_seconds = time.perf_counter() - started
    scheduled_seconds = due - started
    everything = asyncio.gather(*tasks)
    await asyncio.wait([everything, follower], return_when=asyncio.FIRST_COMPLETED)
    if refill.memory_low:  # tear down now (the caller's clean-up stops every pod): do not wait for the rest
        everything.cancel()
        await asyncio.gather(everything, return_exceptions=True)
        raise MemoryLow(refill.memory_low[0])
    outcomes = await everything
    cpu_ms = cpu.per_create_ms(len(outcomes))
    follower.cancel()
    await asyncio.gather(follower, return_exceptions=True)
    results = [r for r in outcomes if not isinstance(r, str)]
    failures = [r for r in outcomes if isinstance(r, str)]
    pods = await setup.cluster.admin.list_objects(kc.PODS, NAMESPACE)
    await setup.delete_all()
    await setup.wait_pods_gone()
    return {
        "rate": rate,
        "count": len(outcomes),
        "failed": len(failures),
        "failures": failures[:5],
        "pool": pool,
        "pool_wanted": wanted,
        "surplus": surplus,
        # Every pod that existed once the creates were Ready: the pre-fill, plus what the pool
        # controller added while the creates ran (at most `surplus` when nothing was deleted).
        "pods_after": len(pods.get("items") or []),
        "refill_patches": refill.patches,
        # The least MemAvailable seen while the creates ran (claimed pods cost more than idle ones).
        "lowest_available_mib": refill.lowest_available_mib,
        "available_mib_before_creates": available_before_creates,
        "pool_fill_seconds": fill_seconds,
        "fill_steps": fill_steps,
        "pod_memory": memory,
        "sent_over_seconds": sent_seconds,
        # The arrival process's own span (the last gap included): sent_over_seconds beyond it
        # is this client falling behind.
        "scheduled_seconds": scheduled_seconds,
        "cpu_ms_per_create": cpu_ms,
        "ms": summary([ms for ms, _ in results]),
        "not_warm": sum(r.status.allocation != "warm" for _, r in results),
    }


def refill_target(pool: int, sent: int, surplus: int) -> int:
    """The pool's `spec.replicas` once `sent` creates have been sent: what is left of the pre-fill
    plus `surplus` (never above the pre-fill). The surplus covers the creates sent but not yet
    bound to a member: with fewer desired than members left, the pool controller deletes idle
    members those creates were about to take; with more, it refills. So at most `surplus` pods
    are added during a run, and members are deleted only while more than `surplus` creates wait
    for their claim to bind."""
    return max(0, min(pool, pool - sent + surplus))


class RefillStop:
    """Lowers the pool's `spec.replicas` as each create is sent (`refill_target`), so the pool
    controller does not refill what the creates take: the scenario pre-fills the pool instead,
    and a refill of as many pods again would double what this host holds. One patch at a time,
    of the latest target (sends that arrive while a patch is in flight are folded into the next).
    Also watches memory: under the guard's floor `memory_low` says why and the creates stop."""

    def __init__(self, setup: Setup, pool: int, surplus: int) -> None:
        self._setup = setup
        self._pool = pool
        self._surplus = surplus
        self._sent = 0
        self._asked = pool
        self._wake = asyncio.Event()
        self.patches = 0
        self.memory_low: list[str] = []
        self.lowest_available_mib = available_mib()

    def sent(self) -> None:
        """One more create was sent."""
        self._sent += 1
        self._wake.set()

    async def run(self) -> None:
        """Patch and watch memory until cancelled, or until memory is low (then return)."""
        while True:
            if (target := refill_target(self._pool, self._sent, self._surplus)) != self._asked:
                patch = {"spec": {"replicas": target}}
                await self._setup.cluster.admin.patch(kc.POOLS, NAMESPACE, POOL, patch)
                self._asked, self.patches = target, self.patches + 1
            self.lowest_available_mib = min(self.lowest_available_mib, available_mib())
            try:
                self._setup.guard.check()
            except MemoryLow as low:
                self.memory_low.append(str(low))
                print(f"\n*** MEMORY: {low} ***\n", file=sys.stderr, flush=True)
                return
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):  # memory is checked at least this often
                    await self._wake.wait()


async def sustained(
    setup: Setup, *, search: ratesearch.Search, seconds: float, pool: int, profile: Path | None = None
) -> dict[str, Any]:
    """The highest rate sustained for `seconds`: `search` picks each step's rate (doubling, then
    bisection) from its outcome. One pool for every step (creates are deleted once Ready, so it
    refills), and each step starts from a full pool and a quiet cluster (what the step before
    left starting or stopping would count against it)."""
    await setup.pool(pool)
    await setup.wait_idle(pool)
    tried: list[dict[str, Any]] = []
    while (rate := search.next_rate()) is not None:
        settled = await settle(setup, pool)
        row = await _sustain(setup, rate, seconds=seconds, pool=pool, profile=profile)
        row["settle_seconds"] = settled
        tried.append(row)
        search.record(rate, row["kept_up"])
        print(
            f"sustained {rate:g}/s: kept up {row['kept_up']} ({row['why_not'] or 'all checks held'})",
            file=sys.stderr,
            flush=True,
        )
    await setup.delete_all()
    await setup.wait_pods_gone()
    return {
        "seconds": seconds,
        "pool": pool,
        "tried": tried,
        "highest_sustained_rate": search.held,
        "lowest_failed_rate": search.failed,
        "resolution": search.resolution,
    }


async def settle(setup: Setup, pool: int, *, quiet_ms_per_second: float = 300.0, timeout: float = 120.0) -> float:
    """Until the pool is full again (every member idle on the gateways, no pod of a deleted
    sandbox left) and our processes are quiet (under `quiet_ms_per_second` of CPU over a second,
    the machine's others not counted), at most `timeout`; returns the seconds it took."""
    started = time.perf_counter()
    await setup.wait_idle(pool)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            while len((await setup.cluster.admin.list_objects(kc.PODS, NAMESPACE)).get("items") or []) > pool:
                await asyncio.sleep(0.5)
            while True:
                cpu = CpuSplit(setup)
                await asyncio.sleep(1.0)
                split = cpu.delta_ms()
                if sum(v for k, v in split.items() if k != "others on the machine") < quiet_ms_per_second:
                    break
    return time.perf_counter() - started


async def sample_pool(setup: Setup, started: float, into: list[tuple[float, int]]) -> None:
    """The pool's ready (idle) members every 0.5 s, as (seconds since `started`, count), from
    kubesim's pool status, until cancelled."""
    while True:
        with contextlib.suppress(kc.ApiError):
            pool = await setup.cluster.admin.get(kc.POOLS, NAMESPACE, POOL)
            into.append((time.perf_counter() - started, int((pool.get("status") or {}).get("readyReplicas") or 0)))
        await asyncio.sleep(0.5)


def _spy(setup: Setup, directory: Path | None, label: str, seconds: float) -> list[subprocess.Popen[bytes]]:
    """`py-spy record` of kubesim and of each gateway for `seconds` (nothing without `directory`):
    their collapsed stacks (one line per stack and its sample count) while the creates run."""
    if directory is None:
        return []
    directory.mkdir(parents=True, exist_ok=True)
    targets = [("kubesim", setup.cluster.pid)] + [(r.id, r.process.pid) for r in setup.replicas.replicas]
    record = ["py-spy", "record", "--nonblocking", "-r", "50", "-f", "raw", "-d", str(int(seconds))]
    return [
        subprocess.Popen(
            [*record, "-p", str(pid), "-o", str(directory / f"{label}-{name}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in targets
    ]


async def _sustain(
    setup: Setup, rate: float, *, seconds: float, pool: int, profile: Path | None = None
) -> dict[str, Any]:
    """One rate for `seconds`, from a full pool of `pool`."""
    idle = await idle_cpu_ms_per_second(setup, IDLE_SECONDS)
    rng = random.Random(int(rate * 1000))
    tasks = []

    async def one(name: str) -> tuple[float, pb.Sandbox] | str:
        try:
            result = await setup.create_ready(name, timeout=300)
        except grpc.aio.AioRpcError as exc:  # counted, with what the gateway said
            return f"{name}: {exc.code().name}: {(exc.details() or '')[:200]}"
        except AssertionError as exc:  # never Ready
            return f"{name}: {str(exc).splitlines()[0][:200]}"
        try:
            await setup.front.DeleteSandbox(pb.SandboxRef(name=name), metadata=setup.replicas.metadata)
        except grpc.aio.AioRpcError as exc:  # counted (a refused stream under load), not fatal to the run
            return f"{name}: delete: {exc.code().name}: {(exc.details() or '')[:200]}"
        return result

    cpu = CpuSplit(setup)
    requests_before = await _request_counts(setup.cluster)
    spies = _spy(setup, profile, f"{len(setup.replicas.replicas)}gw-{rate:g}", seconds)
    started = time.perf_counter()
    samples: list[tuple[float, int]] = []
    sampler = asyncio.create_task(sample_pool(setup, started, samples))
    deadline = started + seconds
    i = 0
    while time.perf_counter() < deadline:
        tasks.append(asyncio.create_task(one(f"s{ratesearch.rate_token(rate)}-{i}")))
        i += 1
        await asyncio.sleep(rng.expovariate(rate))
    sending = time.perf_counter() - started
    outcomes = await asyncio.gather(*tasks)
    sampler.cancel()
    await asyncio.gather(sampler, return_exceptions=True)
    results = [r for r in outcomes if not isinstance(r, str)]
    failures = [r for r in outcomes if isinstance(r, str)]
    for spy in spies:
        await asyncio.to_thread(spy.wait)
    # Until the last create is Ready and deleted; the refills of the last few may still run.
    wall = time.perf_counter() - started
    cpu_ms = cpu.per_create_ms(len(outcomes))
    # Net of what the same parts spend idle over the same time (the machine's others excepted).
    net_ms = {k: v - idle[k] * wall / max(len(outcomes), 1) for k, v in cpu_ms.items() if k in idle}
    net_ms["others on the machine"] = cpu_ms["others on the machine"]
    requests = await _request_counts(setup.cluster)
    per_create = {k: (n - requests_before.get(k, 0)) / max(len(outcomes), 1) for k, n in requests.items()}
    cold = sum(r.status.allocation != "warm" for _, r in results)
    stats = summary([ms for ms, _ in results])
    growth = ratesearch.deficit_growth_per_second(samples, pool, 0.0, sending)
    least_idle = min((n for _, n in samples), default=0)
    # A pool that ran dry hides a growing deficit (it cannot grow past the pool): not kept up.
    refills = ratesearch.refills_kept_up(growth, rate, sending) and least_idle > 0
    why_not = ", ".join(
        why
        for why, failed in (
            (f"{len(failures)} failed", bool(failures)),
            (f"{cold} cold", cold > 0),
            (f"Ready p99 {stats['p99']:.0f} ms > {READY_P99_LIMIT_MS:.0f}", not stats["p99"] <= READY_P99_LIMIT_MS),
            ("the pool ran dry", least_idle == 0),
            (f"refills short by {growth:.2f} pods/s", least_idle > 0 and not refills),
        )
        if failed
    )
    return {
        "rate": rate,
        "creates": len(outcomes),
        "failed": len(failures),
        "failures": failures[:5],
        "not_warm": cold,
        "ms": stats,
        "kept_up": not why_not,
        "why_not": why_not,
        # The pool's deficit (pool - idle) growth while creates arrived: ~0 when refills keep up.
        "deficit_growth_per_second": growth,
        "refills_kept_up": refills,
        "least_idle": least_idle,
        "pool_samples": samples,
        "sending_seconds": sending,
        "seconds": wall,
        "cpu_ms_per_create": cpu_ms,
        "net_cpu_ms_per_create": net_ms,
        "idle_cpu_ms_per_second": idle,
        # The gateways' API requests to kubesim per create (every replica's; watches count once).
        "api_requests_per_create": {k: round(v, 2) for k, v in sorted(per_create.items()) if v >= 0.05},
        "load_average": os.getloadavg(),
    }


WRITE_VERBS = ("create", "update", "patch", "delete")


@contextlib.contextmanager
def python_path(src: str) -> Iterator[None]:
    """Processes started meanwhile import warmshell and kubesim from `src` (nothing: this tree)."""
    before = os.environ.get("PYTHONPATH")
    if src:
        os.environ["PYTHONPATH"] = str(Path(src).resolve())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def _processes(setup: Setup) -> dict[str, int]:
    """The pids whose CPU the cpu part splits: each gateway, kubesim's API server (with its
    controllers and kubelet in it), and on an older tree their process of their own."""
    replicas = setup.replicas.replicas
    pids = {f"gateway {r.id}": r.process.pid for r in replicas}
    pids["kubesim API server"] = setup.cluster.pid
    for child in descendants(setup.cluster.pid):
        if is_kubesim_process(child):
            pids["kubesim controllers, kubelet"] = child
    return pids


def _spy_parts(pids: dict[str, int], directory: Path, seconds: float, rate: int) -> list[subprocess.Popen[bytes]]:
    """py-spy of each process for `seconds` at `rate` samples/s (nothing when py-spy is not on PATH)."""
    if shutil.which("py-spy") is None:
        return []
    directory.mkdir(parents=True, exist_ok=True)
    record = ["py-spy", "record", "--nonblocking", "-r", str(rate), "-f", "raw", "-d", str(int(seconds))]
    return [
        subprocess.Popen(
            [*record, "-p", str(pid), "-o", str(directory / f"{name}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]


async def cpu_round(
    setup: Setup, *, rate: float, seconds: float, pool: int, spy_dir: Path, spy_rate: int = 100
) -> dict[str, Any]:
    """One measured run at `rate` from a full pool: `_sustain`'s figures, plus the CPU per create
    of each process and thread, and each process's busy samples by part of the code."""
    await setup.pool(pool)
    await setup.wait_idle(pool)
    await settle(setup, pool)
    pids = _processes(setup)
    before = {name: cpuparts.thread_seconds(pid) for name, pid in pids.items()}
    statements = await _store_statements(setup)
    spies = _spy_parts(pids, spy_dir, IDLE_SECONDS + seconds, spy_rate)  # `_sustain` measures idle first
    row = await _sustain(setup, rate, seconds=seconds, pool=pool)
    after = {name: cpuparts.thread_seconds(pid) for name, pid in pids.items()}
    statements = {k: v - statements.get(k, 0) for k, v in (await _store_statements(setup, settle=True)).items()}
    for spy in spies:
        await asyncio.to_thread(spy.wait)
    creates = row["creates"]
    row["threads_ms_per_create"] = {
        name: cpuparts.by_thread_name_ms(before[name], after[name], creates) for name in pids
    }
    row["main_thread_ms_per_create"] = {
        name: cpuparts.main_thread_ms(before[name], after[name], pid, creates) for name, pid in pids.items()
    }
    row["spy_shares"] = {name: cpuparts.spy_shares(spy_dir / f"{name}.txt") for name in pids}
    requests = row["api_requests_per_create"]
    # A TokenReview is a POST that stores nothing: not a write.
    writes = (n for k, n in requests.items() if k.split()[0] in WRITE_VERBS and "tokenreviews" not in k)
    row["api_writes_per_create"] = round(sum(writes), 2)
    row["store_per_create"] = {k: round(v / max(creates, 1), 2) for k, v in statements.items()}
    row.pop("pool_samples", None)
    await setup.delete_all()
    await setup.wait_pods_gone()
    return row


async def _store_statements(setup: Setup, *, settle: bool = False) -> dict[str, int]:
    """The run's Postgres database's counters so far (nothing on SQLite): transactions (each
    statement outside a transaction is one; an update that lost its compare-and-swap too), rows
    fetched (by index: reads, and the rows updates looked at) and rows updated. A backend reports
    its counters when it has been idle a moment: `settle` waits for that first."""
    if not setup.store_url:
        return {}
    if settle:
        await asyncio.sleep(2.0)
    conn = await asyncpg.connect(setup.store_url, password=setup.password_file.read_text().strip())
    try:
        stats = await conn.fetchrow(
            "SELECT xact_commit + xact_rollback AS transactions, tup_fetched AS rows_fetched,"
            " tup_updated AS rows_updated FROM pg_stat_database WHERE datname = current_database()"
        )
    finally:
        await conn.close()
    return {
        "transactions": int(stats["transactions"]),
        "rows fetched": int(stats["rows_fetched"]),
        "rows updated": int(stats["rows_updated"]),
    }


def cpu_configs(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(label, src, gateways) of each cpu run of a round: the tree under test and `--before-src`,
    each with every `--cpu-replicas` count (one gateway on SQLite, several on Postgres). A label
    names the gateways only when the counts differ within the run."""
    trees = [("after", "")] + ([("before", args.before_src)] if args.before_src else [])
    counts = args.cpu_replicas
    return [
        (label if len(counts) == 1 else f"{label}, {gateways_label(n)}", src, n) for label, src in trees for n in counts
    ]


def gateways_label(count: int) -> str:
    """How a run's gateways are set up, said in a table."""
    return "1 gateway on SQLite" if count == 1 else f"{count} gateways on Postgres"


async def cpu_rounds(
    args: argparse.Namespace, root: Path, server: DevPostgres, guard: MemoryGuard
) -> list[dict[str, Any]]:
    """`--cpu-rounds` rounds of every `cpu_configs` run, their order reversed every other round;
    every run on a kubesim and gateways of its own, started from its tree (several gateways: on
    a fresh Postgres database, the creates through the balancer)."""
    configs = cpu_configs(args)
    trees = {src: treeparts.tree_parts(src) for _, src, _ in configs if src}
    rows: list[dict[str, Any]] = []
    for round_ in range(args.cpu_rounds):
        for label, src, count in configs if round_ % 2 == 0 else configs[::-1]:
            url = await server.create_database() if count > 1 else ""
            # An older tree renders its own pods, gateway settings and image rules (`treeparts`).
            tree = trees.get(src)
            images = pod_images(args.pods) if tree is None else pod_images(args.pods, tree.images, tree.image)
            with python_path(src):
                async with kubesim_process("default", images) as cluster:
                    setup = await with_setup(
                        cluster,
                        root,
                        f"cpu-{len(rows)}",
                        replicas=count,
                        store_url=url,
                        password_file=server.password_file,
                        guard=guard,
                        short_intervals=False,
                        watch_create=args.watch_create,
                        tree=tree,
                    )
                    setup.postgres_pid = _postmaster_pid(server.base) if url else 0
                    try:
                        spy_dir = Path(args.profile_dir or root) / f"cpu-spy-{len(rows)}"
                        row = await cpu_round(
                            setup,
                            rate=args.cpu_rate,
                            seconds=args.cpu_seconds,
                            pool=args.pool,
                            spy_dir=spy_dir,
                            spy_rate=args.spy_rate,
                        )
                    finally:
                        await setup.aclose()
            rows.append({"tree": label, "round": round_, "gateways": count, **row})
            print(f"cpu round {round_} {label}: {row['net_cpu_ms_per_create']}", file=sys.stderr, flush=True)
    return rows


async def with_setup(
    cluster: ClusterProcess,
    root: Path,
    name: str,
    *,
    replicas: int,
    store_url: str,
    password_file: Path,
    guard: MemoryGuard,
    logs_dir: str = "",
    short_intervals: bool = True,
    watch_create: bool = False,
    tree: treeparts.TreeParts | None = None,
) -> Setup:
    setup = Setup(cluster, root / name, store_url=store_url, password_file=password_file, guard=guard)
    setup.short_intervals = short_intervals
    setup.watch_create = watch_create
    setup.tree = tree
    if logs_dir:  # kept for a post-mortem, at INFO
        setup.logs_dir, setup.log_level = Path(logs_dir), "INFO"
    await setup.start(replicas)
    return setup


def pod_images(pods: str, images: dict[str, Any] = IMAGES, image: str = IMAGE) -> dict[str, Any]:
    """kubesim's image map for `--pods`: the tests' `images` (the pod shim), or without its rule
    for the warmshell `image`, so that kubesim's default rule (the fork server) runs those pods."""
    if pods == "shim":
        return images
    return {pattern: rule for pattern, rule in images.items() if not fnmatch.fnmatchcase(image, pattern)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    data: dict[str, Any] = {
        "load_average_start": os.getloadavg(),
        "available_mib_start": available_mib(),
        "pods": args.pods,
        "intervals": args.intervals,
    }
    guard = MemoryGuard(args.memory_reserve_mib, args.memory_floor_mib)
    parts = set(args.parts.split(","))
    with dev_postgres_server() as server, tempfile.TemporaryDirectory(prefix="ws-bench-replicas-") as tmp:
        root = Path(tmp)
        password = server.password_file
        if "fast" in parts:
            async with kubesim_process("fast", pod_images(args.pods)) as cluster:
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
                        logs_dir=args.logs_dir,
                        watch_create=args.watch_create,
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
        poisson_counts = {1, 3} if "poisson" in parts else set()
        sustain_counts = set(args.sustain_replicas) if "sustained" in parts else set()
        # (gateways, store): the Poisson and sustained configurations on Postgres, and with
        # --sustain-sqlite one gateway on SQLite first (sustained only).
        configs = [(count, "postgres") for count in sorted(poisson_counts | sustain_counts)]
        if "sustained" in parts and args.sustain_sqlite:
            configs.insert(0, (1, "sqlite"))
        if configs:
            async with kubesim_process("default", pod_images(args.pods)) as cluster:
                data["poisson"], data["sustained"] = [], []
                for count, store in configs:
                    url = await server.create_database() if store == "postgres" else ""
                    setup = await with_setup(
                        cluster,
                        root,
                        f"default-{count}-{store}",
                        replicas=count,
                        store_url=url,
                        password_file=password,
                        guard=guard,
                        logs_dir=args.logs_dir,
                        short_intervals=args.intervals == "tests",
                        watch_create=args.watch_create,
                    )
                    setup.postgres_pid = _postmaster_pid(server.base) if url else 0
                    try:
                        if count in poisson_counts and store == "postgres":
                            result = await _reported(
                                poisson(
                                    setup,
                                    rate=args.poisson_rate,
                                    wanted=args.poisson_pool,
                                    seed=1251,
                                    pod_mib=args.pod_mib,
                                    surplus=args.poisson_surplus,
                                    fill_step=args.fill_step,
                                )
                            )
                            data["poisson"].append({"replicas": count, **result, "load_average": os.getloadavg()})
                            _checkpoint(args, data)
                        if count in sustain_counts or store == "sqlite":
                            found = await sustained(
                                setup,
                                search=ratesearch.Search(
                                    args.search_start, args.search_cap, args.resolution, args.max_steps
                                ),
                                seconds=args.sustain_seconds,
                                pool=args.pool,
                                profile=Path(args.profile_dir) if args.profile_dir else None,
                            )
                            data["sustained"].append({"replicas": count, "store": store, **found})
                            _checkpoint(args, data)
                    finally:
                        await setup.aclose()
        if "cpu" in parts:
            data["cpu"] = await cpu_rounds(args, root, server, guard)
            data["before_src"] = args.before_src
            _checkpoint(args, data)
    return data


async def _request_counts(cluster: ClusterProcess) -> dict[str, int]:
    """kubesim's counters of the gateways' requests, by "verb resource"."""
    return {f"{row['verb']} {row['resource']}": int(row["count"]) for row in await cluster.counters()}


def _postmaster_pid(base: Path) -> int:
    """The dev server's postmaster (the first line of its data directory's postmaster.pid)."""
    try:
        return int((base / "data" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


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
    for found in data.get("sustained") or []:
        text += _sustained_table(found)
    if data.get("cpu"):
        text += _cpu_table(data["cpu"], data.get("before_src") or "")
    pods = {"fork": "forked from kubesim's pre-imported fork server", "shim": "exec'd through the tests' pod shim"}
    text += f"\nThe warmshell pods' supervisors were {pods[data.get('pods', 'shim')]} (`--pods`).\n"
    if data.get("poisson") or data.get("sustained"):
        intervals = {
            "defaults": "the gateway's defaults (heartbeats every 5 s, relists every 10 s)",
            "tests": "the tests' short ones (heartbeats and relists every second)",
        }
        chosen = intervals[data.get("intervals", "tests")]
        text += f"The Poisson and sustained parts ran with {chosen} (`--intervals`).\n"
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
    text += "| gateways | rate/s | creates | sent over s (scheduled) | failed | pool (asked) | surplus | pods after "
    text += "| pool fill s | PSS per pod MiB | p50 | p90 | p99 | not warm | load avg |\n"
    text += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    notes = ""
    for row in rows:
        ms, memory = row["ms"], row["pod_memory"]
        text += (
            f"| {row['replicas']} | {row['rate']:g} | {row['count']} | {row['sent_over_seconds']:.1f} "
            f"({row.get('scheduled_seconds', float('nan')):.1f}) "
            f"| {row['failed']} | {row['pool']} ({row['pool_wanted']}) | {row['surplus']} | {row['pods_after']} "
            f"| {row['pool_fill_seconds']:.0f} | {memory['pss_mib_per_pod']:.1f} | {ms['p50']:.0f} "
            f"| {ms['p90']:.0f} | {ms['p99']:.0f} | {row['not_warm']} | {row['load_average'][0]:.1f} |\n"
        )
        notes += (
            f"\n{row['replicas']} gateway(s): MemAvailable {row['available_mib_before_creates']:.0f} MiB with the pool "
            f"full, at least {row['lowest_available_mib']:.0f} MiB while the creates ran; "
            f"{row['pod_memory']['available_drop_mib_per_pod']:.1f} MiB less per pod filled. Pre-fill in "
            f"{len(row['fill_steps'])} paced steps (pods idle at s, MiB available): "
            + ", ".join(f"{f['pods']} at {f['seconds']:.0f} s ({f['available_mib']:.0f})" for f in row["fill_steps"])
            + ".\n"
        )
        if row["pool"] < row["pool_wanted"]:
            notes += f"\n**Reduced:** the pool was {row['pool']}, not {row['pool_wanted']}: memory did not allow it.\n"
    text += notes + (
        "\nThe pool's `spec.replicas` is lowered as each create is sent (to what is left of the pre-fill plus "
        "the surplus): pods after = the pre-fill plus what the pool controller refilled during the run.\n"
        "agent-sandbox PR #1251 (45/s sustained, in-cluster): p50 92 / p90 182 / p99 376 ms.\n"
    )
    return text


def _sustained_table(found: dict[str, Any]) -> str:
    seconds, pool, replicas = found["seconds"], found["pool"], found["replicas"]
    store = {"sqlite": "SQLite", "postgres": "Postgres"}[found.get("store", "postgres")]
    text = (
        f"\n### Highest rate sustained for {seconds:g} s, {replicas} gateway(s) on {store}, pool {pool}, "
        "kubesim `default`\n\n"
    )
    parts = list(found["tried"][0]["net_cpu_ms_per_create"]) if found["tried"] else []
    text += "| rate/s | creates | failed | not warm | p50 | p99 | deficit growth /s | least idle | kept up "
    text += "| load avg | " + " | ".join(parts) + " |\n"
    text += "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(parts) + "\n"
    for row in found["tried"]:
        cpu = row["net_cpu_ms_per_create"]
        verdict = "yes" if row["kept_up"] else f"no: {row['why_not']}"
        text += (
            f"| {row['rate']:g} | {row['creates']} | {row['failed']} | {row['not_warm']} "
            f"| {row['ms']['p50']:.0f} | {row['ms']['p99']:.0f} | {row['deficit_growth_per_second']:.2f} "
            f"| {row['least_idle']} | {verdict} | {row['load_average'][0]:.1f} | "
            + " | ".join(f"{cpu.get(p, 0.0):.0f}" for p in parts)
            + " |\n"
        )
    text += (
        "\nA step holds when no create failed or went cold, Ready p99 <= "
        f"{READY_P99_LIMIT_MS:.0f} ms, and the refills kept up: the pool's deficit (pool - idle, from its status "
        "every 0.5 s) grew between the second and the last quarter of the step by at most "
        f"{ratesearch.REFILL_SHORTFALL_SHARE:.0%} of the rate (or {ratesearch.REFILL_NOISE_PODS:g} pods over that "
        "span) and the pool never ran dry. Each step starts from a full pool and a quiet cluster.\n"
    )
    text += (
        "\nCPU columns: ms of CPU per create, from the first create sent to the last one Ready and deleted, net "
        f"of what the same part spends idle (measured for {IDLE_SECONDS:g} s before each rate, full pool); "
        "'others' is the rest of the machine's busy time (other engineers), not net of anything.\n\n"
        "Idle, ms of CPU per second: "
        + ", ".join(f"{k} {v:.0f}" for k, v in found["tried"][0]["idle_cpu_ms_per_second"].items())
        + "\n"
    )
    for row in found["tried"]:
        calls = ", ".join(f"{k} {v:g}" for k, v in row["api_requests_per_create"].items())
        text += f"\nAt {row['rate']:g}/s, the gateways' kubesim requests per create: {calls}\n"
    failed = found["lowest_failed_rate"]
    bound = f" (the lowest that failed: {failed:g}/s)" if failed is not None else " (the cap held)"
    return text + f"\nHighest sustained: **{found['highest_sustained_rate']:g}/s**{bound}.\n"


def _median_by_tree(
    rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Per tree, the median over its rounds of each figure `key` picks from a row."""
    out: dict[str, dict[str, float]] = {}
    for tree in dict.fromkeys(r["tree"] for r in rows):
        picked = [key(r) for r in rows if r["tree"] == tree]
        names = dict.fromkeys(n for p in picked for n in p)
        out[tree] = {n: sorted(p.get(n, 0.0) for p in picked)[len(picked) // 2] for n in names}
    return out


def _gateways_summed(figures: dict[str, float]) -> dict[str, float]:
    """`figures` with every gateway's ("gateway", "gateway <id>") summed into one "gateways"."""
    out = {"gateways": 0.0}
    for name, value in figures.items():
        if name.startswith("gateway"):
            out["gateways"] += value
        else:
            out[name] = value
    return out


def _gateway_threads(row: dict[str, Any]) -> dict[str, float]:
    """The gateways' CPU ms per create by thread name, summed over the gateways."""
    out: dict[str, float] = {}
    for process, threads in row["threads_ms_per_create"].items():
        if process.startswith("gateway"):
            for name, ms in threads.items():
                out[name] = out.get(name, 0.0) + ms
    return out


def _loop_parts(row: dict[str, Any], processes: Callable[[str], bool]) -> dict[str, float]:
    """CPU ms per create of the event loops of the `processes` by part of the code (each busy
    sample's share of its process's main thread, times that thread's CPU), summed over them."""
    out: dict[str, float] = {}
    for process, shares in row["spy_shares"].items():
        if processes(process):
            for part, share in shares.items():
                out[part] = out.get(part, 0.0) + share * row["main_thread_ms_per_create"][process]
    return out


def _cpu_table(rows: list[dict[str, Any]], before_src: str) -> str:
    trees = list(dict.fromkeys(r["tree"] for r in rows))
    setups = ", ".join(gateways_label(n) for n in dict.fromkeys(r.get("gateways", 1) for r in rows))
    text = f"\n### Where a warm create's CPU goes ({setups}, kubesim `default`; median of rounds)\n\n"
    if before_src:
        text += f"`before` is the tree at `{before_src}`, `after` this one; rounds alternate between them.\n\n"
    net = [_gateways_summed(r["net_cpu_ms_per_create"]) for r in rows]
    columns = list(dict.fromkeys(k for n in net for k in n))
    text += "| round | tree | rate/s | creates | p50 ms | p99 ms | load avg | " + " | ".join(columns) + " |\n"
    text += "|---|---|---|---|---|---|---|" + "---|" * len(columns) + "\n"
    for r, figures in zip(rows, net, strict=True):
        text += (
            f"| {r['round']} | {r['tree']} | {r['rate']:g} | {r['creates']} | {r['ms']['p50']:.0f} "
            f"| {r['ms']['p99']:.0f} "
            f"| {r['load_average'][0]:.1f} | " + " | ".join(f"{figures.get(c, 0.0):.1f}" for c in columns) + " |\n"
        )
    processes = _median_by_tree(rows, lambda r: {n: sum(t.values()) for n, t in r["threads_ms_per_create"].items()})
    writes = _median_by_tree(rows, lambda r: {"writes": r["api_writes_per_create"], **r["api_requests_per_create"]})
    store = _median_by_tree(rows, lambda r: r.get("store_per_create", {}))
    text += _by_tree("CPU ms per create by process (all its threads, not net of idle):", "process", trees, processes)
    text += _by_tree(
        "The gateways by thread (summed over them), CPU ms per create:",
        "thread",
        trees,
        _median_by_tree(rows, _gateway_threads),
    )
    loops = {
        "the gateways' main threads (their event loops)": lambda p: p.startswith("gateway"),
        "kubesim's": lambda p: not p.startswith("gateway"),
    }
    for whose, chosen in loops.items():
        parts = _median_by_tree(rows, lambda r, c=chosen: _loop_parts(r, c))
        if any(parts.values()):
            title = f"{whose} by part of the code, CPU ms per create (py-spy busy samples x each main thread's CPU):"
            text += _by_tree(title, "part", trees, parts)
    text += _by_tree("The gateways' API requests per create:", "request", trees, writes, fmt="g")
    if any(store.values()):
        title = "The Postgres database per create (pg_stat_database; the idle seconds before the creates included):"
        text += _by_tree(title, "counter", trees, store, fmt="g")
    return text


def _by_tree(title: str, column: str, trees: list[str], figures: dict[str, dict[str, float]], fmt: str = ".1f") -> str:
    """A table under `title`: a row per name, a column per tree, each cell that tree's figure."""
    text = f"\n{title}\n\n| {column} | " + " | ".join(trees) + " |\n|---|" + "---|" * len(trees) + "\n"
    for name in dict.fromkeys(n for t in trees for n in figures[t]):
        text += f"| {name} | " + " | ".join(format(figures[t].get(name, 0.0), fmt) for t in trees) + " |\n"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sequential", type=int, default=30)
    parser.add_argument("--pool", type=int, default=8)
    parser.add_argument("--burst", type=int, default=24)
    parser.add_argument("--kill-sandboxes", type=int, default=12)
    parser.add_argument("--poisson-rate", type=float, default=45.0)
    parser.add_argument("--poisson-pool", type=int, default=450, help="pool pre-filled, and creates sent")
    parser.add_argument(
        "--poisson-surplus",
        type=int,
        default=45,
        help="pods kept above the creates still to send (their claims not bound yet); the most a run refills",
    )
    parser.add_argument(
        "--fill-step", type=int, default=50, help="pods the Poisson pre-fill adds at a time (then waits for them)"
    )
    parser.add_argument(
        "--pod-mib",
        type=float,
        default=32.0,
        help="memory to allow per kubesim pod (an idle one: PSS ~17, MemAvailable -17..20; a claimed one more)",
    )
    parser.add_argument("--memory-reserve-mib", type=float, default=8192.0, help="left available to others")
    parser.add_argument(
        "--memory-floor-mib", type=float, default=4096.0, help="the run stops when available memory falls under it"
    )
    parser.add_argument("--search-start", type=float, default=2.0, help="the sustained search's first rate, /s")
    parser.add_argument("--search-cap", type=float, default=16.0, help="the highest rate the search tries, /s")
    parser.add_argument(
        "--resolution", type=float, default=0.5, help="the search ends when held and failed are this close"
    )
    parser.add_argument("--max-steps", type=int, default=7, help="steps of the sustained search at most")
    parser.add_argument("--parts", default="fast,poisson,sustained")
    parser.add_argument("--sustain-seconds", type=float, default=60.0)
    parser.add_argument(
        "--sustain-replicas",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[3],
        help="gateway counts the sustained search runs with",
    )
    parser.add_argument(
        "--sustain-sqlite", action="store_true", help="the sustained search with 1 gateway on SQLite too (first)"
    )
    parser.add_argument(
        "--profile-dir",
        default="",
        help="py-spy collapsed stacks of kubesim and each gateway during each sustained rate and cpu run, kept"
        " here (needs py-spy)",
    )
    parser.add_argument(
        "--logs-dir", default="", help="keep every replica's log (at INFO) here, copied when its setup closes"
    )
    parser.add_argument(
        "--pods", choices=("fork", "shim"), default="fork", help="how kubesim starts the warmshell image's pods"
    )
    parser.add_argument(
        "--intervals",
        choices=("defaults", "tests"),
        default="defaults",
        help="the Poisson and sustained parts' gateway heartbeats, relists and Lease: the gateway's defaults, or"
        " the tests' short ones (1 s heartbeats and relists, as every run before this option); the fast part,"
        " which times a kill -9, always uses the tests'",
    )
    parser.add_argument("--cpu-rate", type=float, default=6.0, help="the cpu part's warm creates per second")
    parser.add_argument("--cpu-seconds", type=float, default=30.0, help="how long each cpu round sends creates")
    parser.add_argument("--cpu-rounds", type=int, default=2, help="cpu rounds of each tree (alternating)")
    parser.add_argument(
        "--cpu-replicas",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1],
        help="gateway counts of the cpu part, each in every round: 1 on SQLite, more on Postgres (e.g. 1,3)",
    )
    parser.add_argument(
        "--before-src",
        default="",
        help="the cpu part's older tree: its src/, in the whole tree (`git archive <commit> | tar -x -C DIR`: DIR/src)",
    )
    parser.add_argument(
        "--spy-rate",
        type=int,
        default=100,
        help="the cpu part's py-spy samples per second (a 30 s run at 100 holds only a few hundred busy samples"
        " of a gateway)",
    )
    parser.add_argument(
        "--watch-create",
        action="store_true",
        help="the client creates, then watches until Ready (two calls), instead of the SDK's one call",
    )
    parser.add_argument("--name", default="replicas")
    args = parser.parse_args()
    _checkpoint(args, asyncio.run(run(args)))


if __name__ == "__main__":
    main()
