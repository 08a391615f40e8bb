"""The profile reconciler: ConfigMaps labelled `warmshell.dev/warm-pool-profile: "true"` in the
sandbox namespace become agent-sandbox `SandboxTemplate` + `SandboxWarmPool` pairs, and each
ConfigMap gets its status back as annotations.

It runs only on the replica holding the Lease (`lease.Elector` calls `lead`), and only while the
extension APIs are installed (`extensions.ExtensionsGate`). An informer follows the ConfigMaps; any
change, and a resync every `resync_seconds`, triggers one pass: read the generated objects, ask
`profileplan` what to do, write, report. A failed pass is retried with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from warmshell.core.config import KubernetesDriverConfig
from warmshell.drivers.kubernetes import kube, labels, watching
from warmshell.drivers.kubernetes.clock import Clock, SystemClock
from warmshell.drivers.kubernetes.objects import Obj
from warmshell.drivers.kubernetes.profiles import lease, profileplan
from warmshell.drivers.kubernetes.warm.extensions import ExtensionsGate

__all__ = ["ProfileReconciler", "run_elected"]

log = logging.getLogger(__name__)


RETRY_DELAYS: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 30.0)
_RESOURCES: dict[profileplan.Kind, kube.Resource] = {
    "template": kube.SANDBOX_TEMPLATES,
    "pool": kube.SANDBOX_WARM_POOLS,
}


class ProfileReconciler:
    """Keeps generated pairs in line with the profile ConfigMaps; `lead()` runs it until cancelled."""

    def __init__(
        self,
        api: kube.Kube,
        config: KubernetesDriverConfig,
        *,
        gate: ExtensionsGate,
        clock: Clock | None = None,
        backoff: watching.Backoff | None = None,
        retry_delays: Sequence[float] = RETRY_DELAYS,
        on_problems: Callable[[dict[str, str]], None] | None = None,
    ) -> None:
        self._api = api
        # After each pass: profile ConfigMap name -> its error, so `pool list` can show invalid ones.
        self._on_problems = on_problems
        self._config = config
        self._gate = gate
        self._clock = clock or SystemClock()
        self._backoff = backoff or watching.Backoff()
        self._retry_delays = tuple(retry_delays) or (1.0,)
        self._configmaps: dict[str, Obj] = {}  # by uid
        self._own_writes: dict[str, str] = {}  # uid -> resourceVersion our last status write returned
        self._wake = asyncio.Event()
        self._listed = asyncio.Event()
        self.passes = 0  # completed passes (tests and debugging)

    @property
    def namespace(self) -> str:
        """Where profile ConfigMaps are read: the sandbox namespace."""
        return self._config.namespace

    # -- the loop ---------------------------------------------------------------------------

    async def lead(self) -> None:
        """Reconcile on every change and every resync until cancelled (the Lease is lost or the
        driver closes). Returns when the extension APIs disappear, so the caller starts over."""
        await self._gate.wait_available()
        self._configmaps.clear()
        self._listed.clear()
        informer = asyncio.create_task(self._follow(), name="profiles:configmaps")
        worker = asyncio.create_task(self._reconcile_forever(), name="profiles:reconcile")
        try:
            # The informer ends only by failing (a 403, say); the worker when the APIs go away.
            done, _ = await asyncio.wait({informer, worker}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            for task in (informer, worker):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _reconcile_forever(self) -> None:
        await self._listed.wait()
        failures = 0
        resync = self._config.warm_pooling.profiles.resync_seconds
        while True:
            self._wake.clear()
            try:
                await self.reconcile_once()
                failures = 0
            except kube.NotFound as exc:
                # The collection itself is gone: the CRDs were uninstalled.
                log.debug("profile reconcile: %s", exc)
                self._gate.lost()
                return
            except kube.ApiError as exc:
                delay = self._retry_delays[min(failures, len(self._retry_delays) - 1)]
                failures += 1
                log.warning("profile reconcile failed (%s); retrying in %.0fs (attempt %d)", exc, delay, failures + 1)
                await self._clock.sleep(delay)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), resync)

    async def _follow(self) -> None:
        await watching.follow(
            self._api,
            kube.CONFIGMAPS,
            self.namespace,
            label_selector=labels.profile_selector(),
            on_list=self._on_list,
            on_event=self._on_event,
            backoff=self._backoff,
        )

    def _on_list(self, items: list[Obj]) -> None:
        self._configmaps = {str(cm["metadata"]["uid"]): cm for cm in items}
        self._listed.set()
        self._wake.set()

    def _on_event(self, kind: str, configmap: Obj) -> None:
        meta = configmap.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if kind == "DELETED":
            self._configmaps.pop(uid, None)
            self._own_writes.pop(uid, None)
        else:
            self._configmaps[uid] = configmap
            if self._own_writes.get(uid) == meta.get("resourceVersion"):
                return  # the echo of our own status write: nothing new to act on
        self._wake.set()

    # -- one pass ---------------------------------------------------------------------------

    async def reconcile_once(self) -> None:
        """Bring generated pairs and statuses in line with the ConfigMaps known now."""
        configmaps = sorted(self._configmaps.values(), key=lambda cm: str(cm["metadata"]["name"]))
        desired = [profileplan.desire(cm, self._config) for cm in configmaps]
        namespaces = sorted({self.namespace} | {d.target_namespace for d in desired if d.target_namespace})
        templates: list[Obj] = []
        pools: list[Obj] = []
        for namespace in namespaces:
            templates += await self._generated(kube.SANDBOX_TEMPLATES, namespace)
            pools += await self._generated(kube.SANDBOX_WARM_POOLS, namespace)
        plan = profileplan.plan(desired, templates, pools)
        errors = dict(plan.errors)
        for write in plan.writes:
            if write.profile_uid not in errors:
                await self._write(write, errors)
        kept = {uid: list(names) for uid, names in plan.kept.items()}
        for delete in plan.deletes:
            if delete.profile_uid in errors:
                # Its replacement failed: the old pair keeps serving, and the status says so.
                kept.setdefault(delete.profile_uid, [])
                if delete.name not in kept[delete.profile_uid]:
                    kept[delete.profile_uid].append(delete.name)
                continue
            await self._delete(delete)
        for want in desired:
            await self._report(want, errors.get(want.uid, ""), kept.get(want.uid, []))
        if self._on_problems is not None:
            self._on_problems({w.name: errors.get(w.uid) or w.error for w in desired if errors.get(w.uid) or w.error})
        self.passes += 1

    async def _generated(self, resource: kube.Resource, namespace: str) -> list[Obj]:
        listing = await self._api.list(resource, namespace, label_selector=labels.generated_selector())
        return list(listing.get("items") or [])

    async def _write(self, write: profileplan.Write, errors: dict[str, str]) -> None:
        """Create or merge-patch one object; a permanent failure becomes the profile's error."""
        resource = _RESOURCES[write.kind]
        try:
            if write.action == "create":
                try:
                    await self._api.create(resource, write.namespace, write.body)
                    log.info("profile reconciler: created %s %s/%s", resource.kind, write.namespace, write.name)
                    return
                except kube.AlreadyExists:
                    existing = await self._api.get(resource, write.namespace, write.name)
                    if (existing["metadata"].get("labels") or {}).get(labels.MANAGED_BY) != labels.MANAGED_BY_VALUE:
                        errors[write.profile_uid] = (
                            f"{resource.kind} {write.namespace}/{write.name} exists and is not managed by warmshell"
                        )
                        return
            await self._api.merge_patch(resource, write.namespace, write.name, profileplan.patch_body(write))
            log.info("profile reconciler: updated %s %s/%s", resource.kind, write.namespace, write.name)
        except (kube.Rejected, kube.Conflict, kube.NotFound) as exc:
            # Permanent for this pass (invalid, forbidden, namespace missing, object gone under a
            # patch): the profile reports it and the next pass tries again; others go on.
            errors[write.profile_uid] = f"{resource.kind} {write.namespace}/{write.name}: {exc.api_message or exc}"

    async def _delete(self, delete: profileplan.Delete) -> None:
        resource = _RESOURCES[delete.kind]
        try:
            await self._api.delete(resource, delete.namespace, delete.name, uid=delete.uid)
        except (kube.NotFound, kube.Conflict):
            return  # already gone, or replaced by someone else meanwhile (the next pass decides)
        log.info(
            "profile reconciler: deleted %s %s/%s (%s)", resource.kind, delete.namespace, delete.name, delete.reason
        )

    async def _report(self, want: profileplan.Desired, error: str, kept: list[str]) -> None:
        observed = profileplan.observed_version(want, self._own_writes.get(want.uid))
        annotations = profileplan.status_annotations(want, error=error, kept=kept, observed=observed)
        patch = profileplan.status_patch(want, annotations)
        if patch is None:
            return
        if annotations.get(labels.PROFILE_STATUS) == profileplan.ERROR:
            log.warning("warm-pool profile %s: %s", want.source, annotations.get(labels.PROFILE_LAST_ERROR))
        try:
            written = await self._api.merge_patch(kube.CONFIGMAPS, want.namespace, want.name, patch)
        except kube.NotFound:
            return  # deleted meanwhile; its objects go on the next pass
        self._own_writes[want.uid] = str(written["metadata"].get("resourceVersion") or "")
        self._configmaps[want.uid] = written


async def run_elected(
    api: kube.Kube,
    config: KubernetesDriverConfig,
    *,
    gate: ExtensionsGate,
    clock: Clock | None = None,
    on_problems: Callable[[dict[str, str]], None] | None = None,
    elector: lease.Elector | None = None,
) -> None:
    """The profile reconciler as the driver runs it: on the Lease holder only, while the
    extension APIs are installed (`gate` is the driver's, so their absence is said once per
    gateway); until cancelled (which releases the Lease). `on_problems` gets each pass's invalid
    profiles (ConfigMap name -> error), and nothing once this replica stops leading. `elector`:
    the driver's own, when the gateway's singleton work shares the Lease."""
    reconciler = ProfileReconciler(api, config, gate=gate, clock=clock, on_problems=on_problems)
    try:
        await (elector or lease.elector_for(api, config, clock=clock)).run(reconciler.lead)
    finally:
        if on_problems is not None:
            on_problems({})
