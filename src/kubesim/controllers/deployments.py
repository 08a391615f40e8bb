"""The Deployment controller: one ReplicaSet per pod template (named ``<deployment>-<hash>``,
labelled ``pod-template-hash``), rolled according to the strategy (``rollout.plan``), old
ReplicaSets kept up to ``revisionHistoryLimit``, and the status ``kubectl rollout status`` waits on.
"""

from __future__ import annotations

from typing import Any

from kubesim.controllers import client as kc
from kubesim.controllers import objects as o
from kubesim.controllers import rollout
from kubesim.controllers.informer import Informer, Key
from kubesim.controllers.replicasets import POD_BY_OWNER
from kubesim.controllers.workqueue import WorkQueue
from kubesim.timing import Timing

Obj = dict[str, Any]
RS_BY_OWNER = "replicaset-by-controller-uid"


def _revision(rs: Obj) -> int:
    try:
        return int(o.annotations_of(rs).get(rollout.REVISION, "0"))
    except ValueError:
        return 0


class DeploymentController:
    """Reconciles Deployments into ReplicaSets."""

    def __init__(
        self, api: kc.KubeClient, *, deployments: Informer, replicasets: Informer, pods: Informer, timing: Timing
    ) -> None:
        self._api = api
        self._deployments = deployments
        self._replicasets = replicasets
        self._pods = pods
        self.queue: WorkQueue[Key] = WorkQueue("deployment", self.reconcile, workers=2, delay=timing.reconcile_delay)
        replicasets.add_index(RS_BY_OWNER, o.controller_uid)
        deployments.add_handler(self._on_deployment)
        replicasets.add_handler(self._on_replicaset)
        pods.add_handler(self._on_pod)

    def _on_deployment(self, etype: str, obj: Obj, old: Obj | None) -> None:
        if etype != "DELETED":
            self.queue.add((o.namespace_of(obj), o.name_of(obj)))

    def _on_replicaset(self, etype: str, obj: Obj, old: Obj | None) -> None:
        ref = o.controller_ref(obj)
        if ref is not None and ref.get("kind") == "Deployment":
            self.queue.add((o.namespace_of(obj), str(ref["name"])))

    def _on_pod(self, etype: str, obj: Obj, old: Obj | None) -> None:
        # Recreate waits for the old pods to be gone: their deletion must wake the Deployment.
        if etype != "DELETED":
            return
        ref = o.controller_ref(obj)
        if ref is None or ref.get("kind") != "ReplicaSet":
            return
        rs = self._replicasets.get(o.namespace_of(obj), str(ref["name"]))
        if rs is not None:
            self._on_replicaset("MODIFIED", rs, None)

    async def reconcile(self, key: Key) -> float | None:
        deployment = self._deployments.get(*key)
        if deployment is None or o.is_deleting(deployment):
            return None
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment", **deployment}
        owned = sorted(
            self._replicasets.by_index(RS_BY_OWNER, o.uid_of(deployment)),
            key=lambda rs: (_revision(rs), str(rs["metadata"].get("creationTimestamp", ""))),
        )
        template = (deployment.get("spec") or {}).get("template") or {}
        digest = rollout.template_hash(template)
        new = next((rs for rs in owned if o.labels_of(rs).get(rollout.POD_TEMPLATE_HASH) == digest), None)
        old = [rs for rs in owned if rs is not new]
        if new is None:
            revision = max((_revision(rs) for rs in owned), default=0) + 1
            await self._create_replica_set(deployment, template, digest, revision)
            return None  # its ADDED event brings us back
        old_pods = sum(len(self._pods.by_index(POD_BY_OWNER, o.uid_of(rs))) for rs in old)
        step = rollout.plan(deployment, new, old, old_pods=old_pods)
        for name, replicas in step.scale.items():
            await self._scale(o.namespace_of(deployment), name, replicas)
        await self._prune_history(deployment, old)
        await self._write_status(deployment, new, owned)
        return None

    async def _create_replica_set(self, deployment: Obj, template: Obj, digest: str, revision: int) -> None:
        ns, name = o.namespace_of(deployment), o.name_of(deployment)
        spec = deployment.get("spec") or {}
        pod_template = o.deep(template)
        pod_labels = pod_template.setdefault("metadata", {}).setdefault("labels", {})
        pod_labels[rollout.POD_TEMPLATE_HASH] = digest
        selector = o.deep(spec.get("selector") or {})
        selector.setdefault("matchLabels", {})[rollout.POD_TEMPLATE_HASH] = digest
        body: Obj = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"{name}-{digest}",
                "namespace": ns,
                "labels": dict(pod_labels),
                "annotations": {
                    rollout.REVISION: str(revision),
                    "deployment.kubernetes.io/desired-replicas": str(spec.get("replicas", 1)),
                },
                "ownerReferences": [o.owner_reference(deployment)],
            },
            "spec": {"replicas": 0, "selector": selector, "template": pod_template},
        }
        try:
            await self._api.create(kc.REPLICASETS, ns, body)
        except kc.ApiError as exc:
            if not exc.already_exists:
                raise
        if o.annotations_of(deployment).get(rollout.REVISION) != str(revision):
            patch = {"metadata": {"annotations": {rollout.REVISION: str(revision)}}}
            await self._api.patch(kc.DEPLOYMENTS, ns, name, patch)

    async def _scale(self, ns: str, name: str, replicas: int) -> None:
        try:
            await self._api.patch(kc.REPLICASETS, ns, name, {"spec": {"replicas": replicas}})
        except kc.ApiError as exc:
            if not exc.not_found:
                raise

    async def _prune_history(self, deployment: Obj, old: list[Obj]) -> None:
        limit = int((deployment.get("spec") or {}).get("revisionHistoryLimit", 10))
        idle = [rs for rs in old if rollout.replicas_of(rs) == 0 and not (rs.get("status") or {}).get("replicas")]
        for rs in idle[: max(len(idle) - limit, 0)]:
            try:
                await self._api.delete(kc.REPLICASETS, o.namespace_of(rs), o.name_of(rs), uid=o.uid_of(rs))
            except kc.ApiError as exc:
                if not (exc.not_found or exc.conflict):
                    raise

    async def _write_status(self, deployment: Obj, new: Obj, owned: list[Obj]) -> None:
        current = deployment.get("status") or {}
        wanted = rollout.status(deployment, new, owned, now=o.rfc3339(o.now()))
        if wanted == current:
            return
        try:
            await self._api.update(kc.DEPLOYMENTS, {**deployment, "status": wanted}, sub="status")
        except kc.ApiError as exc:
            if exc.conflict:
                self.queue.add_after((o.namespace_of(deployment), o.name_of(deployment)), 0.05)
            elif not exc.not_found:
                raise
