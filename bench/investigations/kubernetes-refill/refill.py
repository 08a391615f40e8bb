"""Issue 35: the Kubernetes warm pool's refill ceiling with no gateway in the loop.

One `kubesim serve` (its own process, `default` timing unless `--timing`), a SandboxWarmPool of
`--pool` members whose pod is the one warmshell's driver renders (the init container, the
supervisor from the fork server, the agent as the workload's pid 1; the gateway address refuses,
so each supervisor waits in its registration backoff). Once the pool is full, `--claims`
SandboxClaims adopt members (all at once, or `--rate` per second), and the pool replaces them.
A watch on pods timestamps every replacement pod: created, bound, Running, Ready. Reported:
replacements Ready per second (over the middle 80 % of the refill), each phase's p50, and CPU per
replacement of kubesim's own process and of the pods' processes (fork server and its children).
`--slots N` sets `KUBESIM_MAX_PARALLEL_POD_STARTS` (per node; 0 = unbounded).

    python bench/investigations/kubernetes-refill/refill.py [--pool 150] [--claims 120]
        [--rate 0] [--slots N] [--timing default] [--src DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(BENCH))

from kubesim_pods import cpu_of, pod_processes, pod_spec  # noqa: E402
from kubesim_scale import TICK, claim, kubesim, pool_ready  # noqa: E402

from kubesim.controllers import client as kc  # noqa: E402

NS = "default"
API_VERSION = "extensions.agents.x-k8s.io/v1beta1"


def thread_cpu(pid: int, tid: int) -> float:
    """CPU seconds of one thread (the main thread of kubesim is its event loop)."""
    try:
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def forkserver_cpu(kubesim_pid: int) -> float:
    """CPU of the fork servers themselves (their own, not their reaped children's)."""
    total = 0.0
    for pid in pod_processes(kubesim_pid):
        try:
            if b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                total += thread_cpu(pid, pid)
        except OSError:
            continue
    return total


def template(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "SandboxTemplate",
        "metadata": {"name": "bench"},
        "spec": {"podTemplate": {"spec": spec}},
    }


def pool(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "SandboxWarmPool",
        "metadata": {"name": "bench"},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "bench"}},
    }


class PodTimes:
    """First time each pod is seen created, bound, Running, Ready (perf_counter)."""

    def __init__(self, api: kc.KubeClient) -> None:
        self.api = api
        self.seen: dict[str, dict[str, float]] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        rv = (await self.api.list_objects(kc.PODS, NS))["metadata"]["resourceVersion"]
        self._task = asyncio.create_task(self._run(rv))

    async def _run(self, rv: str) -> None:
        while True:
            async for event in self.api.watch(kc.PODS, NS, resource_version=rv, timeout_seconds=600):
                obj = event.get("object") or {}
                rv = obj.get("metadata", {}).get("resourceVersion", rv)
                if event.get("type") not in ("ADDED", "MODIFIED"):
                    continue
                now = time.perf_counter()
                times = self.seen.setdefault(obj["metadata"]["name"], {"created": now})
                status = obj.get("status") or {}
                conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
                if (obj.get("spec") or {}).get("nodeName"):
                    times.setdefault("bound", now)
                if conditions.get("Initialized") == "True":
                    times.setdefault("initialized", now)
                if status.get("phase") == "Running":
                    times.setdefault("running", now)
                if conditions.get("Ready") == "True":
                    times.setdefault("ready", now)

    async def replaced(self, before: set[str], count: int, within: float = 600.0) -> float:
        """Wait until ``count`` pods not in ``before`` are Ready; the time the last one was seen."""
        deadline = time.perf_counter() + within
        while True:
            ready = sorted(t["ready"] for n, t in self.seen.items() if n not in before and "ready" in t)
            if len(ready) >= count:
                return ready[count - 1]
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{len(ready)}/{count} replacements Ready after {within:.0f} s")
            await asyncio.sleep(0.05)  # polling the watch's own table

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def p50_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1) if values else float("nan")


def phases(rows: list[dict[str, float]]) -> dict[str, float]:
    steps = [
        ("created", "bound"),
        ("bound", "initialized"),
        ("initialized", "running"),
        ("running", "ready"),
        ("created", "ready"),
    ]
    return {f"{a}->{b} p50 ms": p50_ms([r[b] - r[a] for r in rows if a in r and b in r]) for a, b in steps}


