"""The root-CA publisher (a kube-controller-manager controller): every namespace gets the
``kube-root-ca.crt`` ConfigMap holding the API server's CA, which the ``kube-api-access-*``
volume of every pod projects as ``ca.crt`` (see ``kubesim.apiserver.serviceaccounts``)."""

from __future__ import annotations

from typing import Any

from kubesim.apiserver.serviceaccounts import ROOT_CA_CONFIGMAP
from kubesim.controllers import client as kc
from kubesim.controllers import objects as o
from kubesim.controllers.informer import Informer, Key
from kubesim.controllers.workqueue import WorkQueue
from kubesim.timing import Timing

Obj = dict[str, Any]


class RootCAPublisher:
    """Creates (and repairs) ``kube-root-ca.crt`` in each active namespace."""

    def __init__(self, api: kc.KubeClient, *, namespaces: Informer, ca_pem: bytes, timing: Timing) -> None:
        self._api = api
        self._namespaces = namespaces
        self._ca = ca_pem.decode()
        self.queue: WorkQueue[Key] = WorkQueue("root-ca", self.reconcile, workers=1, delay=timing.reconcile_delay)
        namespaces.add_handler(self._on_namespace)

    def _on_namespace(self, etype: str, obj: Obj, old: Obj | None) -> None:
        if etype == "ADDED":
            self.queue.add(("", o.name_of(obj)))

    async def reconcile(self, key: Key) -> float | None:
        ns = self._namespaces.get(*key)
        if ns is None or o.is_deleting(ns):
            return None
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": ROOT_CA_CONFIGMAP, "namespace": key[1]},
            "data": {"ca.crt": self._ca},
        }
        try:
            await self._api.create(kc.CONFIGMAPS, key[1], body)
        except kc.ApiError as exc:
            if not (exc.already_exists or exc.status in (403, 404)):  # terminating namespace
                raise
        return None
