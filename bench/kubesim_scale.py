"""Issue 20: kubesim holding hundreds of warm pods. One `kubesim serve` per round (its own
process, `default` timing), a warm pool of `--pods` members, then:

1. the fill: seconds until all are Ready, and kubesim's own CPU per pod start (its Python
   processes, not the pods');
2. idle: kubesim's CPU per second with the pool full;
3. paced claims: `--paced` SandboxClaims one at a time (200 ms apart), POST → response and
   POST → claim Ready (seen on a watch);
4. Poisson: claims arriving at `--rate`/s for `--seconds` against the full pool (the issue's
   45/s for 10 s against 450), POST → response and POST → Ready p50/p90/p99, how many bound warm.

The pods run `sleep` with the warmshell pod's volumes (a projected ServiceAccount token, an
emptyDir), so hundreds fit in memory and the figures are kubesim's: API server, controllers,
kubelet. `--before-src DIR` runs an older tree's `src/` in alternate rounds (same machine, same
run), for a ratio. The refill of adopted members runs during the Poisson part, as in a cluster.

    python bench/kubesim_scale.py [--pods 450] [--rate 45] [--seconds 10] [--rounds 1] [--before-src DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import summary, write_results
from kubesim_claims import ReadyWatch
from memory import MemoryGuard, available_mib, descendants

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubesim.controllers import client as kc  # noqa: E402

NS = "default"
POD_MIB = 3.0  # a `sleep` pod with its kubelet bookkeeping, generously
API_VERSION = "extensions.agents.x-k8s.io/v1beta1"
TICK = os.sysconf("SC_CLK_TCK")


def template() -> dict[str, Any]:
    """The warmshell pod's shape (token volume, workspace emptyDir, OnFailure) running `sleep`."""
    container = {
        "name": "supervisor",
        "image": "busybox",
        "command": ["sleep", "infinity"],
        "env": [{"name": "WARMSHELL_INSTANCE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}],
        "volumeMounts": [
            {"name": "token", "mountPath": "/var/run/secrets/warmshell", "readOnly": True},
            {"name": "workspace", "mountPath": "/workspace"},
        ],
    }
    token = {"serviceAccountToken": {"audience": "warmshell-gateway", "expirationSeconds": 3600, "path": "token"}}
    spec = {
        "automountServiceAccountToken": False,
        "restartPolicy": "OnFailure",
        "terminationGracePeriodSeconds": 1,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [
            {"name": "token", "projected": {"defaultMode": 0o440, "sources": [token]}},
            {"name": "workspace", "emptyDir": {}},
        ],
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "SandboxTemplate",
        "metadata": {"name": "bench"},
        "spec": {"podTemplate": {"spec": spec}},
    }


def claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"warmPoolRef": {"name": "bench"}},
    }


@dataclass
class Served:
    """A `kubesim serve` started from one source tree."""

    process: subprocess.Popen[bytes]
    admin: kc.KubeClient

    def cpu_seconds(self) -> float:
        """CPU of kubesim's own Python processes (serve and, where split off, its controllers)."""
        total = 0.0
        for pid in [self.process.pid, *descendants(self.process.pid)]:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if pid == self.process.pid or b"kubesim.cli" in cmdline:
                total += (int(fields[11]) + int(fields[12])) / TICK
        return total


@contextlib.asynccontextmanager
async def kubesim(src: Path, root: Path) -> AsyncIterator[Served]:
    """`kubesim serve` with `src` first on the import path; SIGTERM (its kubelet kills every pod)."""
    kubeconfig, admin_config = root / "kubeconfig.yaml", root / "admin.yaml"
    env = os.environ | {"KUBESIM_TIMING": "default", "PYTHONPATH": str(src)}
    argv = ["serve", "--kubeconfig", str(kubeconfig), "--admin-kubeconfig", str(admin_config)]
    with (root / "kubesim.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "kubesim.cli", *argv], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
        )
    admin: kc.KubeClient | None = None
    try:
        deadline = time.monotonic() + 60
        while admin is None:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"kubesim did not start: {(root / 'kubesim.log').read_text()[-2000:]}")
            if admin_config.exists():
                candidate = kc.KubeClient.from_kubeconfig(str(admin_config))
                try:
                    await candidate.list_objects(kc.CLAIMS, NS)  # served once the controllers installed the CRDs
                    admin = candidate
                except (kc.ApiError, OSError):
                    await candidate.aclose()
            await asyncio.sleep(0.1)  # polling a starting process: no event to wait on
        yield Served(process, admin)
    finally:
        if admin is not None:
            await admin.aclose()
        process.terminate()
        await asyncio.to_thread(process.wait, 120)


async def pool_ready(api: kc.KubeClient, replicas: int, within: float = 900.0) -> None:
    deadline = time.monotonic() + within
    while True:
        status = (await api.get(kc.POOLS, NS, "bench")).get("status") or {}
        if status.get("readyReplicas") == replicas:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"pool not full after {within:.0f} s: {status}")
        await asyncio.sleep(0.25)  # polling the pool's status: the bench keeps no pool watch


async def one_claim(api: kc.KubeClient, watch: ReadyWatch, name: str) -> tuple[float, float, str]:
    """POST → response ms, POST → Ready ms, the bound Sandbox."""
    start = time.perf_counter()
    await api.create(kc.CLAIMS, NS, claim(name))
    posted = time.perf_counter()
    ready = await watch.wait(name, within=300.0)  # at 45/s on a loaded host, tens of seconds
    return (posted - start) * 1000, (ready - start) * 1000, watch.sandbox[name]


