"""Kubernetes Events for what the controllers did (notes §13), as ``kubectl describe`` shows them.

Recording never blocks or fails a reconcile: events are posted from background tasks and errors
are only logged, like client-go's asynchronous event broadcaster.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from kubesim.controllers import client as kc
from kubesim.controllers import objects as o

Obj = dict[str, Any]
log = logging.getLogger(__name__)

COMPONENT = "agent-sandbox-controller"


def build_event(obj: Obj, *, type_: str, reason: str, action: str, note: str) -> Obj:
    """An ``events.k8s.io/v1`` Event about ``obj``."""
    now = o.rfc3339_nano(o.now())
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": f"{o.name_of(obj)}.{secrets.token_hex(8)}",
            "namespace": o.namespace_of(obj) or "default",
        },
        "eventTime": now,
        "reportingController": COMPONENT,
        "reportingInstance": f"{COMPONENT}-kubesim",
        "action": action,
        "reason": reason,
        "type": type_,
        "note": note,
        "regarding": {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": o.name_of(obj),
            "namespace": o.namespace_of(obj),
            "uid": o.uid_of(obj),
            "resourceVersion": obj.get("metadata", {}).get("resourceVersion"),
        },
    }


class Recorder:
    """Posts events in the background; ``aclose`` waits for those in flight."""

    def __init__(self, api: kc.KubeClient) -> None:
        self._api = api
        self._tasks: set[asyncio.Task[None]] = set()

    def record(self, obj: Obj, *, type_: str, reason: str, action: str, note: str) -> None:
        body = build_event(obj, type_=type_, reason=reason, action=action, note=note)
        task = asyncio.create_task(self._post(body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, body: Obj) -> None:
        try:
            await self._api.create(kc.EVENTS_V1, body["metadata"]["namespace"], body)
        except (kc.ApiError, OSError) as exc:
            log.debug("event %s not recorded: %s", body["reason"], exc)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
