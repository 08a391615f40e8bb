"""DELETE semantics: preconditions, graceful pod deletion, finalizers and propagation policies.

An object with finalizers (or a scheduled pod with a grace period, or a namespace) only gets a
``deletionTimestamp``; it disappears when the last finalizer is removed (``Rest._commit``) or, for
pods, when deleted again with ``gracePeriodSeconds=0`` (what a kubelet does). ``Foreground`` and
``Orphan`` add the ``foregroundDeletion``/``orphan`` finalizers that the garbage collector
(``gc``) resolves, as upstream.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubesim.apiserver import errors
from kubesim.apiserver.resources import ResourceType
from kubesim.apiserver.rest import Rest, Result
from kubesim.apiserver.store import Stored

FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
# Kinds whose DELETE answers with the deleted object rather than a Status (ReturnDeletedObject).
_RETURNS_OBJECT = {("", "pods"), ("", "namespaces")}


@dataclass
class DeleteOptions:
    """The parts of metav1.DeleteOptions (body or query) that change behaviour."""

    propagation: str | None = None
    grace_seconds: int | None = None
    uid: str | None = None
    resource_version: str | None = None
    dry_run: bool = False

    @classmethod
    def parse(cls, body: Any, query: dict[str, str], dry_run: bool) -> DeleteOptions:
        """Merge a DeleteOptions body with query parameters (the body wins)."""
        body = body if isinstance(body, dict) else {}
        pre = body.get("preconditions") or {}
        grace = body.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        propagation = body.get("propagationPolicy") or query.get("propagationPolicy")
        orphan = body.get("orphanDependents", query.get("orphanDependents"))
        if propagation is None and orphan is not None:
            propagation = "Orphan" if str(orphan).lower() == "true" else "Background"
        if propagation not in (None, "Background", "Foreground", "Orphan"):
            raise errors.ApiError(
                422,
                "Invalid",
                f'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: '
                f'"{propagation}": supported values: "Foreground", "Background", "Orphan", "nil"',
            )
        return cls(
            propagation=propagation,
            grace_seconds=int(grace) if grace is not None else None,
            uid=pre.get("uid"),
            resource_version=pre.get("resourceVersion"),
            dry_run=dry_run or "All" in (body.get("dryRun") or []),
        )


def _timestamp(offset: int) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod_grace(obj: dict[str, Any], requested: int | None) -> int:
    spec = obj.get("spec") or {}
    phase = (obj.get("status") or {}).get("phase")
    # Unscheduled and finished pods have no kubelet to wait for, so they go at once (pod strategy).
    if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
        return 0
    grace = requested if requested is not None else spec.get("terminationGracePeriodSeconds", 30)
    return max(int(grace), 0)


def delete(rest: Rest, rt: ResourceType, version: str, ns: str, name: str, opts: DeleteOptions) -> Result:
    """DELETE one object."""
    cur = rest.get(rt, ns, name)
    m = cur.obj["metadata"]
    if opts.uid is not None and opts.uid != m["uid"]:
        raise errors.conflict(
            rt.plural,
            rt.group,
            name,
            f"Precondition failed: UID in precondition: {opts.uid}, UID in object meta: {m['uid']}",
        )
    if opts.resource_version is not None and opts.resource_version != m["resourceVersion"]:
        raise errors.conflict(
            rt.plural,
            rt.group,
            name,
            f"Precondition failed: ResourceVersion in precondition: {opts.resource_version}, "
            f"ResourceVersion in object meta: {m['resourceVersion']}",
        )
    av = rt.api_version(version)
    grace = _pod_grace(cur.obj, opts.grace_seconds) if rt.key == ("", "pods") else 0
    finalizers = list(m.get("finalizers") or [])
    if opts.propagation == "Foreground" and FOREGROUND not in finalizers:
        finalizers.append(FOREGROUND)
    if opts.propagation == "Orphan" and ORPHAN not in finalizers:
        finalizers.append(ORPHAN)
    namespace = rt.key == ("", "namespaces")
    if m.get("deletionTimestamp"):
        # Already terminating: only a shorter grace period (a kubelet's 0) moves things along.
        if grace == 0 and m.get("deletionGracePeriodSeconds"):
            if not m.get("finalizers"):
                return _remove(rest, rt, cur, av, opts)
            return _shorten_grace(rest, rt, cur, av, opts)
        return Result(cur.view(av), 202 if opts.propagation == "Foreground" else 200)
    if finalizers or grace > 0 or namespace:
        new = cur.copy()
        nm = new["metadata"]
        nm["deletionTimestamp"] = _timestamp(grace)
        nm["deletionGracePeriodSeconds"] = grace
        if finalizers:
            nm["finalizers"] = finalizers
        if namespace:
            new.setdefault("status", {})["phase"] = "Terminating"
        if opts.dry_run:
            return Result(new, 200)
        nm["resourceVersion"] = str(rest.store.next_rv())
        stored = rest.store.put(rt.group, rt.plural, new, cur)
        # Only the server's metadata (and a namespace's phase) changed: what admitted the object
        # admits this version too, so the writes of its termination need not walk it whole again.
        stored.admitted_by = cur.admitted_by
        return Result(stored.view(av), 202 if opts.propagation == "Foreground" else 200)
    return _remove(rest, rt, cur, av, opts)


def _shorten_grace(rest: Rest, rt: ResourceType, cur: Stored, av: str, opts: DeleteOptions) -> Result:
    # Finalizers still hold the object; with grace 0 it goes as soon as the last one is removed.
    new = cur.copy()
    new["metadata"]["deletionGracePeriodSeconds"] = 0
    new["metadata"]["deletionTimestamp"] = _timestamp(0)
    if opts.dry_run:
        return Result(new, 200)
    new["metadata"]["resourceVersion"] = str(rest.store.next_rv())
    stored = rest.store.put(rt.group, rt.plural, new, cur)
    stored.admitted_by = cur.admitted_by  # as in `delete`: only the server's metadata changed
    return Result(stored.view(av), 200)


def _remove(rest: Rest, rt: ResourceType, cur: Stored, av: str, opts: DeleteOptions) -> Result:
    if opts.dry_run:
        return Result(cur.view(av), 200)
    gone = rest.store.delete(rt.group, rt.plural, cur)
    rest.after_delete(rt, gone)
    if rt.custom or rt.key in _RETURNS_OBJECT:
        return Result(gone.view(av), 200)
    m = gone.obj["metadata"]
    details = {"name": m["name"], "kind": rt.plural, "uid": m["uid"]}
    if rt.group:
        details["group"] = rt.group
    return Result(
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details},
        200,
    )


def delete_collection(
    rest: Rest, rt: ResourceType, version: str, ns: str | None, matching: list[Stored], opts: DeleteOptions
) -> Result:
    """DELETE on a collection: delete each selected object, answer with the list of them."""
    items = []
    for stored in matching:
        m = stored.obj["metadata"]
        try:
            result = delete(rest, rt, version, m.get("namespace", ""), m["name"], opts)
        except errors.ApiError as exc:
            if exc.code == 404:
                continue
            raise
        if result.obj.get("kind") != "Status":
            items.append(result.obj)
    return Result(
        {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version(version),
            "metadata": {"resourceVersion": str(rest.store.rv)},
            "items": items,
        },
        200,
    )
