"""Pure rendering and reading of the `SandboxClaim` a warm create writes.

The claim names only its pool (`spec.warmPoolRef.name`): any `env` or volume template would make
agent-sandbox skip the warm queue and start cold. Who the claim is for travels in labels (sandbox
id, workspace) and the sealed activation proof in an annotation, bound to (namespace, claim name,
sandbox id) like a cold Sandbox's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from warmshell.core.fingerprints import fingerprint as fingerprint_of
from warmshell.core.ids import Fingerprint, SandboxId
from warmshell.core.models import Allocation
from warmshell.drivers.base import BackendState, DriverCondition, DriverSandbox
from warmshell.drivers.kubernetes import kube, labels, status
from warmshell.drivers.kubernetes.naming import ObjectRef
from warmshell.drivers.kubernetes.objects import Obj
from warmshell.drivers.kubernetes.rendering import SandboxIdentity
from warmshell.drivers.kubernetes.warm import warmpools

__all__ = [
    "bound_sandbox_name",
    "controlled_by",
    "is_ours",
    "pool_of",
    "render_claim",
    "runs_requested_shape",
    "sandbox_id_of",
    "view",
]


def render_claim(*, ref: ObjectRef, who: SandboxIdentity, pool: str, gateway_id: str, fingerprint: Fingerprint) -> Obj:
    """The claim for one warm create (validates against the SandboxClaim CRD schema);
    `fingerprint` is the request's, so the Sandbox bound to it can be checked to run that shape."""
    return {
        "apiVersion": kube.SANDBOX_CLAIMS.api_version,
        "kind": kube.SANDBOX_CLAIMS.kind,
        "metadata": {
            "name": ref.name,
            "namespace": ref.namespace,
            "labels": {
                labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
                labels.SANDBOX_ID: who.sandbox_id,
                labels.WORKSPACE: who.workspace,
                labels.ALLOCATION: labels.ALLOCATION_CLAIM,
                labels.GATEWAY_ID: gateway_id,
            },
            "annotations": {
                labels.SANDBOX_ID: who.sandbox_id,
                labels.SANDBOX_NAME: who.name,
                labels.ACTIVATION_PROOF: who.sealed_proof,
                labels.FINGERPRINT: fingerprint,
            },
        },
        "spec": {"warmPoolRef": {"name": pool}},
    }


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def is_ours(claim: Mapping[str, Any]) -> bool:
    """A claim warmshell made for a sandbox (labels only: trust comes from the sealed proof)."""
    found = _meta(claim).get("labels") or {}
    return (
        found.get(labels.MANAGED_BY) == labels.MANAGED_BY_VALUE
        and found.get(labels.ALLOCATION) == labels.ALLOCATION_CLAIM
        and bool(found.get(labels.SANDBOX_ID))
    )


def sandbox_id_of(claim: Mapping[str, Any]) -> SandboxId | None:
    """The sandbox id on the claim's label."""
    value = (_meta(claim).get("labels") or {}).get(labels.SANDBOX_ID)
    return SandboxId(str(value)) if value else None


def bound_sandbox_name(claim: Mapping[str, Any]) -> str:
    """The Sandbox agent-sandbox bound to the claim ("" until it has one)."""
    return str(((claim.get("status") or {}).get("sandbox") or {}).get("name") or "")


def pool_of(claim: Mapping[str, Any]) -> str:
    """The warm pool the claim draws from."""
    return str(((claim.get("spec") or {}).get("warmPoolRef") or {}).get("name") or "")


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """The object's single controller has this uid."""
    controllers = [r for r in _meta(obj).get("ownerReferences") or [] if r.get("controller")]
    return bool(uid) and len(controllers) == 1 and controllers[0].get("uid") == uid


def view(claim: Mapping[str, Any], sandbox: Mapping[str, Any] | None, pod: Mapping[str, Any] | None) -> DriverSandbox:
    """A claim-backed sandbox: the bound Sandbox's view (it carries no sandbox id of ours, so the
    claim's is lent to it), or Pending until agent-sandbox binds one."""
    sandbox_id = sandbox_id_of(claim)
    assert sandbox_id is not None, "view() is only for claims carrying our sandbox id"
    pool = pool_of(claim)
    if sandbox is None or not controlled_by(sandbox, str(_meta(claim).get("uid") or "")):
        waiting = DriverCondition("ClaimBound", "False", "Pending", "waiting for agent-sandbox to bind the claim")
        return DriverSandbox(sandbox_id, "", BackendState.PENDING, (waiting,), allocation=Allocation.WARM, pool=pool)
    meta = _meta(sandbox)
    lent = {**sandbox, "metadata": {**meta, "labels": {**(meta.get("labels") or {}), labels.SANDBOX_ID: sandbox_id}}}
    bound = DriverCondition("ClaimBound", "True", "Bound", f"Sandbox {meta.get('name')}")
    found = status.view(lent, pod)
    return dataclasses.replace(
        found, allocation=Allocation.WARM, pool=pool, miss_reason="", conditions=(bound, *found.conditions)
    )


def runs_requested_shape(claim: Mapping[str, Any], sandbox: Mapping[str, Any]) -> bool:
    """The Sandbox bound to the claim runs the shape the create asked for (a pool member filled
    from an older template would not: agent-sandbox keeps such members until claimed)."""
    expected = (_meta(claim).get("annotations") or {}).get(labels.FINGERPRINT)
    workspace = (_meta(claim).get("labels") or {}).get(labels.WORKSPACE)
    shape = warmpools.shape_of_template(
        {"metadata": {"annotations": {labels.WORKSPACE: workspace}}, "spec": sandbox.get("spec") or {}}
    )
    return bool(expected) and shape is not None and fingerprint_of(shape) == expected
