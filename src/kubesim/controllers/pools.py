"""Pure decisions of the SandboxWarmPool controller (notes §10): the shape of a warm Sandbox, which
members are active, stale or surplus, how many to create, and the pool's status."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from typing import Any, NamedTuple

from kubesim.controllers import labels as L
from kubesim.controllers import objects as o
from kubesim.controllers.hashing import json_hash, name_hash

Obj = dict[str, Any]

#: Upstream creates at most this many Sandboxes per reconcile round.
MAX_BATCH = 300


def blueprint(template: Obj) -> Obj:
    """The ``SandboxBlueprint`` part of a template spec (what a Sandbox spec is copied from)."""
    spec = template.get("spec", {})
    out: Obj = {"podTemplate": o.deep(spec.get("podTemplate") or {})}
    if spec.get("volumeClaimTemplates"):
        out["volumeClaimTemplates"] = o.deep(spec["volumeClaimTemplates"])
    if spec.get("service") is not None:
        out["service"] = spec["service"]
    return out


#: Template hashes by the template object they were computed from (kept with it, so its id is not
#: reused): an informer's cached object is never edited, and every claim checks each of its pool's
#: members against its template (30 members: 60 hashes of the template's JSON a byte at a time, over
#: half of kubesim's busy samples under warm creates before they were kept).
_TEMPLATE_HASHES: dict[int, tuple[Obj, tuple[str, str]]] = {}
_TEMPLATE_HASHES_KEPT = 256


def template_hashes(template: Obj) -> tuple[str, str]:
    """(pod-template hash, blueprint hash) — opaque, compared only for equality."""
    found = _TEMPLATE_HASHES.get(id(template))
    if found is not None and found[0] is template:
        return found[1]
    bp = blueprint(template)
    hashes = json_hash(bp["podTemplate"]), json_hash(bp)
    if len(_TEMPLATE_HASHES) >= _TEMPLATE_HASHES_KEPT:
        _TEMPLATE_HASHES.clear()
    _TEMPLATE_HASHES[id(template)] = (template, hashes)
    return hashes


def apply_secure_defaults(pod_spec: Obj, template: Obj) -> None:
    """``ApplySandboxSecureDefaults`` (notes §4), in place."""
    tspec = template.get("spec", {})
    if "automountServiceAccountToken" not in pod_spec:
        pod_spec["automountServiceAccountToken"] = False
    managed = (tspec.get("networkPolicyManagement") or "Managed") == "Managed"
    if managed and tspec.get("networkPolicy") is None and not pod_spec.get("dnsPolicy"):
        pod_spec["dnsPolicy"] = "None"
        pod_spec["dnsConfig"] = {"nameservers": ["8.8.8.8", "1.1.1.1"]}


def build_warm_sandbox(pool: Obj, template: Obj) -> Obj:
    """``buildSandboxCR``: a pool-owned Sandbox (notes §10.2), with ``generateName: <pool>-``."""
    pod_hash, bp_hash = template_hashes(template)
    pool_name, tname = o.name_of(pool), o.name_of(template)
    hash_labels = {
        L.WARM_POOL_SANDBOX: name_hash(pool_name),
        L.TEMPLATE_REF_HASH: name_hash(tname),
        L.POD_TEMPLATE_HASH: pod_hash,
        L.TEMPLATE_HASH: bp_hash,
    }
    spec = blueprint(template)
    ptmeta = spec["podTemplate"].setdefault("metadata", {})
    ptmeta["labels"] = {**(ptmeta.get("labels") or {}), **hash_labels}
    annos = dict(ptmeta.get("annotations") or {})
    annos.setdefault(L.SAFE_TO_EVICT, "true")
    ptmeta["annotations"] = annos
    apply_secure_defaults(spec["podTemplate"].setdefault("spec", {}), template)
    return {
        "apiVersion": L.SANDBOX_API_VERSION,
        "kind": "Sandbox",
        "metadata": {
            "generateName": f"{pool_name}-",
            "namespace": o.namespace_of(pool),
            "labels": {**hash_labels, L.LAUNCH_TYPE: "warm", L.CREATED_BY: "controller"},
            "annotations": {L.TEMPLATE_REF_ANNOTATION: tname},
            "ownerReferences": [o.owner_reference(pool)],
        },
        "spec": spec,
    }


def _semantic(spec: Obj) -> str:
    pod_spec = (spec.get("podTemplate") or {}).get("spec") or {}
    return json_hash([pod_spec, spec.get("volumeClaimTemplates") or [], spec.get("service")])


def is_stale(sandbox: Obj, template: Obj) -> bool:
    """A member no longer matches the template; metadata-only template edits never count."""
    sb_labels = o.labels_of(sandbox)
    if sb_labels.get(L.TEMPLATE_REF_HASH) != name_hash(o.name_of(template)):
        return True
    _, bp_hash = template_hashes(template)
    if sb_labels.get(L.TEMPLATE_HASH) == bp_hash:
        return False
    want = blueprint(template)
    apply_secure_defaults(want["podTemplate"].setdefault("spec", {}), template)
    return _semantic(sandbox.get("spec") or {}) != _semantic(want)


@dataclasses.dataclass(frozen=True)
class PoolPlan:
    """What one reconcile of a pool should do."""

    create: int
    delete: list[Obj]
    status: Obj
    #: Seconds until a not-Ready member reaches the readiness grace period (then it is replaced).
    recheck_in: float | None = None


class MemberFacts(NamedTuple):
    """What ``plan_pool`` reads of a member Sandbox."""

    controller_uid: object  # None when it has no controller
    deleting: bool
    ready: bool
    created: datetime.datetime | None


def member_facts(member: Obj) -> MemberFacts:
    """``member``'s facts, read from the object."""
    ref = o.controller_ref(member)
    return MemberFacts(
        ref.get("uid") if ref is not None else None,
        o.is_deleting(member),
        o.condition_true(member, "Ready"),
        o.parse_time(member.get("metadata", {}).get("creationTimestamp")),
    )


