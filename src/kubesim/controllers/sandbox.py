"""The Sandbox controller: keep one Pod (and optionally a headless Service) per Sandbox and report
its state in the Sandbox status (notes §8). Decisions are in ``rendering`` and ``conditions``."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from kubesim.controllers import client as kc
from kubesim.controllers import conditions, rendering
from kubesim.controllers import labels as L
from kubesim.controllers import objects as o
from kubesim.controllers.events import Recorder
from kubesim.controllers.hashing import name_hash
from kubesim.controllers.informer import Informer, Key
from kubesim.controllers.workqueue import WorkQueue
from kubesim.timing import Timing

Obj = dict[str, Any]
log = logging.getLogger(__name__)


class SandboxController:
    def __init__(
        self,
        api: kc.KubeClient,
        *,
        sandboxes: Informer,
        pods: Informer,
        services: Informer,
        timing: Timing,
        events: Recorder,
        workers: int = 100,
    ) -> None:
        self._api = api
        self.events = events
        self._sandboxes = sandboxes
        self._pods = pods
        self._services = services
        self._timing = timing
        self.queue: WorkQueue[Key] = WorkQueue("sandbox", self.reconcile, workers=workers, delay=timing.reconcile_delay)
        self._own = o.OwnWrites()
        pods.add_index(POD_BY_NAME_HASH, _pod_name_hash)
        sandboxes.add_handler(self._on_sandbox)
        pods.add_handler(self._on_owned)
        services.add_handler(self._on_owned)

    def _on_sandbox(self, etype: str, obj: Obj, old: Obj | None) -> None:
        if etype == "DELETED":
            self._own.forget(o.uid_of(obj))
        elif not self._own.is_echo(obj):
            # Our own status writes (~5 per warm claim) come back as events: each a reconcile
            # that would recompute the status it just wrote.
            self.queue.add((o.namespace_of(obj), o.name_of(obj)))

    def _on_owned(self, etype: str, obj: Obj, old: Obj | None) -> None:
        for item in (obj, old):
            ref = o.controller_ref(item) if item else None
            if ref and ref.get("kind") == "Sandbox" and item is not None:
                self.queue.add((o.namespace_of(item), str(ref["name"])))

    def _owned_pods(self, sandbox: Obj) -> list[Obj]:
        value = f"{o.namespace_of(sandbox)}/{name_hash(o.name_of(sandbox))}"
        uid = o.uid_of(sandbox)
        return [p for p in self._pods.by_index(POD_BY_NAME_HASH, value) if o.is_controlled_by(p, uid)]

    async def reconcile(self, key: Key) -> float | None:
        ns, name = key
        sandbox = self._sandboxes.get(ns, name)
        if sandbox is None or o.is_deleting(sandbox) or self._own.is_stale(sandbox):
            return None
        spec = sandbox.get("spec", {})
        shutdown = o.parse_time(spec.get("shutdownTime"))
        at = o.now()
        if shutdown is not None and at >= shutdown:
            await self._expire(sandbox)
            return None
        requeue = None
        if shutdown is not None:
            requeue = max((shutdown - at).total_seconds(), self._timing.expiry_requeue_floor)
        try:
            await self._reconcile_children(sandbox)
        except (kc.ApiError, RuntimeError) as exc:
            # Surface the failure on the Sandbox (upstream: Ready=False/ReconcilerError), then let
            # the work queue retry with backoff.
            ready = {
                "type": "Ready",
                "status": "False",
                "reason": "ReconcilerError",
                "message": f"Error seen: {exc}",
                "observedGeneration": int(sandbox["metadata"].get("generation") or 0),
            }
            owned = self._owned_pods(sandbox)
            with contextlib.suppress(kc.ApiError):
                await self._write_status(sandbox, owned[0] if len(owned) == 1 else None, ready_override=ready)
            raise
        return requeue

    async def _reconcile_children(self, sandbox: Obj) -> None:
        ns, name = o.namespace_of(sandbox), o.name_of(sandbox)
        owned = self._owned_pods(sandbox)
        if len(owned) > 1:
            names = sorted(o.name_of(p) for p in owned)
            message = f"multiple pods are owned by sandbox {name}: {names}"
            ready: Obj = {
                "type": "Ready",
                "status": "False",
                "reason": "MultiplePods",
                "message": message,
                "observedGeneration": int(sandbox["metadata"].get("generation") or 0),
            }
            await self._write_status(sandbox, None, ready_override=ready)
            self.events.record(
                sandbox, type_="Warning", reason="MultiplePods", action="Reconciling", note=ready["message"]
            )
            return
        pod = owned[0] if owned else None
        if pod is None and not spec_suspended(sandbox):
            pod = await self._adopt_pod(sandbox)
        annos = o.annotations_of(sandbox)
        if spec_suspended(sandbox):
            # Upstream reconciles the PVCs before the pod on every pass, whatever the mode: a
            # Sandbox created Suspended has its volumes, and a suspended one keeps them.
            await self._ensure_pvcs(sandbox)
            if pod is not None and not o.is_deleting(pod):
                await self._delete_ignoring_missing(kc.PODS, pod)
            if L.POD_NAME_ANNOTATION in annos:
                sandbox = await self._annotate_pod_name(sandbox, None)
        elif pod is not None:
            patch = rendering.pod_metadata_patch(sandbox, pod)
            if patch is not None:
                pod = await self._api.patch(kc.PODS, ns, o.name_of(pod), patch)
            if annos.get(L.POD_NAME_ANNOTATION) != o.name_of(pod):
                sandbox = await self._annotate_pod_name(sandbox, o.name_of(pod))
        else:
            await self._ensure_pvcs(sandbox)
            pod = await self._create_pod(sandbox)
            if annos.get(L.POD_NAME_ANNOTATION) != o.name_of(pod):
                sandbox = await self._annotate_pod_name(sandbox, o.name_of(pod))
        service_name = await self._reconcile_service(sandbox)
        await self._write_status(sandbox, pod, service_name=service_name)

    async def _adopt_pod(self, sandbox: Obj) -> Obj | None:
        """An unowned Pod with the Sandbox's pod name is adopted if it is labelled
        ``agents.x-k8s.io/adoptable=true`` or carries the Sandbox's name hash (upstream L1340)."""
        ns = o.namespace_of(sandbox)
        name = o.annotations_of(sandbox).get(L.POD_NAME_ANNOTATION) or o.name_of(sandbox)
        pod = self._pods.get(ns, name)
        if pod is None or o.controller_ref(pod) is not None or o.is_deleting(pod):
            return None
        pod_labels = o.labels_of(pod)
        if pod_labels.get(L.ADOPTABLE) != "true" and pod_labels.get(L.SANDBOX_NAME_HASH) != name_hash(
            o.name_of(sandbox)
        ):
            return None
        refs = [*(pod["metadata"].get("ownerReferences") or []), o.owner_reference(sandbox)]
        patch = {"metadata": {"resourceVersion": pod["metadata"]["resourceVersion"], "ownerReferences": refs}}
        adopted: Obj = await self._api.patch(kc.PODS, ns, name, patch)
        return adopted

    async def _ensure_pvcs(self, sandbox: Obj) -> None:
        """One PVC ``<vct>-<sandbox>`` per volumeClaimTemplate, owned by the Sandbox (kept on expiry)."""
        for pvc in rendering.render_pvcs(sandbox):
            try:
                await self._api.create(kc.PVCS, o.namespace_of(sandbox), pvc)
            except kc.ApiError as exc:
                if not exc.already_exists:
                    raise

    async def _create_pod(self, sandbox: Obj) -> Obj:
        ns = o.namespace_of(sandbox)
        try:
            return await self._api.create(kc.PODS, ns, rendering.render_pod(sandbox))
        except kc.ApiError as exc:
            if not exc.already_exists:
                raise
            # Our cache lags our own create: the Pod is there, treat it as the existing one.
            existing = await self._api.get(kc.PODS, ns, o.name_of(sandbox))
            if not o.is_controlled_by(existing, o.uid_of(sandbox)):
                raise RuntimeError(f"pod {o.name_of(existing)} exists and is not owned") from exc
            return existing

    async def _annotate_pod_name(self, sandbox: Obj, pod_name: str | None) -> Obj:
        patch = {"metadata": {"annotations": {L.POD_NAME_ANNOTATION: pod_name}}}
        written: Obj = await self._api.patch(kc.SANDBOXES, o.namespace_of(sandbox), o.name_of(sandbox), patch)
        self._own.record(written)
        return written

    async def _reconcile_service(self, sandbox: Obj) -> str | None:
        """Returns the name of the owned Service in use, if any."""
        ns, name = o.namespace_of(sandbox), o.name_of(sandbox)
        want = sandbox.get("spec", {}).get("service")
        svc = self._services.get(ns, name)
        owned = svc is not None and o.is_controlled_by(svc, o.uid_of(sandbox))
        if want is True and svc is None:
            try:
                await self._api.create(kc.SERVICES, ns, rendering.render_service(sandbox))
            except kc.ApiError as exc:
                if not exc.already_exists:
                    raise
            return name
        if want is False and svc is not None and owned:
            await self._delete_ignoring_missing(kc.SERVICES, svc)
            return None
        return name if owned else None

    async def _write_status(
        self,
        sandbox: Obj,
        pod: Obj | None,
        *,
        service_name: str | None = None,
        ready_override: Obj | None = None,
    ) -> None:
        required = sandbox.get("spec", {}).get("service") is True or (
            sandbox.get("spec", {}).get("service") is None and service_name is not None
        )
        new = conditions.sandbox_status(
            sandbox,
            pod,
            service_name=service_name,
            service_required=required,
            at=o.now(),
            ready_override=ready_override,
        )
        patch = conditions.status_patch(sandbox.get("status") or {}, new)
        if patch is not None:
            written = await self._api.patch(
                kc.SANDBOXES, o.namespace_of(sandbox), o.name_of(sandbox), patch, sub="status"
            )
            self._own.record(written)

    async def _expire(self, sandbox: Obj) -> None:
        """Ready=False/SandboxExpired first; on the next pass tear down (notes §8 step 3)."""
        ns, name = o.namespace_of(sandbox), o.name_of(sandbox)
        status = sandbox.get("status") or {}
        ready = o.get_condition(status.get("conditions"), "Ready")
        expired = {
            "type": "Ready",
            "status": "False",
            "reason": "SandboxExpired",
            "message": "Sandbox has expired",
            "observedGeneration": int(sandbox["metadata"].get("generation") or 0),
        }
        conds = o.set_condition(status.get("conditions") or [], expired, at=o.now())
        conds = o.remove_condition(conds, "PodScheduled")
        conds.sort(key=lambda c: str(c.get("type")))
        if ready is None or ready.get("reason") != "SandboxExpired":
            await self._api.patch(kc.SANDBOXES, ns, name, {"status": {"conditions": conds}}, sub="status")
            self.queue.add_after((ns, name), 0.001)
            return
        for pod in self._owned_pods(sandbox):
            await self._delete_ignoring_missing(kc.PODS, pod)
        svc = self._services.get(ns, name)
        if svc is not None and o.is_controlled_by(svc, o.uid_of(sandbox)):
            await self._delete_ignoring_missing(kc.SERVICES, svc)
        if sandbox.get("spec", {}).get("shutdownPolicy") == "Delete":
            await self._delete_ignoring_missing(kc.SANDBOXES, sandbox)
            return
        reduced: Obj = {k: None for k in status if k != "conditions"}
        reduced["conditions"] = conds
        if any(v is not None for k, v in status.items() if k != "conditions"):
            await self._api.patch(kc.SANDBOXES, ns, name, {"status": reduced}, sub="status")

    async def _delete_ignoring_missing(self, res: kc.Resource, obj: Obj) -> None:
        try:
            await self._api.delete(res, o.namespace_of(obj), o.name_of(obj), uid=o.uid_of(obj))
        except kc.ApiError as exc:
            if not (exc.not_found or exc.status == 409):
                raise


def spec_suspended(sandbox: Obj) -> bool:
    return bool(sandbox.get("spec", {}).get("operatingMode") == "Suspended")


POD_BY_NAME_HASH = "sandbox-name-hash"


def _pod_name_hash(pod: Obj) -> list[str]:
    value = o.labels_of(pod).get(L.SANDBOX_NAME_HASH)
    return [f"{o.namespace_of(pod)}/{value}"] if value else []
