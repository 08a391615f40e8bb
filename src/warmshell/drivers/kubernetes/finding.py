"""Reading our objects back for the driver's `get`, `list` and `delete`: one sandbox's objects are
found by its id — through the sandbox-id label, never by name alone — a SandboxClaim is joined to
the Sandbox and pod agent-sandbox bound to it, and a delete names the found object's uid, so an
object recreated meanwhile under the same name is never deleted by mistake."""

from __future__ import annotations

import logging

from warmshell.core.errors import UnavailableError
from warmshell.core.ids import SandboxId
from warmshell.drivers.base import DriverSandbox
from warmshell.drivers.kubernetes import kube, labels, status
from warmshell.drivers.kubernetes.objects import Obj
from warmshell.drivers.kubernetes.warm import claims

__all__ = [
    "DELETE_ATTEMPTS",
    "claim_view",
    "claim_views",
    "delete_cached",
    "delete_found",
    "find",
    "own_pod_in",
    "pod_of",
]

log = logging.getLogger(__name__)

DELETE_ATTEMPTS = 3


async def find(api: kube.Kube, namespace: str, resource: kube.Resource, sandbox_id: SandboxId) -> Obj | None:
    """The oldest object of `resource` carrying this sandbox id."""
    selector = labels.sandbox_selector(sandbox_id)
    found = await api.list(resource, namespace, label_selector=selector)
    items = [s for s in found.get("items") or [] if status.sandbox_id_of(s) == sandbox_id]
    if len(items) > 1:
        log.warning("%d Sandboxes carry sandbox id %s; using the oldest", len(items), sandbox_id)
        items.sort(key=lambda s: s["metadata"].get("creationTimestamp") or "")
    return items[0] if items else None


async def pod_of(api: kube.Kube, sandbox: Obj) -> Obj | None:
    """The Sandbox's own pod, read now; None when it has none (yet)."""
    try:
        pod = await api.get(kube.PODS, sandbox["metadata"]["namespace"], status.owned_pod_name(sandbox))
    except kube.NotFound:
        return None
    return status.own_pod(sandbox, pod)


def own_pod_in(sandbox: Obj, pods_by_name: dict[str, Obj]) -> Obj | None:
    """The Sandbox's own pod from a listing of pods by name."""
    return status.own_pod(sandbox, pods_by_name.get(status.owned_pod_name(sandbox)))


async def claim_view(api: kube.Kube, namespace: str, resource: kube.Resource, claim: Obj) -> DriverSandbox:
    """The claim joined to the Sandbox it is bound to (if any) and its pod, read now."""
    sandbox: Obj | None = None
    pod: Obj | None = None
    if bound := claims.bound_sandbox_name(claim):
        try:
            sandbox = await api.get(resource, namespace, bound)
        except kube.NotFound:
            sandbox = None
        pod = await pod_of(api, sandbox) if sandbox is not None else None
    return claims.view(claim, sandbox, pod)


async def claim_views(
    api: kube.Kube, namespace: str, sandboxes: dict[str, Obj], pods: dict[str, Obj]
) -> list[DriverSandbox]:
    """Our SandboxClaims, each joined to its Sandbox and pod from the listings by name
    (NotFound when the claim collection itself is gone)."""
    listed = await api.list(kube.SANDBOX_CLAIMS, namespace, label_selector=labels.claim_selector())
    views = []
    for claim in listed.get("items") or []:
        if claims.is_ours(claim):
            sandbox = sandboxes.get(claims.bound_sandbox_name(claim))
            views.append(claims.view(claim, sandbox, own_pod_in(sandbox, pods) if sandbox is not None else None))
    return views


async def delete_cached(api: kube.Kube, resource: kube.Resource, cached: Obj | None) -> bool:
    """Delete an object as an informer last showed it, under its uid (no LIST first): True when it
    was deleted; False when there is no cached object, or it is gone or was replaced since (the
    caller then looks it up with `delete_found`)."""
    if cached is None:
        return False
    meta = cached["metadata"]
    try:
        await api.delete(resource, meta["namespace"], meta["name"], uid=meta["uid"])
    except (kube.NotFound, kube.Conflict):
        return False
    return True


async def delete_found(api: kube.Kube, namespace: str, resource: kube.Resource, sandbox_id: SandboxId) -> bool:
    """Delete the object of `resource` carrying this id under its uid; False when there is none."""
    for _ in range(DELETE_ATTEMPTS):
        found = await find(api, namespace, resource, sandbox_id)
        if found is None:
            return False
        meta = found["metadata"]
        try:
            await api.delete(resource, meta["namespace"], meta["name"], uid=meta["uid"])
        except kube.NotFound:
            return False
        except kube.Conflict:
            continue  # replaced between the read and the delete: look again
        return True
    raise UnavailableError(f"{resource.kind} of {sandbox_id} kept changing; delete not confirmed")
