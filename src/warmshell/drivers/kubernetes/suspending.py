"""Pause and resume on Kubernetes: agent-sandbox's `Suspended` operating mode (Sandbox v1beta1
`spec.operatingMode`). Suspended, agent-sandbox deletes the Sandbox's pod and keeps the Sandbox,
its Service and its PVCs; back to `Running`, it makes a new pod of the same name (a new uid)
from the Sandbox's pod template, whose supervisor registers and is activated like a cold one.

A pause is one write (the mode). A resume is the mode and the new activation proof (the one the
gateway's record now expects) in one write on a cold Sandbox; a warm sandbox's proof lives on
its SandboxClaim, so the claim is written first, then the mode. The old pod's credentials are
worthless after that: its projected token names a pod uid that no longer exists, and its proof is
no longer the record's."""

from __future__ import annotations

from dataclasses import dataclass

from warmshell.core.errors import FailedPreconditionError, NotFoundError
from warmshell.core.ids import SandboxId
from warmshell.drivers.kubernetes import finding, kube, labels, proofs, status
from warmshell.drivers.kubernetes.objects import Obj
from warmshell.drivers.kubernetes.warm import claims

__all__ = ["RUNNING", "SUSPENDED", "Found", "check_served", "mode_patch", "proof_patch", "sandbox_of", "seal_for"]

RUNNING = "Running"
SUSPENDED = status.SUSPENDED
SERVING_VERSION = "v1beta1"  # v1alpha1's `spec.replicas` 0|1 is not written by this driver


@dataclass(frozen=True)
class Found:
    """The Sandbox running a sandbox, and the claim it was bound through (None: a cold one)."""

    sandbox: Obj
    claim: Obj | None


def check_served(resource: kube.Resource) -> None:
    """FailedPreconditionError unless the cluster's Sandbox API has the operating mode."""
    if resource.version != SERVING_VERSION:
        raise FailedPreconditionError(
            f"the cluster serves agent-sandbox Sandbox {resource.version}, which has no operatingMode: "
            f"pause and resume on Kubernetes need Sandbox {SERVING_VERSION} (agent-sandbox 0.5 or later)"
        )


def mode_patch(mode: str) -> Obj:
    """The merge patch that sets the Sandbox's operating mode."""
    return {"spec": {"operatingMode": mode}}


def proof_patch(sealed: str) -> Obj:
    """The merge patch that replaces the sealed activation proof on a Sandbox or a claim."""
    return {"metadata": {"annotations": {labels.ACTIVATION_PROOF: sealed}}}


async def sandbox_of(
    api: kube.Kube, namespace: str, resource: kube.Resource, sandbox_id: SandboxId, claim: Obj | None
) -> Found:
    """The Sandbox of `sandbox_id`: the one carrying its id (cold), else the one agent-sandbox
    bound to its claim (warm; `claim` as found by the caller). NotFoundError when neither is."""
    if claim is None:
        found = await finding.find(api, namespace, resource, sandbox_id)
        if found is None:
            raise NotFoundError(f"the cluster has no Sandbox for sandbox {sandbox_id}")
        return Found(found, None)
    bound = claims.bound_sandbox_name(claim)
    if not bound:
        raise NotFoundError(f"SandboxClaim of sandbox {sandbox_id} is not bound to a Sandbox")
    try:
        sandbox = await api.get(resource, namespace, bound)
    except kube.NotFound as exc:
        raise NotFoundError(f"the Sandbox {namespace}/{bound} of sandbox {sandbox_id} is gone") from exc
    if not claims.controlled_by(sandbox, str(claim["metadata"].get("uid") or "")):
        raise NotFoundError(f"Sandbox {namespace}/{bound} is not controlled by the claim of sandbox {sandbox_id}")
    return Found(sandbox, claim)


def seal_for(sealer: proofs.ProofSealer, obj: Obj, sandbox_id: SandboxId, proof: str) -> str:
    """`proof` sealed to the object that carries it (namespace, name, sandbox id)."""
    meta = obj["metadata"]
    return sealer.seal(proof, namespace=str(meta["namespace"]), name=str(meta["name"]), sandbox_id=sandbox_id)
