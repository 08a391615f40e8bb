"""Pure decisions of the Deployment controller: the pod-template hash, how far a rollout may scale
the new and old ReplicaSets this step, and the status and conditions ``kubectl rollout status``
reads. The controller (``deployments``) only feeds these the cached objects and writes the answers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from kubesim.controllers.hashing import fnv1a_32

Obj = dict[str, Any]
POD_TEMPLATE_HASH = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
# rand.SafeEncodeString's alphabet: no vowels (no words), no look-alike characters.
_ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"


def template_hash(template: Obj) -> str:
    """The ``pod-template-hash`` of a pod template: FNV-1a of its canonical JSON, safe-encoded as
    upstream encodes its hash (so names look like ``gateway-7d9c5b8f4``)."""
    clean = json.loads(json.dumps(template))
    labels = (clean.get("metadata") or {}).get("labels") or {}
    labels.pop(POD_TEMPLATE_HASH, None)
    digits = str(fnv1a_32(json.dumps(clean, sort_keys=True, separators=(",", ":")).encode()))
    return "".join(_ALPHANUMS[ord(c) % len(_ALPHANUMS)] for c in digits)


def resolve(value: Any, total: int, *, round_up: bool) -> int:
    """An IntOrString against ``total``: ``3`` → 3, ``"25%"`` of 4 → 1 (rounded as asked)."""
    if isinstance(value, int):
        return value
    text = str(value or "0")
    if text.endswith("%"):
        scaled = int(text[:-1]) * total / 100
        return math.ceil(scaled) if round_up else math.floor(scaled)
    return int(text)


def replicas_of(rs: Obj) -> int:
    return int((rs.get("spec") or {}).get("replicas") or 0)


def available_of(rs: Obj) -> int:
    return int((rs.get("status") or {}).get("availableReplicas") or 0)


def surge_and_unavailable(deployment: Obj) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) in pods; Recreate allows neither. Both zero is not allowed, so
    maxUnavailable becomes 1 then, as upstream."""
    spec = deployment.get("spec") or {}
    desired = int(spec.get("replicas", 1))
    strategy = spec.get("strategy") or {}
    if strategy.get("type") == "Recreate":
        return 0, 0
    rolling = strategy.get("rollingUpdate") or {}
    surge = resolve(rolling.get("maxSurge", "25%"), desired, round_up=True)
    unavailable = resolve(rolling.get("maxUnavailable", "25%"), desired, round_up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, min(unavailable, desired)


def _name(rs: Obj) -> str:
    return str(rs["metadata"]["name"])


@dataclass
class Step:
    """Replica counts to write this reconcile: ReplicaSet name → spec.replicas."""

    scale: dict[str, int]
    waiting_for_old_pods: bool = False


def plan(deployment: Obj, new: Obj, old: list[Obj], *, old_pods: int) -> Step:
    """One step of the rollout. ``old`` ReplicaSets oldest first; ``old_pods`` counts pods of
    the old ReplicaSets that still exist (Recreate waits for them to be gone)."""
    spec = deployment.get("spec") or {}
    desired = int(spec.get("replicas", 1))
    scale: dict[str, int] = {}
    if (spec.get("strategy") or {}).get("type") == "Recreate":
        for rs in old:
            if replicas_of(rs) > 0:
                scale[_name(rs)] = 0
        if scale or old_pods > 0:
            return Step(scale, waiting_for_old_pods=not scale)
        if replicas_of(new) != desired:
            scale[_name(new)] = desired
        return Step(scale)
    surge, unavailable = surge_and_unavailable(deployment)
    everything = [new, *old]
    total = sum(replicas_of(rs) for rs in everything)
    new_count = replicas_of(new)
    if new_count > desired:
        new_count = desired
    elif new_count < desired:
        room = desired + surge - total
        if room > 0:
            new_count = min(desired, new_count + room)
    if new_count != replicas_of(new):
        scale[_name(new)] = new_count
    # Scale old ReplicaSets down only as far as availability allows (after the scale-up above).
    all_pods = total - replicas_of(new) + new_count
    min_available = desired - unavailable
    new_unavailable = max(new_count - available_of(new), 0)
    budget = all_pods - min_available - new_unavailable
    for rs in old:
        if budget <= 0:
            break
        count = replicas_of(rs)
        if count == 0:
            continue
        down = min(count, budget)
        scale[_name(rs)] = count - down
        budget -= down
    return Step(scale)


def _condition(ctype: str, status: str, reason: str, message: str, now: str, old: list[Obj]) -> Obj:
    previous = next((c for c in old if c.get("type") == ctype), None)
    same = previous is not None and previous.get("status") == status
    transition = previous.get("lastTransitionTime", now) if same and previous is not None else now
    update = previous.get("lastUpdateTime", now) if same and previous and previous.get("reason") == reason else now
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastUpdateTime": update,
        "lastTransitionTime": transition,
    }


def status(deployment: Obj, new: Obj | None, replica_sets: list[Obj], *, now: str) -> Obj:
    """The Deployment's status from its ReplicaSets' (what ``kubectl rollout status`` compares)."""
    spec = deployment.get("spec") or {}
    desired = int(spec.get("replicas", 1))
    total = sum(int((rs.get("status") or {}).get("replicas") or 0) for rs in replica_sets)
    ready = sum(int((rs.get("status") or {}).get("readyReplicas") or 0) for rs in replica_sets)
    available = sum(available_of(rs) for rs in replica_sets)
    updated = int((new.get("status") or {}).get("replicas") or 0) if new else 0
    _, unavailable = surge_and_unavailable(deployment)
    old_conditions = list((deployment.get("status") or {}).get("conditions") or [])
    if available >= desired - unavailable:
        avail = _condition(
            "Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability.", now, old_conditions
        )
    else:
        avail = _condition(
            "Available",
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
            now,
            old_conditions,
        )
    new_name = new["metadata"]["name"] if new else ""
    new_status = (new or {}).get("status") or {}
    complete = (
        new is not None
        and updated == desired
        and total == desired
        and available_of(new) == desired
        and int(new_status.get("observedGeneration") or 0) >= int(new["metadata"].get("generation") or 0)
    )
    if complete:
        reason, message = "NewReplicaSetAvailable", f'ReplicaSet "{new_name}" has successfully progressed.'
    else:
        reason, message = "ReplicaSetUpdated", f'ReplicaSet "{new_name}" is progressing.'
    progressing = _condition("Progressing", "True", reason, message, now, old_conditions)
    out: Obj = {
        "observedGeneration": int(deployment["metadata"].get("generation") or 1),
        "replicas": total,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": available,
        "conditions": [avail, progressing],
    }
    if desired - available > 0:
        out["unavailableReplicas"] = desired - available
    return {k: v for k, v in out.items() if v != 0 or k == "observedGeneration"}
