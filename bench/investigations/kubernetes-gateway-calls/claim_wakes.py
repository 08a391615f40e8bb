"""What one change of a pool member's Sandbox or pod costs the gateway's loop while claims are
still resolving their chain (bound, their adopted Sandbox not in the informers yet): the
informers' folding of the pod event, and the claim controller's wake-ups it causes, with 0, 8
and 32 claims resolving (32: the controller's bound on activations in flight):

    python bench/investigations/kubernetes-gateway-calls/claim_wakes.py [--events 2000]
    PYTHONPATH=<older tree>/src python bench/investigations/kubernetes-gateway-calls/claim_wakes.py
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import warmshell
from warmshell.core.ids import Fingerprint, SandboxId
from warmshell.drivers.events import Hub
from warmshell.drivers.kubernetes import naming, watching
from warmshell.drivers.kubernetes.informers import Informers
from warmshell.drivers.kubernetes.proofs import ProofSealer
from warmshell.drivers.kubernetes.rendering import SandboxIdentity
from warmshell.drivers.kubernetes.warm import claimactivation, claims

NS = "warmshell"
SEALER = ProofSealer(bytes(range(32)))


def bound_claim(i: int) -> dict[str, Any]:
    """Our claim number `i`, bound to pool member `member-i`, with a valid sealed proof."""
    name, sandbox_id = f"default--c{i}", f"id-{i}"
    sealed = SEALER.seal("p", namespace=NS, name=name, sandbox_id=sandbox_id)
    who = SandboxIdentity(sandbox_id=SandboxId(sandbox_id), workspace="default", name=f"c{i}", sealed_proof=sealed)
    ref = naming.ObjectRef(NS, name)
    claim = claims.render_claim(ref=ref, who=who, pool="p", gateway_id="gw", fingerprint=Fingerprint("f"))
    claim["metadata"]["uid"] = f"uid-{i}"
    claim["status"] = {"sandbox": {"name": f"member-{i}"}}
    return claim


async def per_event(resolving: int, events: int) -> float:
    """Microseconds of CPU per change of another member's pod, `resolving` claims waiting."""
    hub = Hub()
    hub.publish = lambda _event: None  # type: ignore[method-assign]
    informers = Informers(None, NS, hub, watching.Backoff(), with_claims=True)  # type: ignore[arg-type]
    informers.claims_listed([bound_claim(i) for i in range(resolving)])
    other = {"metadata": {"name": "member-other", "uid": "u-other", "labels": {}}}
    pod = {"metadata": {"name": "member-other", "uid": "u-pod"}, "status": {"phase": "Running"}}
    informers._sandboxes_listed([other])
    informers._pods_listed([pod])
    controller = claimactivation.ClaimActivation(None, NS, SEALER, informers)  # type: ignore[arg-type]
    controller.start(claimactivation.NotStarted())  # no registration: the claims stay resolving
    for _ in range(20):
        await asyncio.sleep(0)
    assert controller.in_flight == resolving
    started = time.process_time()
    for _ in range(events):
        informers._pod_event("MODIFIED", pod)
        for _ in range(4):  # the controller's wake, then each woken claim's look at the cache
            await asyncio.sleep(0)
    spent = time.process_time() - started
    await controller.aclose()
    return spent / events * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--events", type=int, default=2000)
    args = parser.parse_args()
    claimactivation.CACHE_WAIT_SECONDS = 1e6  # the claims keep waiting for the informers
    print(f"tree: {Path(warmshell.__file__).parents[1]}")
    for resolving in (0, 8, 32):
        cost = asyncio.run(per_event(resolving, args.events))
        print(f"{resolving} claims resolving: {cost:.1f} us of CPU per other member's pod change")


if __name__ == "__main__":
    main()
