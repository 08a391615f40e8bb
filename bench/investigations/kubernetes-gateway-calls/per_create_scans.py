"""What two lookups every warm create makes cost in CPU as the pool and the claims grow: the
activator's count of idle pool members (`GatewayActivator.idle_members`, asked by every pool
listing, an egress policy's lookup at each warm activation among them) with 30 and 450 members
parked, and a delete's cached claim (`Informers.claim_of`) among 30 and 450 claims:

    python bench/investigations/kubernetes-gateway-calls/per_create_scans.py [--calls 20000]
    PYTHONPATH=<older tree>/src python bench/investigations/kubernetes-gateway-calls/per_create_scans.py
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import warmshell
from warmshell.core.ids import Fingerprint, InstanceId, SandboxId
from warmshell.drivers.base import SupervisorIdentity, WarmPending
from warmshell.drivers.events import Hub
from warmshell.drivers.kubernetes import naming, watching
from warmshell.drivers.kubernetes.informers import Informers
from warmshell.drivers.kubernetes.rendering import SandboxIdentity
from warmshell.drivers.kubernetes.warm import claims
from warmshell.gateway.activation import GatewayActivator
from warmshell.gateway.registry import Registry


def per_call(call: Callable[[], object], calls: int) -> float:
    """Microseconds of CPU per call."""
    started = time.process_time()
    for _ in range(calls):
        call()
    return (time.process_time() - started) / calls * 1e6


def idle_members(parked: int) -> Callable[[], object]:
    registry: Registry[Any] = Registry()
    for i in range(parked):
        member = InstanceId(f"i-{i}")
        registry.register(SupervisorIdentity("kubernetes", member, member, "default", WarmPending(Fingerprint("fp"))))
    return GatewayActivator(registry, None, None, None).idle_members  # type: ignore[arg-type]


def claim_of(count: int) -> Callable[[], object]:
    hub = Hub()
    hub.publish = lambda _event: None  # type: ignore[method-assign]
    informers = Informers(None, "warmshell", hub, watching.Backoff(), with_claims=True)  # type: ignore[arg-type]
    listed = []
    for i in range(count):
        who = SandboxIdentity(sandbox_id=SandboxId(f"id-{i}"), workspace="default", name=f"s{i}", sealed_proof="s")
        ref = naming.ObjectRef("warmshell", f"default--s{i}")
        listed.append(claims.render_claim(ref=ref, who=who, pool="p", gateway_id="gw", fingerprint=Fingerprint("f")))
    informers.claims_listed(listed)
    last = SandboxId(f"id-{count - 1}")
    return lambda: informers.claim_of(last)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    print(f"tree: {Path(warmshell.__file__).parents[1]}")
    for n in (30, 450):
        print(f"{n} parked: {per_call(idle_members(n), args.calls):.2f} us of CPU per idle_members()")
    for n in (30, 450):
        print(f"{n} claims: {per_call(claim_of(n), args.calls // 10):.2f} us of CPU per claim_of()")


if __name__ == "__main__":
    main()