def ready_rate(ready: list[float]) -> float:
    """Pods Ready per second between the 10th and 90th percentile of their Ready times."""
    ready = sorted(ready)
    lo, hi = ready[len(ready) // 10], ready[(len(ready) * 9) // 10]
    count = (len(ready) * 9) // 10 - len(ready) // 10
    return round(count / (hi - lo), 2) if hi > lo else float("inf")


def max_in_start(rows: list[dict[str, float]]) -> int:
    """The most pods between Initialized and Ready at once: a lower bound of start slots held (a
    pod takes its slot just before its init container, which this leaves out)."""
    events = sorted(
        [(r["initialized"], 1) for r in rows if "initialized" in r and "ready" in r]
        + [(r["ready"], -1) for r in rows if "initialized" in r and "ready" in r]
    )
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


async def claim_all(api: kc.KubeClient, count: int, rate: float) -> float:
    t0 = time.perf_counter()
    if rate <= 0:
        await asyncio.gather(*(api.create(kc.CLAIMS, NS, claim(f"c-{i:04d}")) for i in range(count)))
        return t0
    tasks = []
    for i in range(count):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(api.create(kc.CLAIMS, NS, claim(f"c-{i:04d}"))))
    await asyncio.gather(*tasks)
    return t0


async def one_run(args: argparse.Namespace) -> dict[str, Any]:
    src = Path(args.src).resolve()
    if args.slots is not None:
        os.environ["KUBESIM_MAX_PARALLEL_POD_STARTS"] = str(args.slots)
    with tempfile.TemporaryDirectory(prefix="kubesim-refill-") as tmp:
        async with kubesim(src, Path(tmp)) as served:
            api = served.admin
            await api.create(kc.TEMPLATES, NS, template(pod_spec(src)))
            await api.create(kc.POOLS, NS, pool(args.pool))
            await pool_ready(api, args.pool)
            await asyncio.sleep(args.settle)
            before = set(p["metadata"]["name"] for p in (await api.list_objects(kc.PODS, NS))["items"])
            watch = PodTimes(api)
            await watch.start()
            kube0, pods0 = served.cpu_seconds(), sum(cpu_of(p) for p in pod_processes(served.process.pid))
            pid = served.process.pid
            loop0, fork0 = thread_cpu(pid, pid), forkserver_cpu(pid)
            c0 = time.process_time()
            t0 = await claim_all(api, args.claims, args.rate)
            t1 = await watch.replaced(before, args.claims)
            loop_cpu, fork_cpu = thread_cpu(pid, pid) - loop0, forkserver_cpu(pid) - fork0
            await asyncio.sleep(1.0)  # the last Ready events
            kube = served.cpu_seconds() - kube0
            pods = sum(cpu_of(p) for p in pod_processes(served.process.pid)) - pods0
            await watch.stop()
    rows = [t for name, t in watch.seen.items() if name not in before]
    ready = [r["ready"] for r in rows if "ready" in r]
    return {
        "pool": args.pool,
        "claims": args.claims,
        "rate": args.rate,
        "slots_per_node": args.slots,
        "replacements_ready": len(ready),
        "refill_seconds": round(t1 - t0, 2),
        "ready_per_second": ready_rate(ready) if len(ready) >= 10 else None,
        **phases(rows),
        "max_between_initialized_and_ready": max_in_start(rows),
        "kubesim_cpu_ms_per_replacement": round(kube * 1000 / max(1, len(ready)), 1),
        "kubesim_loop_cores_during_refill": round(loop_cpu / (t1 - t0), 2),
        "forkserver_cpu_ms_per_replacement": round(fork_cpu * 1000 / max(1, len(ready)), 1),
        "pods_cpu_ms_per_replacement": round(pods * 1000 / max(1, len(ready)), 1),
        "client_cpu_s": round(time.process_time() - c0, 2),
        "load_average": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pool", type=int, default=150)
    parser.add_argument("--claims", type=int, default=120)
    parser.add_argument("--rate", type=float, default=0.0, help="claims per second (0: all at once)")
    parser.add_argument("--slots", type=int, default=None)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--src", default=str(BENCH.parent / "src"))
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    result = asyncio.run(one_run(args))
    print(json.dumps(result))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
