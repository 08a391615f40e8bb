"""The driver's live view of the cluster: informer loops (`watching`) over our Sandboxes, their
pods and the namespace's Events, folded into `DriverEvent`s on the driver's `Hub` — a view event
whenever what `status.view` says about a sandbox changes, a deletion when its Sandbox goes, and a
progress line for each new Event about its pod or Sandbox.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from warmshell.core.ids import SandboxId
from warmshell.drivers.base import DriverEvent, DriverSandbox
from warmshell.drivers.kubernetes import kube, labels, status, watching
from warmshell.drivers.kubernetes.events import Hub

__all__ = ["Informers"]

Obj = dict[str, Any]


class Informers:
    """Caches of our Sandboxes and pods by object name, kept by three informer tasks."""

    def __init__(self, api: kube.Kube, namespace: str, hub: Hub, backoff: watching.Backoff) -> None:
        self._api = api
        self._namespace = namespace
        self._hub = hub
        self._backoff = backoff
        self._tasks: list[asyncio.Task[None]] = []
        self._sandboxes: dict[str, Obj] = {}
        self._pods: dict[str, Obj] = {}
        self._views: dict[SandboxId, DriverSandbox] = {}  # the last view published per sandbox

    def start(self) -> None:
        """Start the informer tasks (once)."""
        if self._tasks:
            return
        api, namespace, selector = self._api, self._namespace, labels.managed_selector()

        async def sandboxes() -> None:
            resource = await api.sandbox_resource(namespace)
            await self._follow(resource, selector, self._sandboxes_listed, self._sandbox_event)

        self._tasks = [
            asyncio.create_task(sandboxes(), name="k8s-informer:sandboxes"),
            asyncio.create_task(
                self._follow(kube.PODS, selector, self._pods_listed, self._pod_event), name="k8s-informer:pods"
            ),
            # Event history is not progress: only Events added from now on count.
            asyncio.create_task(
                self._follow(kube.EVENTS, "", lambda _items: None, self._kube_event), name="k8s-informer:events"
            ),
        ]

    async def aclose(self) -> None:
        """Stop the informer tasks."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _follow(
        self,
        resource: kube.Resource,
        selector: str,
        on_list: Callable[[list[Obj]], None],
        on_event: Callable[[str, Obj], None],
    ) -> None:
        await watching.follow(
            self._api,
            resource,
            self._namespace,
            label_selector=selector,
            on_list=on_list,
            on_event=on_event,
            backoff=self._backoff,
        )

    # -- Sandboxes -------------------------------------------------------------------------

    def _sandboxes_listed(self, items: list[Obj]) -> None:
        current = {s["metadata"]["name"]: s for s in items if status.is_managed(s)}
        # Gone while we were not watching (a relist after 410): report them deleted.
        for name in self._sandboxes.keys() - current.keys():
            self._sandbox_event("DELETED", self._sandboxes[name])
        self._sandboxes = current
        for name in current:
            self._publish_view(name)

    def _sandbox_event(self, kind: str, sandbox: Obj) -> None:
        if not status.is_managed(sandbox):
            return
        name = sandbox["metadata"]["name"]
        if kind == "DELETED":
            self._sandboxes.pop(name, None)
            sandbox_id = status.sandbox_id_of(sandbox)
            if sandbox_id is not None and self._views.pop(sandbox_id, None) is not None:
                self._hub.publish(DriverEvent(sandbox_id, deleted=True))
            return
        self._sandboxes[name] = sandbox
        self._publish_view(name)

    # -- pods ------------------------------------------------------------------------------

    def _pods_listed(self, items: list[Obj]) -> None:
        self._pods = {p["metadata"]["name"]: p for p in items}
        for name in list(self._sandboxes):
            self._publish_view(name)

    def _pod_event(self, kind: str, pod: Obj) -> None:
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            self._pods.pop(name, None)
        else:
            self._pods[name] = pod
        for sandbox_name, sandbox in list(self._sandboxes.items()):
            if status.owned_pod_name(sandbox) == name:
                self._publish_view(sandbox_name)

    def _publish_view(self, sandbox_name: str) -> None:
        sandbox = self._sandboxes.get(sandbox_name)
        if sandbox is None:
            return
        view = status.view(sandbox, status.own_pod(sandbox, self._pods.get(status.owned_pod_name(sandbox))))
        # Only changes: a pod status write that alters nothing we report is not an event.
        if self._views.get(view.sandbox_id) != view:
            self._views[view.sandbox_id] = view
            self._hub.publish(DriverEvent(view.sandbox_id, sandbox=view))

    # -- Events ----------------------------------------------------------------------------

    def _kube_event(self, kind: str, event: Obj) -> None:
        if kind != "ADDED":
            return  # repeats of an Event (count bumps) are not new progress
        involved = event.get("involvedObject") or {}
        name = str(involved.get("name") or "")
        sandbox_id: SandboxId | None = None
        if involved.get("kind") == "Pod" and name in self._pods:
            sandbox_id = status.sandbox_id_of(self._pods[name])
        elif involved.get("kind") == "Sandbox" and name in self._sandboxes:
            sandbox_id = status.sandbox_id_of(self._sandboxes[name])
        if sandbox_id is not None:
            self._hub.publish(DriverEvent(sandbox_id, progress=status.progress_line(event)))
