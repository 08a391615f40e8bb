"""LIST, then WATCH from the list's resourceVersion — the informer loop the driver's caches run on.

The version is taken from every event (bookmarks included), so a watch that ends — the server's
timeoutSeconds, or a dropped connection — resumes where it stopped; a 410 (history compacted)
re-lists after a short backoff. Callers get the list (`on_list`) and each change (`on_event`)
through plain callbacks, and keep whatever state they need.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import NoReturn, Protocol

from warmshell.drivers.kubernetes import kube
from warmshell.drivers.kubernetes.objects import Obj

__all__ = ["Backoff", "WatchApi", "follow"]

log = logging.getLogger(__name__)


class WatchApi(Protocol):
    """The two calls an informer needs (`kube.Kube`)."""

    async def list(self, resource: kube.Resource, namespace: str, *, label_selector: str = "") -> Obj: ...

    def watch(
        self, resource: kube.Resource, namespace: str, *, resource_version: str, label_selector: str = ""
    ) -> AsyncGenerator[Obj, None]: ...


@dataclass(frozen=True)
class Backoff:
    """Pauses of the loop: before a relist after 410, and before retrying after a failure."""

    relist_seconds: float = 0.5
    retry_seconds: float = 1.0


DEFAULT_BACKOFF = Backoff()


async def follow(
    api: WatchApi,
    resource: kube.Resource,
    namespace: str,
    *,
    label_selector: str = "",
    on_list: Callable[[list[Obj]], None],
    on_event: Callable[[str, Obj], None],
    backoff: Backoff = DEFAULT_BACKOFF,
) -> NoReturn:
    """Keep `on_list`/`on_event` informed about `resource` until cancelled."""
    what = f"{resource.plural} in {namespace}"
    while True:
        try:
            listing = await api.list(resource, namespace, label_selector=label_selector)
        except kube.Temporary as exc:
            log.warning("list of %s failed (%s); retrying in %.1fs", what, exc, backoff.retry_seconds)
            await asyncio.sleep(backoff.retry_seconds)
            continue
        version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
        on_list(list(listing.get("items") or []))
        try:
            await _watch_from(api, resource, namespace, label_selector, version, on_event, backoff)
        except kube.Gone:
            # 410 Gone is for "resource version too old": we must list again and start over.
            log.info("watch of %s expired (410); relisting in %.1fs", what, backoff.relist_seconds)
            await asyncio.sleep(backoff.relist_seconds)


async def _watch_from(
    api: WatchApi,
    resource: kube.Resource,
    namespace: str,
    label_selector: str,
    version: str,
    on_event: Callable[[str, Obj], None],
    backoff: Backoff,
) -> NoReturn:
    """Watch and re-watch from the latest version seen; returns only by raising `Gone`."""
    while True:
        try:
            stream = api.watch(resource, namespace, resource_version=version, label_selector=label_selector)
            # aclosing: a cancelled informer must release its connection now, not at GC time.
            async with contextlib.aclosing(stream):
                async for event in stream:
                    obj = event.get("object") or {}
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    kind = str(event.get("type") or "")
                    if kind != "BOOKMARK":
                        on_event(kind, obj)
        except kube.Temporary as exc:
            log.warning("watch of %s dropped (%s); resuming in %.1fs", resource.plural, exc, backoff.retry_seconds)
            await asyncio.sleep(backoff.retry_seconds)
