"""kubesim's CPU per warm claim with no HTTP at all: the API server, controllers and kubelet of
`running_cluster` (default timing) and the claims made by an in-process client in the same
thread, so the figure is the thread's CPU (`time.thread_time`) and nothing else on the host is
counted. The workload is `claim_cpu.py`'s (its pod template, pool of 20, claims at 6/s, each
deleted once Ready), measured until the pool is full again. Also prints the cyclic collector's
passes and CPU per claim, by generation.

    PYTHONPATH=<tree>/src python bench/investigations/kubesim-api-cpu/claim_cpu_inprocess.py [CLAIMS]

Run it alternating trees (`PYTHONPATH=src`, then an older tree's `src`), as `claim_cpu.py` does.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from claim_cpu import NS, _claim, _pool, _template

from kubesim import cli, timing
from kubesim.cluster import running_cluster
from kubesim.controllers import client as kc
from kubesim.inprocess import InProcessClient

POOL = 20
RATE = 6.0


class CollectorClock:
    """Passes and thread CPU of the cyclic collector, by generation."""

    def __init__(self) -> None:
        self.passes = {0: 0, 1: 0, 2: 0}
        self.seconds = {0: 0.0, 1: 0.0, 2: 0.0}
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
            return
        generation = info["generation"]
        self.passes[generation] += 1
        self.seconds[generation] += time.thread_time() - self._started


async def _ready(api: kc.KubeClient, name: str) -> None:
    await api.create(kc.CLAIMS, NS, _claim(name))
    while True:
        status = (await api.get(kc.CLAIMS, NS, name)).get("status") or {}
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
            break
        await asyncio.sleep(0.05)
    await api.delete(kc.CLAIMS, NS, name)


async def _settled(api: kc.KubeClient) -> bool:
    pool = (await api.get(kc.POOLS, NS, "bench")).get("status") or {}
    members = (await api.list_objects(kc.SANDBOXES, NS)).get("items") or []
    return pool.get("readyReplicas") == POOL and len(members) == POOL


async def main(claims: int) -> None:
    async with running_cluster(timing=timing.DEFAULT) as cluster:
        api = InProcessClient(cluster.server, cluster.server.admin_token)
        await api.create(kc.TEMPLATES, NS, _template())
        await api.create(kc.POOLS, NS, _pool(POOL))
        while not await _settled(api):
            await asyncio.sleep(0.1)
        cli._quiet_collector()  # as `kubesim serve` runs
        clock = CollectorClock()
        gc.callbacks.append(clock)
        started = time.thread_time()
        tasks = []
        for i in range(claims):
            tasks.append(asyncio.create_task(_ready(api, f"c{i}")))
            await asyncio.sleep(1 / RATE)
        await asyncio.gather(*tasks)
        while not await _settled(api):
            await asyncio.sleep(0.1)
        used = time.thread_time() - started
        gc.callbacks.remove(clock)
        collector = {g: (clock.passes[g], round(clock.seconds[g] / claims * 1000, 2)) for g in clock.passes}
        print(f"{used / claims * 1000:.1f} ms CPU per claim; collector (passes, ms per claim) {collector}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 90))
