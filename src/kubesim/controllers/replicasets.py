"""The ReplicaSet controller: keep ``spec.replicas`` live pods from the template, owned by the
ReplicaSet, and report how many are ready and available (what the Deployment controller and
``kubectl get rs`` read). Pods it creates are named ``<replicaset>-<random>`` (generateName).
"""

from __future__ import annotations

from typing import Any

from kubesim.controllers import client as kc
from kubesim.controllers import objects as o
from kubesim.controllers.informer import Informer, Key
from kubesim.controllers.workqueue import WorkQueue
from kubesim.timing import Timing

Obj = dict[str, Any]
POD_BY_OWNER = "pod-by-controller-uid"
# Pods created or deleted per reconcile, as upstream's slow-start batches bound a burst.
BURST = 10


def is_active(pod: Obj) -> bool:
    """Counted toward replicas: not being deleted, not finished."""
    phase = (pod.get("status") or {}).get("phase")
    return not o.is_deleting(pod) and phase not in ("Succeeded", "Failed")


def is_ready(pod: Obj) -> bool:
    return o.get_condition((pod.get("status") or {}).get("conditions"), "Ready") is not None and o.condition_true(
        pod, "Ready"
    )


def deletion_order(pods: list[Obj]) -> list[Obj]:
    """Which pods to delete first when scaling down: unscheduled, then pending, then not ready,
    then the newest (upstream's ActivePods ranking, simplified)."""

    def rank(pod: Obj) -> tuple[int, int, int, str]:
        status = pod.get("status") or {}
        return (
            0 if not (pod.get("spec") or {}).get("nodeName") else 1,
            0 if status.get("phase") == "Pending" else 1,
            1 if is_ready(pod) else 0,
            "".join(chr(0x10FFFF - ord(c)) for c in str(pod["metadata"].get("creationTimestamp", ""))),
        )

    return sorted(pods, key=rank)


def replica_set_status(rs: Obj, pods: list[Obj]) -> Obj:
    """``status`` of a ReplicaSet from its active pods."""
    labels = ((rs.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}
    active = [p for p in pods if is_active(p)]
    ready = sum(1 for p in active if is_ready(p))
    status: Obj = {
        "replicas": len(active),
        "fullyLabeledReplicas": sum(1 for p in active if labels.items() <= o.labels_of(p).items()),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "observedGeneration": int(rs["metadata"].get("generation") or 1),
    }
    return {k: v for k, v in status.items() if v or k in ("replicas", "observedGeneration")}


class ReplicaSetController:
    """Reconciles ReplicaSets against the pods they control."""

    def __init__(self, api: kc.KubeClient, *, replicasets: Informer, pods: Informer, timing: Timing) -> None:
        self._api = api
        self._replicasets = replicasets
        self._pods = pods
        self.queue: WorkQueue[Key] = WorkQueue("replicaset", self.reconcile, workers=2, delay=timing.reconcile_delay)
        pods.add_index(POD_BY_OWNER, o.controller_uid)
        replicasets.add_handler(self._on_replicaset)
        pods.add_handler(self._on_pod)

    def _on_replicaset(self, etype: str, obj: Obj, old: Obj | None) -> None:
        if etype != "DELETED":
            self.queue.add((o.namespace_of(obj), o.name_of(obj)))

    def _on_pod(self, etype: str, obj: Obj, old: Obj | None) -> None:
        ref = o.controller_ref(obj)
        if ref is not None and ref.get("kind") == "ReplicaSet":
            self.queue.add((o.namespace_of(obj), str(ref["name"])))

    async def reconcile(self, key: Key) -> float | None:
        rs = self._replicasets.get(*key)
        if rs is None or o.is_deleting(rs):
            return None
        pods = self._pods.by_index(POD_BY_OWNER, o.uid_of(rs))
        active = [p for p in pods if is_active(p)]
        desired = int((rs.get("spec") or {}).get("replicas") or 0)
        again: float | None = None
        if len(active) < desired:
            missing = desired - len(active)
            for _ in range(min(missing, BURST)):
                await self._create_pod(rs)
            again = 0.0 if missing > BURST else None
        elif len(active) > desired:
            for pod in deletion_order(active)[: min(len(active) - desired, BURST)]:
                await self._delete(pod)
        status = replica_set_status(rs, pods)
        if status != rs.get("status"):
            try:
                await self._api.update(kc.REPLICASETS, {**rs, "status": status}, sub="status")
            except kc.ApiError as exc:
                if exc.conflict:
                    return 0.05  # the informer is behind: try again with the newer object
                if not exc.not_found:
                    raise
        return again

    async def _create_pod(self, rs: Obj) -> None:
        template = o.deep((rs.get("spec") or {}).get("template") or {})
        meta = template.get("metadata") or {}
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{o.name_of(rs)}-",
                "namespace": o.namespace_of(rs),
                "labels": meta.get("labels") or {},
                "annotations": meta.get("annotations") or {},
                "ownerReferences": [o.owner_reference({"apiVersion": "apps/v1", "kind": "ReplicaSet", **rs})],
            },
            "spec": template.get("spec") or {},
        }
        try:
            await self._api.create(kc.PODS, o.namespace_of(rs), body)
        except kc.ApiError as exc:
            if not exc.not_found:  # the namespace is going away
                raise

    async def _delete(self, pod: Obj) -> None:
        try:
            await self._api.delete(kc.PODS, o.namespace_of(pod), o.name_of(pod), uid=o.uid_of(pod))
        except kc.ApiError as exc:
            if not (exc.not_found or exc.conflict):
                raise