def plan_pool(
    pool: Obj,
    members: list[Obj],
    template: Obj | None,
    *,
    unobserved: int,
    now: datetime.datetime | None = None,
    readiness_grace: float = 300.0,
    facts: Callable[[Obj], MemberFacts] = member_facts,
) -> PoolPlan:
    """Decide creates/deletes for ``pool`` from the Sandboxes carrying its label.

    ``unobserved`` counts creates/deletes this controller issued that the watch has not shown yet;
    while any are outstanding nothing new is created or deleted (the expectations gate that
    prevents over-creation, upstream #1215). ``facts`` reads a member's facts (the controller
    keeps them per member version: a plan reads every member, and a pool of hundreds is planned
    several times per warm claim).
    """
    pool_uid = o.uid_of(pool)
    owned = [(m, f) for m in members if (f := facts(m)).controller_uid == pool_uid]
    terminating = sum(1 for _, f in owned if f.deleting)
    active = [(m, f) for m, f in owned if not f.deleting]
    delete: list[Obj] = []
    strategy = (pool.get("spec", {}).get("updateStrategy") or {}).get("type") or "OnReplenish"
    if template is not None and strategy == "Recreate":
        stale = {id(m) for m, _ in active if is_stale(m, template)}
        delete.extend(m for m, _ in active if id(m) in stale)
        active = [(m, f) for m, f in active if id(m) not in stale]
    recheck_in: float | None = None
    if now is not None:
        # Members stuck not-Ready past the grace period are replaced (kubesim's scheduler never
        # leaves a pod Unschedulable, so upstream's "hold" case does not arise).
        expired: set[int] = set()
        for member, fact in active:
            if fact.ready or fact.created is None:
                continue
            left = readiness_grace - (now - fact.created).total_seconds()
            if left <= 0:
                delete.append(member)
                expired.add(id(member))
            else:
                recheck_in = left if recheck_in is None else min(recheck_in, left)
        active = [(m, f) for m, f in active if id(m) not in expired]
    desired = int(pool.get("spec", {}).get("replicas", 1))
    create = 0
    if unobserved == 0:
        deficit = desired - len(active) - terminating
        if deficit > 0 and template is not None:
            create = min(deficit, MAX_BATCH)
        elif len(active) > desired:
            delete.extend(_surplus([m for m, _ in active], len(active) - desired))
    doomed = {id(m) for m in delete}
    kept = [(m, f) for m, f in active if id(m) not in doomed]
    status = pool_status(pool, len(kept), sum(1 for _, f in kept if f.ready))
    return PoolPlan(create=create, delete=delete, status=status, recheck_in=recheck_in)


def _surplus(active: list[Obj], count: int) -> list[Obj]:
    """Scale down: not-Ready members first, then the newest."""

    def key(m: Obj) -> tuple[int, str]:
        ready = o.condition_true(m, "Ready")
        created = str(m.get("metadata", {}).get("creationTimestamp") or "")
        return (1 if ready else 0, _invert(created))

    return sorted(active, key=key)[:count]


def _invert(text: str) -> str:
    # Newest first within a readiness class: sort on the timestamp inverted character by character.
    return "".join(chr(0x10FFFF - ord(c)) for c in text)


def pool_status(pool: Obj, replicas: int, ready: int) -> Obj:
    """The pool's status with ``replicas`` active members, ``ready`` of them Ready."""
    return {
        "replicas": replicas,
        "readyReplicas": ready,
        "selector": f"{L.WARM_POOL_SANDBOX}={name_hash(o.name_of(pool))}",
        "observedGeneration": int(pool.get("metadata", {}).get("generation") or 0),
    }
