"""kubesim's own CPU per warm claim, without a gateway: a `kubesim serve` process (default timing)
with a warm pool of two-container pods shaped like warmshell's (env, a projected token volume and four emptyDirs,
no probe, as warmshell's), claims created over HTTP at a steady rate, each deleted once Ready (its
Sandbox and pod go, the pool refills). The figure is the CPU of the `kubesim serve` process's own
threads (its pods' processes are children, not counted) from the first claim until the pool is
full again, divided by the claims; trees alternate in one run, so both see the same load.

    python bench/investigations/kubesim-api-cpu/claim_cpu.py [--before-src DIR] [--rounds 2]
        [--claims 90] [--rate 6] [--pool 20] [--profile-dir DIR]

With `--profile-dir` (py-spy on PATH) each round's API server is sampled (raw stacks, one file
per round) for `split_profile.py`.
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
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))
import cpuparts  # noqa: E402

from kubesim.controllers import client as kc  # noqa: E402

NS = "default"
CONTAINERS = ("supervisor", "agent")


def _template() -> dict[str, Any]:
    container = {
        "image": "busybox",
        "command": ["sleep", "3600"],
        "env": [{"name": f"E{i}", "value": "v" * 30} for i in range(12)],
        "volumeMounts": [{"name": f"v{i}", "mountPath": f"/m/{i}"} for i in range(5)],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
    }
    token = {"serviceAccountToken": {"path": "t", "expirationSeconds": 3600, "audience": "warmshell"}}
    spec = {
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": name, **container} for name in CONTAINERS],
        "volumes": [{"name": "v0", "projected": {"sources": [token]}}]
        + [{"name": f"v{i}", "emptyDir": {}} for i in range(1, 5)],
    }
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxTemplate",
        "metadata": {"name": "bench"},
        "spec": {
            "podTemplate": {"metadata": {"labels": {f"warmshell.dev/l{i}": "v" * 20 for i in range(6)}}, "spec": spec}
        },
    }


def _pool(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxWarmPool",
        "metadata": {"name": "bench"},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "bench"}},
    }


def _claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"warmPoolRef": {"name": "bench"}},
    }


@contextlib.asynccontextmanager
async def serve(src: str, workdir: Path) -> AsyncIterator[tuple[int, kc.KubeClient]]:
    """`kubesim serve` from the tree `src` (default timing); its pid and an admin client."""
    admin = workdir / "admin.kubeconfig"
    env = {**os.environ, "KUBESIM_TIMING": "default", "PYTHONPATH": src}
    cmd = [sys.executable, "-c", "from kubesim.cli import main; main()", "serve"]
    cmd += ["--kubeconfig", str(workdir / "kc"), "--admin-kubeconfig", str(admin)]
    log = (workdir / "serve.log").open("wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        for _ in range(600):
            if admin.exists() and yaml.safe_load(admin.read_text()):
                break
            await asyncio.sleep(0.05)
        api = kc.KubeClient.from_kubeconfig(str(admin))
        for _ in range(600):
            with contextlib.suppress(Exception):
                await api.get(
                    kc.Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", False),
                    None,
                    "sandboxwarmpools.extensions.agents.x-k8s.io",
                )
                break
            await asyncio.sleep(0.05)
        try:
            yield proc.pid, api
        finally:
            await api.aclose()
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


async def _pool_full(api: kc.KubeClient, replicas: int, within: float = 300.0) -> None:
    deadline = time.monotonic() + within
    while True:
        status = (await api.get(kc.POOLS, NS, "bench")).get("status") or {}
        if status.get("readyReplicas") == replicas and status.get("replicas") == replicas:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"pool not full: {status}")
        await asyncio.sleep(0.1)


async def _claim_ready(api: kc.KubeClient, name: str, within: float = 120.0) -> None:
    await api.create(kc.CLAIMS, NS, _claim(name))
    deadline = time.monotonic() + within
    while True:
        status = (await api.get(kc.CLAIMS, NS, name)).get("status") or {}
        conditions = status.get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"claim {name} not Ready: {status}")
        await asyncio.sleep(0.05)
    await api.delete(kc.CLAIMS, NS, name)


async def _writes(api: kc.KubeClient) -> dict[str, int]:
    """kubesim's own (admin) writes so far, by verb and resource."""
    rows = (await api.request("GET", "/_kubesim/requests", params={"user": "kubesim-admin"}))["counters"]
    return {f"{r['verb']} {r['resource']}": r["count"] for r in rows if r["verb"] not in ("get", "list", "watch")}


def _cpu(pid: int) -> float:
    return sum(seconds for _, seconds in cpuparts.thread_seconds(pid).values())


async def one_round(src: str, args: argparse.Namespace, label: str, index: int) -> tuple[float, dict[str, float]]:
    """CPU ms of `kubesim serve` per warm claim, one round of tree `src`, and its own writes per claim."""
    with tempfile.TemporaryDirectory(prefix="claim-cpu-") as tmp:
        async with serve(src, Path(tmp)) as (pid, api):
            await api.create(kc.TEMPLATES, NS, _template())
            await api.create(kc.POOLS, NS, _pool(args.pool))
            await _pool_full(api, args.pool)
            await asyncio.sleep(2.0)
            spy = None
            if args.profile_dir:
                out = Path(args.profile_dir) / f"{label}-{index}.txt"
                spy = subprocess.Popen(
                    ["py-spy", "record", "--nonblocking", "-r", "200", "-f", "raw", "-o", str(out), "-p", str(pid)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            writes = await _writes(api)
            start = _cpu(pid)
            tasks = []
            for i in range(args.claims):
                tasks.append(asyncio.create_task(_claim_ready(api, f"c{i}")))
                await asyncio.sleep(1.0 / args.rate)
            await asyncio.gather(*tasks)
            await _pool_full(api, args.pool)
            while (await api.list_objects(kc.SANDBOXES, NS)).get("items", []).__len__() > args.pool:
                await asyncio.sleep(0.1)
            used = _cpu(pid) - start
            after = await _writes(api)
            per_claim = {k: (n - writes.get(k, 0)) / args.claims for k, n in after.items() if n > writes.get(k, 0)}
            if spy is not None:
                spy.send_signal(2)
                spy.wait(30)
            return used / args.claims * 1000, per_claim


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before-src", default="")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--claims", type=int, default=90)
    parser.add_argument("--rate", type=float, default=6.0)
    parser.add_argument("--pool", type=int, default=20)
    parser.add_argument("--profile-dir", default="")
    parser.add_argument("--writes", action="store_true", help="list kubesim's own writes per claim")
    args = parser.parse_args()
    trees = [("after", str(ROOT / "src"))] + ([("before", args.before_src)] if args.before_src else [])
    got: dict[str, list[float]] = {label: [] for label, _ in trees}
    for index in range(args.rounds):
        for label, src in trees if index % 2 == 0 else trees[::-1]:
            ms, writes = await one_round(src, args, label, index)
            got[label].append(ms)
            load = os.getloadavg()[0]
            total = sum(writes.values())
            print(f"round {index} {label}: {ms:.1f} ms CPU per claim, {total:.1f} writes (load {load:.1f})", flush=True)
            if args.writes:
                for key, n in sorted(writes.items(), key=lambda kv: -kv[1]):
                    print(f"    {n:5.2f} {key}")
    for label, values in got.items():
        print(f"{label}: median {statistics.median(values):.1f} ms ({', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    asyncio.run(main())
