"""The EndpointSlice controller: one ``discovery.k8s.io/v1`` EndpointSlice per Service with a
selector, listing the matching pods that have an IP, each with its ``ready`` condition (the pod's
Ready condition), so the Service proxy routes to ready pods only. Named targetPorts are resolved
against each pod's container ports, as upstream does per pod.
"""

from __future__ import annotations

from typing import Any

from kubesim.controllers import client as kc
from kubesim.controllers import objects as o
from kubesim.controllers.hashing import name_hash
from kubesim.controllers.informer import Informer, Key
from kubesim.controllers.workqueue import WorkQueue
from kubesim.timing import Timing

Obj = dict[str, Any]
SERVICE_NAME = "kubernetes.io/service-name"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
CONTROLLER = "endpointslice-controller.k8s.io"


def _selected(selector: dict[str, str], pod: Obj) -> bool:
    labels = o.labels_of(pod)
    return all(labels.get(k) == v for k, v in selector.items())


def _target_port(port: Obj, pod: Obj) -> int | None:
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int):
        return target
    if str(target).isdigit():
        return int(str(target))
    for c in (pod.get("spec") or {}).get("containers") or []:
        for cp in c.get("ports") or []:
            if cp.get("name") == target:
                return int(cp["containerPort"])
    return None


def desired_slice(service: Obj, pods: list[Obj]) -> Obj:
    """The EndpointSlice of ``service`` given the namespace's pods (pure)."""
    spec = service.get("spec") or {}
    selector = spec.get("selector") or {}
    name = o.name_of(service)
    members = [
        p
        for p in pods
        if _selected(selector, p)
        and (p.get("status") or {}).get("podIP")
        and p.get("status", {}).get("phase") != "Succeeded"
    ]
    members.sort(key=o.name_of)
    endpoints = []
    for pod in members:
        ready = o.condition_true(pod, "Ready")
        terminating = o.is_deleting(pod)
        endpoints.append(
            {
                "addresses": [pod["status"]["podIP"]],
                "conditions": {"ready": ready and not terminating, "serving": ready, "terminating": terminating},
                "nodeName": (pod.get("spec") or {}).get("nodeName"),
                "targetRef": {
                    "kind": "Pod",
                    "namespace": o.namespace_of(pod),
                    "name": o.name_of(pod),
                    "uid": o.uid_of(pod),
                },
            }
        )
    ports = []
    for port in spec.get("ports") or []:
        resolved = next((t for t in (_target_port(port, p) for p in members) if t is not None), None)
        entry: Obj = {"name": port.get("name", ""), "protocol": port.get("protocol", "TCP")}
        if resolved is not None:
            entry["port"] = resolved
        if port.get("appProtocol"):
            entry["appProtocol"] = port["appProtocol"]
        ports.append(entry)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{name}-{name_hash(name)[:5]}",
            "namespace": o.namespace_of(service),
            "labels": {SERVICE_NAME: name, MANAGED_BY: CONTROLLER},
            "ownerReferences": [o.owner_reference({"apiVersion": "v1", "kind": "Service", **service})],
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports,
    }


class EndpointSliceController:
    """Keeps each selector Service's EndpointSlice current as pods come, go and change readiness."""

    def __init__(
        self, api: kc.KubeClient, *, services: Informer, pods: Informer, slices: Informer, timing: Timing
    ) -> None:
        self._api = api
        self._services = services
        self._pods = pods
        self._slices = slices
        self.queue: WorkQueue[Key] = WorkQueue("endpointslice", self.reconcile, workers=2, delay=timing.reconcile_delay)
        services.add_handler(self._on_service)
        pods.add_handler(self._on_pod)

    def _on_service(self, etype: str, obj: Obj, old: Obj | None) -> None:
        if etype != "DELETED":
            self.queue.add((o.namespace_of(obj), o.name_of(obj)))

    def _on_pod(self, etype: str, obj: Obj, old: Obj | None) -> None:
        ns = o.namespace_of(obj)
        for svc in self._services.items(ns):
            selector = (svc.get("spec") or {}).get("selector")
            if selector and (_selected(selector, obj) or (old is not None and _selected(selector, old))):
                self.queue.add((ns, o.name_of(svc)))

    async def reconcile(self, key: Key) -> float | None:
        service = self._services.get(*key)
        if service is None or o.is_deleting(service) or not (service.get("spec") or {}).get("selector"):
            return None
        want = desired_slice(service, self._pods.items(key[0]))
        current = self._slices.get(key[0], want["metadata"]["name"])
        if current is None:
            try:
                await self._api.create(kc.ENDPOINTSLICES, key[0], want)
            except kc.ApiError as exc:
                if not exc.already_exists:
                    raise
                return 0.05
            return None
        if current.get("endpoints") == want["endpoints"] and current.get("ports") == want["ports"]:
            return None
        body = {**current, "endpoints": want["endpoints"], "ports": want["ports"]}
        try:
            await self._api.update(kc.ENDPOINTSLICES, body)
        except kc.ApiError as exc:
            if exc.conflict:
                return 0.05
            if not exc.not_found:
                raise
        return None
