"""Parked claims on a registration: what one supervisor registering costs the claim activation
controller when many bound claims are parked on this replica (with replicas, every claim another
replica activates stays parked here until its sandbox is deleted: two thirds of them with three).

In-process: the real `ClaimActivation` against the unit tests' in-memory cluster (claim ->
Sandbox -> pod chains, no HTTP) and an activator that holds a set of registered pods. `--parked`
claims are parked first (their pods registered on "another replica"), then `--late` pods register
here one at a time, each waited for (up to 2 s) until its claim is activated. Reported: claims
never activated, activate() calls and API reads per registration, and CPU per registration
(process time, the waits of missed claims included in wall time only).

    python bench/investigations/parked-claims/parked_claims.py [--parked 300] [--late 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # the harness

from harness import write_results  # noqa: E402

from tests.unit.drivers_kubernetes.test_warm_allocation import parked_scene  # noqa: E402
from warmshell.drivers.kubernetes.warm import claimactivation  # noqa: E402

WAIT_SECONDS = 2.0  # for one registration's claim to be activated


async def run(parked: int, late: int) -> dict[str, Any]:
    claimactivation.RETRY_DELAYS = ()  # park after one attempt: the backoff is not what is measured
    cluster, activator, controller, claims, pods = parked_scene(parked + late, resync_seconds=3600)
    controller.replace(claims)
    await controller.wait_in_flight()
    calls, reads = len(activator.calls), len(cluster.calls)
    cpu, wall = time.process_time(), time.perf_counter()
    missed = 0
    for pod_uid in pods[parked:]:
        activated = activator.register(pod_uid)
        try:
            await asyncio.wait_for(activated.wait(), WAIT_SECONDS)
        except TimeoutError:
            missed += 1  # its claim was not retried: the registration was lost on it
    await controller.wait_in_flight()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await controller.aclose()
    return {
        "parked": parked,
        "late": late,
        "not_activated": missed,
        "activate_calls_per_registration": (len(activator.calls) - calls) / late,
        "api_reads_per_registration": (len(cluster.calls) - reads) / late,
        "cpu_ms_per_registration": cpu * 1000 / late,
        "wall_ms_per_registration": wall * 1000 / late,
        "load_average": os.getloadavg(),
    }


def table_for(rows: list[dict[str, Any]]) -> str:
    text = "| code | parked | registrations | claims not activated | activate() calls / registration "
    text += "| API reads / registration | CPU ms / registration | load avg |\n|---|---|---|---|---|---|---|---|\n"
    for row in rows:
        text += (
            f"| {row['label']} | {row['parked']} | {row['late']} | {row['not_activated']} "
            f"| {row['activate_calls_per_registration']:.1f} "
            f"| {row['api_reads_per_registration']:.1f} | {row['cpu_ms_per_registration']:.2f} "
            f"| {row['load_average'][0]:.1f} |\n"
        )
    return text + "\nIn-process, one core's worth of asyncio; the machine was shared.\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parked", type=int, default=300)
    parser.add_argument("--late", type=int, default=100)
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--name", default="parked_claims")
    args = parser.parse_args()
    row = {"label": args.label, **asyncio.run(run(args.parked, args.late))}
    write_results(args.name, {"rows": [row], "args": vars(args)}, table_for([row]))


if __name__ == "__main__":
    main()
