"""What one warm pool status event (a member's readiness: its counts alone) costs the gateway's
pool cache, in CPU of this process, with 1 and 10 opted-in pools; the cache's informers fed
from memory (the unit tests' fake cluster), so only the cache's own work is timed:

    python bench/investigations/kubernetes-gateway-calls/pool_events.py [--events 5000]
    PYTHONPATH=<older tree>/src python bench/investigations/kubernetes-gateway-calls/pool_events.py
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: its tests' fakes

from tests.unit.drivers_kubernetes.fakes import NS, config
from tests.unit.drivers_kubernetes.test_poolcache import SHAPE, Cluster, synced_cache
from warmshell.drivers.kubernetes import kube
from warmshell.drivers.kubernetes.warm import warmpools


async def cpu_per_event(events: int, pools: int) -> float:
    """Microseconds of CPU per counts-only event of one pool among `pools`."""
    pairs = [
        warmpools.render_pool_pair(
            config(),
            name=f"p{i}",
            namespace=NS,
            shape=dataclasses.replace(SHAPE, environment={"FOO": str(i)}),
            replicas=3,
        )
        for i in range(pools)
    ]
    cluster = Cluster(
        {kube.SANDBOX_WARM_POOLS.plural: [p for _, p in pairs], kube.SANDBOX_TEMPLATES.plural: [t for t, _ in pairs]}
    )
    changes = []
    for k in range(events):
        status = copy.deepcopy(pairs[0][1])
        status["status"] = {"readyReplicas": k % 4}
        changes.append({"type": "MODIFIED", "object": status})
    queue = cluster.events[kube.SANDBOX_WARM_POOLS.plural]
    async with synced_cache(cluster):
        started = time.process_time()
        for change in changes:
            queue.put_nowait(change)
        while not queue.empty():
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        spent = time.process_time() - started
    return spent / events * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--events", type=int, default=5000)
    args = parser.parse_args()
    import warmshell

    print(f"tree: {Path(warmshell.__file__).parents[1]}")
    for pools in (1, 10):
        print(f"{pools} pools: {asyncio.run(cpu_per_event(args.events, pools)):.1f} us of CPU per pool status event")


if __name__ == "__main__":
    main()
