"""What the activator's count of idle pool members (`GatewayActivator.idle_members`, asked by
every pool listing, an egress policy's lookup at each warm activation among them) costs in CPU
with 30 and with 450 members parked, the registry unchanged between the calls:

    python bench/investigations/kubernetes-gateway-calls/idle_members.py [--calls 20000]
    PYTHONPATH=<older tree>/src python bench/investigations/kubernetes-gateway-calls/idle_members.py
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import warmshell
from warmshell.core.ids import Fingerprint, InstanceId
from warmshell.drivers.base import SupervisorIdentity, WarmPending
from warmshell.gateway.activation import GatewayActivator
from warmshell.gateway.registry import Registry


def cpu_per_call(parked: int, calls: int) -> float:
    """Microseconds of CPU per `idle_members()` with `parked` members waiting."""
    registry: Registry[Any] = Registry()
    for i in range(parked):
        member = InstanceId(f"i-{i}")
        registry.register(SupervisorIdentity("kubernetes", member, member, "default", WarmPending(Fingerprint("fp"))))
    activator = GatewayActivator(registry, None, None, None)  # type: ignore[arg-type]
    started = time.process_time()
    for _ in range(calls):
        activator.idle_members()
    return (time.process_time() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    print(f"tree: {Path(warmshell.__file__).parents[1]}")
    for parked in (30, 450):
        print(f"{parked} parked: {cpu_per_call(parked, args.calls):.2f} us of CPU per idle_members()")


if __name__ == "__main__":
    main()
