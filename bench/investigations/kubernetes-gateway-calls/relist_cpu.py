"""What one pass of the reconciler's relist costs the gateway in CPU, listing live (every
Sandbox, pod and claim LISTed from the API and joined) against judging from the informers'
objects (`KubernetesDriver.cached_list`): a gateway in this process on kubesim `fast` (its own
process), a warm pool of `--pool` members, `--claimed` of them claimed by warm creates and kept;
passes alternate between the two ways, the CPU of this process (the gateway's) read around each:

    python bench/investigations/kubernetes-gateway-calls/relist_cpu.py [--pool 30] [--claimed 10] [--passes 20]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import kubernetes_warm  # noqa: E402

from tests.helpers.gateway import running_gateway  # noqa: E402
from tests.helpers.kubesim_process import kubesim_process  # noqa: E402
from tests.integration.drivers_kubernetes.conftest import IMAGES, gateway_settings  # noqa: E402
from warmshell.api.v1 import sandbox_pb2 as pb  # noqa: E402
from warmshell.drivers.kubernetes import KubernetesDriver  # noqa: E402


async def run(pool: int, claimed: int, passes: int) -> dict[str, list[float]]:
    """CPU ms of each relist pass, by way."""
    async with kubesim_process("fast", IMAGES) as cluster:
        with tempfile.TemporaryDirectory(prefix="ws-relist-") as tmp:
            state = Path(tmp) / "state"
            await kubernetes_warm.create_pool(cluster, state, pool + claimed)
            settings = gateway_settings(cluster, state) | {"reconcile_interval_seconds": 3600.0}
            async with running_gateway(state, **settings) as gw:
                driver = gw.gateway.parts.driver
                assert isinstance(driver, KubernetesDriver)
                await kubernetes_warm.wait_full(driver, pool + claimed)
                for i in range(claimed):
                    await gw.stub.CreateSandbox(
                        pb.CreateSandboxRequest(
                            name=f"c{i}", spec=pb.SandboxSpec(environment=kubernetes_warm.WARM_ENV), wait_ready=True
                        ),
                        metadata=gw.metadata,
                    )
                await asyncio.sleep(1.0)  # the informers take in the last events
                assert driver.cached_list() is not None
                reconciler = gw.gateway.parts.reconciler
                figures: dict[str, list[float]] = {"live": [], "cached": []}
                for _ in range(passes):
                    for way in ("live", "cached"):
                        if way == "live":
                            reconciler._listed_live_at = -math.inf  # the next pass lists live
                        started = time.process_time()
                        await reconciler.reconcile_once()
                        figures[way].append((time.process_time() - started) * 1000)
                        await asyncio.sleep(0.05)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--pool", type=int, default=30, help="idle members")
    parser.add_argument("--claimed", type=int, default=10, help="members claimed by warm creates, kept")
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()
    figures = asyncio.run(run(args.pool, args.claimed, args.passes))
    print(
        f"relist pass, gateway CPU ms ({args.pool} idle members, {args.claimed} claimed, {args.passes} passes"
        f" each, alternating, load {os.getloadavg()[0]:.1f}):"
    )
    for way, values in figures.items():
        print(f"  {way}: median {statistics.median(values):.2f}, min {min(values):.2f}, max {max(values):.2f}")


if __name__ == "__main__":
    main()
