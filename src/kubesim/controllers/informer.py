"""List+watch caches (informers), in the style of client-go and kopf.

LIST, then WATCH from the list's resourceVersion with bookmarks and a timeout; every event carries
the version to resume from; 410 Gone means the retained history moved past us, so re-list (after a
short backoff) and emit the differences as events so handlers never miss a deletion.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from kubesim.controllers import client as kc

Obj = dict[str, Any]
Key = tuple[str, str]
#: (event type, new object or the deleted one, previous cached object)
Handler = Callable[[str, Obj, Obj | None], None]
#: Index values of an object (e.g. "namespace/label value"); empty when not indexed.
IndexFn = Callable[[Obj], list[str]]

log = logging.getLogger(__name__)
_RELIST_BACKOFF = (0.05, 0.1, 0.25, 0.5, 1.0)


def key_of(obj: Obj) -> Key:
    meta = obj.get("metadata", {})
    return (str(meta.get("namespace") or ""), str(meta["name"]))


class Informer:
    """A watched cache of one resource type; handlers run synchronously on each change."""

    def __init__(
        self,
        api: kc.KubeClient,
        res: kc.Resource,
        *,
        watch_timeout: int,
        label_selector: str | None = None,
    ) -> None:
        self._api = api
        self.res = res
        self._watch_timeout = watch_timeout
        self._label_selector = label_selector
        self._handlers: list[Handler] = []
        self.cache: dict[Key, Obj] = {}
        # The cache by namespace: handlers ask for one namespace's objects on every event of
        # another resource (every pod event scans the Services), and a scan of the whole cache
        # per event grew with every namespace's objects.
        self._by_namespace: dict[str, dict[Key, Obj]] = {}
        self.synced = asyncio.Event()
        self._index_fns: dict[str, IndexFn] = {}
        self._indexes: dict[str, dict[str, set[Key]]] = {}

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    def add_index(self, name: str, fn: IndexFn) -> None:
        """Maintain an index of cached objects by the values ``fn`` returns (client-go indexers)."""
        self._index_fns[name] = fn
        index: dict[str, set[Key]] = {}
        for key, obj in self.cache.items():
            for value in fn(obj):
                index.setdefault(value, set()).add(key)
        self._indexes[name] = index

    def by_index(self, name: str, value: str) -> list[Obj]:
        keys = self._indexes[name].get(value, ())
        return [self.cache[k] for k in keys if k in self.cache]

    def _reindex(self, key: Key, old: Obj | None, new: Obj | None) -> None:
        for name, fn in self._index_fns.items():
            index = self._indexes[name]
            for value in fn(old) if old is not None else ():
                bucket = index.get(value)
                if bucket is not None:
                    bucket.discard(key)
                    if not bucket:
                        del index[value]
            for value in fn(new) if new is not None else ():
                index.setdefault(value, set()).add(key)

    def get(self, namespace: str, name: str) -> Obj | None:
        return self.cache.get((namespace, name))

    def items(self, namespace: str | None = None) -> list[Obj]:
        if namespace is None:
            return list(self.cache.values())
        return list(self._by_namespace.get(namespace, {}).values())

    def _emit(self, etype: str, obj: Obj, old: Obj | None) -> None:
        for handler in self._handlers:
            try:
                handler(etype, obj, old)
            except Exception:
                log.exception("handler failed for %s %s", self.res.plural, key_of(obj))

    async def _relist(self) -> str:
        listed = await self._api.list_objects(self.res, label_selector=self._label_selector)
        seen: set[Key] = set()
        for item in listed.get("items") or []:
            item.setdefault("apiVersion", _item_api_version(self.res))
            item.setdefault("kind", listed.get("kind", "List").removesuffix("List"))
            key = key_of(item)
            seen.add(key)
            self._apply("MODIFIED" if key in self.cache else "ADDED", item)
        for key in [k for k in self.cache if k not in seen]:
            self._apply("DELETED", self.cache[key])
        return str(listed.get("metadata", {}).get("resourceVersion", ""))

    def _apply(self, etype: str, obj: Obj) -> None:
        key = key_of(obj)
        old = self.cache.get(key)
        if etype == "DELETED":
            self.cache.pop(key, None)
            in_namespace = self._by_namespace.get(key[0])
            if in_namespace is not None:
                in_namespace.pop(key, None)
                if not in_namespace:
                    del self._by_namespace[key[0]]
            self._reindex(key, old, None)
        else:
            if old is not None and _rv(old) >= _rv(obj) and etype != "ADDED":
                return  # an older view than we hold (re-list race): ignore
            self.cache[key] = obj
            self._by_namespace.setdefault(key[0], {})[key] = obj
            self._reindex(key, old, obj)
        self._emit(etype, obj, old)

    async def run(self) -> None:
        """List and watch forever (until cancelled)."""
        failures = 0
        rv = ""
        while True:
            try:
                if not rv:
                    rv = await self._relist()
                    self.synced.set()
                async for event in self._api.watch(
                    self.res,
                    resource_version=rv,
                    timeout_seconds=self._watch_timeout,
                    label_selector=self._label_selector,
                ):
                    etype, obj = event.get("type"), event.get("object") or {}
                    if etype == "ERROR":
                        if obj.get("code") == 410:
                            rv = ""  # history compacted past our version: re-list
                            break
                        raise kc.ApiError(int(obj.get("code") or 500), obj)
                    rv = str(obj.get("metadata", {}).get("resourceVersion") or rv)
                    if etype in ("ADDED", "MODIFIED", "DELETED"):
                        self._apply(str(etype), obj)
                    failures = 0
            except asyncio.CancelledError:
                raise
            except kc.ApiError as exc:
                if exc.gone:
                    rv = ""
                failures += 1
                log.debug("watch %s: %s", self.res.plural, exc)
            except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
                failures += 1
                log.debug("watch %s: %r", self.res.plural, exc)
            except Exception:
                # A malformed event or a bug must not stop the whole cluster's watch: re-list.
                failures += 1
                rv = ""
                log.exception("watch %s failed; re-listing", self.res.plural)
            if failures:
                await asyncio.sleep(_RELIST_BACKOFF[min(failures, len(_RELIST_BACKOFF)) - 1])


def _rv(obj: Obj) -> int:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def _item_api_version(res: kc.Resource) -> str:
    return f"{res.group}/{res.version}" if res.group else res.version