def claims_summary(results: list[tuple[float, float, str]]) -> dict[str, Any]:
    return {
        "post_ms": summary([r[0] for r in results]),
        "ready_ms": summary([r[1] for r in results]),
        "bound_warm": sum(1 for r in results if r[2].startswith("bench-")),
    }


async def one_round(src: Path, *, pods: int, paced: int, rate: float, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kubesim-scale-") as tmp:
        async with kubesim(src, Path(tmp)) as served:
            api = served.admin
            watch = ReadyWatch(api)
            await watch.start()
            try:
                await api.create(kc.TEMPLATES, NS, template())
                cpu0, t0 = served.cpu_seconds(), time.perf_counter()
                pool = {"apiVersion": API_VERSION, "kind": "SandboxWarmPool", "metadata": {"name": "bench"}}
                pool["spec"] = {"replicas": pods, "sandboxTemplateRef": {"name": "bench"}}
                await api.create(kc.POOLS, NS, pool)
                await pool_ready(api, pods)
                cpu_ms = (served.cpu_seconds() - cpu0) * 1000
                fill = {"seconds": time.perf_counter() - t0, "cpu_ms_per_pod": cpu_ms / pods}
                print(f"  filled {pods} in {fill['seconds']:.1f} s", flush=True)
                cpu0 = served.cpu_seconds()
                await asyncio.sleep(5)  # measuring idle CPU over a fixed span
                idle_cpu_percent = (served.cpu_seconds() - cpu0) / 5 * 100
                paced_results = []
                for i in range(paced):
                    paced_results.append(await one_claim(api, watch, f"paced-{i:04d}"))
                    await asyncio.sleep(0.2)  # pacing the load
                await pool_ready(api, pods)
                # Poisson arrivals: exponential gaps, each claim sent on time whatever the others do.
                rng = random.Random(20)
                count = int(rate * seconds)
                cpu0, t0 = served.cpu_seconds(), time.perf_counter()
                tasks, at = [], 0.0
                for i in range(count):
                    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
                    tasks.append(asyncio.create_task(one_claim(api, watch, f"poisson-{i:04d}")))
                    at += rng.expovariate(rate)
                poisson_results = await asyncio.gather(*tasks)
                poisson_cpu = served.cpu_seconds() - cpu0
                wall = time.perf_counter() - t0
            finally:
                await watch.stop()
    return {
        "fill": fill,
        "idle_cpu_percent": idle_cpu_percent,
        "paced": claims_summary(paced_results),
        "poisson": {
            **claims_summary(poisson_results),
            "claims": count,
            "wall_seconds": wall,
            "kubesim_cpu_ms_per_claim": poisson_cpu * 1000 / count,
        },
        "load_average_1m": os.getloadavg()[0],
    }


def table(rounds: list[dict[str, Any]], pods: int, rate: float, seconds: float) -> str:
    head = (
        f"kubesim (`default` timing) with a warm pool of {pods} `sleep` pods shaped like warmshell's; "
        f"Poisson claims at {rate:g}/s for {seconds:g} s against the full pool. POST = the claim's create "
        "request answered; Ready = claim Ready on a watch. CPU = kubesim's own processes.\n\n"
        "| tree | fill s | CPU ms/pod start | idle CPU % | paced POST p50/p99 ms | paced Ready p50/p99 ms "
        "| Poisson POST p50/p90/p99 ms | Poisson Ready p50/p90/p99 ms | warm | CPU ms/claim | load |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for r in rounds:
        pp, pr = r["paced"]["post_ms"], r["paced"]["ready_ms"]
        qp, qr = r["poisson"]["post_ms"], r["poisson"]["ready_ms"]
        rows.append(
            f"| {r['tree']} | {r['fill']['seconds']:.1f} | {r['fill']['cpu_ms_per_pod']:.1f} "
            f"| {r['idle_cpu_percent']:.1f} | {pp['p50']:.1f} / {pp['p99']:.1f} | {pr['p50']:.0f} / {pr['p99']:.0f} "
            f"| {qp['p50']:.1f} / {qp['p90']:.1f} / {qp['p99']:.1f} "
            f"| {qr['p50']:.0f} / {qr['p90']:.0f} / {qr['p99']:.0f} "
            f"| {r['poisson']['bound_warm']}/{r['poisson']['claims']} | {r['poisson']['kubesim_cpu_ms_per_claim']:.1f} "
            f"| {r['load_average_1m']:.1f} |"
        )
    return head + "\n".join(rows) + "\n"


async def run(args: argparse.Namespace) -> None:
    trees = [("this", ROOT / "src")]
    if args.before_src:
        trees.insert(0, ("before", Path(args.before_src).resolve()))
    pods = MemoryGuard(args.memory_reserve_mib).fit(args.pods, POD_MIB * 2, "pods (with the refill)")
    rounds = []
    for n in range(args.rounds):
        for label, src in trees:
            print(f"round {n + 1}, {label} ({src}); {available_mib():.0f} MiB available", flush=True)
            result = await one_round(src, pods=pods, paced=args.paced, rate=args.rate, seconds=args.seconds)
            rounds.append({"tree": label, **result})
    write_results(
        "kubesim_scale",
        {"pods": pods, "rate": args.rate, "seconds": args.seconds, "rounds": rounds},
        table(rounds, pods, args.rate, args.seconds),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=450)
    parser.add_argument("--rate", type=float, default=45.0, help="Poisson claims per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--paced", type=int, default=20, help="claims one at a time before the Poisson part")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--before-src", help="an older tree's src/ to run in alternate rounds")
    parser.add_argument("--memory-reserve-mib", type=float, default=4096.0)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
