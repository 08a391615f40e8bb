"""The driver's cache of warm pools: the opted-in `SandboxWarmPool`s and `SandboxTemplate`s,
followed by two informers and folded into a `PoolIndex` by fingerprint after every change but a
pool's counts (`_recounted`).

A template is read (its shape, quantities and fingerprint) once per resourceVersion, when its
event arrives, not again on each pool event (pool status changes with every member's readiness).

`index_pools` is the pure part: it decides which pools may serve requests. A pool whose template
is missing, is not a warmshell supervisor template, runs another shape than the pool's
fingerprint says, or whose lifetime or network annotations do not parse is kept out of the index (so it is
never matched) and reported on its `PoolView`.

The warm path (`warm.WarmAllocation`) starts the cache while the extension APIs are served and
closes it when they go; a 404 on either collection is how it learns they went (`on_gone`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from warmshell.core import matching, poolshapes
from warmshell.core.errors import InvalidArgumentError
from warmshell.core.fingerprints import SandboxShape, fingerprint
from warmshell.core.ids import Fingerprint
from warmshell.drivers.base import DriverCondition
from warmshell.drivers.kubernetes import kube, labels, watching
from warmshell.drivers.kubernetes.objects import Obj
from warmshell.drivers.kubernetes.warm import warmpools

__all__ = ["CachedPool", "PoolCache", "PoolStats", "ReadTemplate", "index_pools", "read_template"]

log = logging.getLogger(__name__)
V = TypeVar("V")


@dataclass
class PoolStats:
    """Per-pool counters the driver keeps across cache rebuilds."""

    hits: int = 0
    misses: int = 0


@dataclass(frozen=True)
class CachedPool:
    """One warm pool as the cache understands it; `shape` is None when it cannot be served."""

    name: str
    workspace: str
    fingerprint: Fingerprint
    shape: SandboxShape | None
    desired: int
    ready: int
    problem: DriverCondition | None = None
    # The lifetime defaults of the sandboxes it serves (None: the gateway's).
    ttl_seconds: int | None = None
    idle_timeout_seconds: int | None = None
    # Its profile's `[network]` rules and secret hosts (applied at activation, not matched).
    network: warmpools.PoolEgress = field(default_factory=warmpools.PoolEgress)
    stats: PoolStats = field(default_factory=PoolStats, compare=False)


@dataclass(frozen=True)
class ReadTemplate:
    """A SandboxTemplate as the index needs it: the shape its pods run (None: not a warmshell
    supervisor template) and that shape's fingerprint, for one resourceVersion."""

    version: str
    shape: SandboxShape | None
    fingerprint: Fingerprint | None


def read_template(template: Mapping[str, Any]) -> ReadTemplate:
    """Parse a template once (its environment, quantities, accepted keys; pure)."""
    version = str((template.get("metadata") or {}).get("resourceVersion") or "")
    shape = warmpools.shape_of_template(template)
    return ReadTemplate(version, shape, fingerprint(shape) if shape is not None else None)


def index_pools(pools: Iterable[Mapping[str, Any]], templates: Mapping[str, ReadTemplate]) -> list[CachedPool]:
    """Every opted-in pool, each checked against its (already read) template (pure)."""
    return [_cached(pool, templates) for pool in pools]


def _cached(pool: Mapping[str, Any], templates: Mapping[str, ReadTemplate]) -> CachedPool:
    meta = pool.get("metadata") or {}
    name = str(meta.get("name") or "")
    label = str((meta.get("labels") or {}).get(labels.FINGERPRINT) or "")
    annotated = str((meta.get("annotations") or {}).get(labels.FINGERPRINT) or "")
    spec = pool.get("spec") or {}
    desired = int(spec.get("replicas", 1) or 0)
    ready = int((pool.get("status") or {}).get("readyReplicas") or 0)
    template_name = str((spec.get("sandboxTemplateRef") or {}).get("name") or "")
    template = templates.get(template_name)

    def refused(reason: str, message: str) -> CachedPool:
        workspace = str((meta.get("annotations") or {}).get(labels.WORKSPACE) or "")
        problem = DriverCondition("Servable", "False", reason, message)
        return CachedPool(name, workspace, Fingerprint(annotated or label), None, desired, ready, problem)

    if template is None:
        return refused("TemplateMissing", f"SandboxTemplate {template_name!r} does not exist or has not opted in")
    shape, actual = template.shape, template.fingerprint
    if shape is None or actual is None:
        return refused("TemplateNotOurs", f"SandboxTemplate {template_name!r} does not run the warmshell supervisor")
    if label != warmpools.fingerprint_label(actual) or (annotated and annotated != actual):
        return refused(
            "FingerprintMismatch",
            f"fingerprint label {label!r} disagrees with the shape SandboxTemplate {template_name!r} runs ({actual})",
        )
    try:
        ttl, idle = warmpools.lifetime_of(pool)
    except InvalidArgumentError as exc:
        # Refused rather than served without it: the operator asked these sandboxes to end.
        return refused("InvalidLifetime", str(exc))
    try:
        network = warmpools.egress_of(pool)
    except InvalidArgumentError as exc:
        # Refused rather than served under another policy than the one written for it.
        return refused("InvalidNetwork", str(exc))
    return CachedPool(
        name,
        shape.workspace,
        actual,
        shape,
        desired,
        ready,
        ttl_seconds=ttl,
        idle_timeout_seconds=idle,
        network=network,
    )


class PoolCache:
    """Informers over opted-in pools and templates; `lookup` answers from the latest index."""

    def __init__(
        self,
        api: kube.Kube,
        namespace: str,
        backoff: watching.Backoff,
        *,
        on_change: Callable[[], None] = lambda: None,
        on_gone: Callable[[], None] = lambda: None,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._backoff = backoff
        self._on_change = on_change
        self._on_gone = on_gone
        self._pools: dict[str, Obj] = {}
        self._templates: dict[str, ReadTemplate] = {}
        self._listed: set[str] = set()
        self._stats: dict[str, PoolStats] = {}
        self._entries: list[CachedPool] = []
        self._index: matching.PoolIndex[CachedPool] = matching.PoolIndex()
        self._tasks: list[asyncio.Task[None]] = []
        self._warned: set[tuple[str, str]] = set()

    def start(self) -> None:
        """Start both informers (once; again after `aclose`)."""
        if self._tasks:
            return
        self._tasks = [
            asyncio.create_task(
                self._follow(kube.SANDBOX_WARM_POOLS, self._pools, lambda pool: pool), name="k8s-informer:warmpools"
            ),
            asyncio.create_task(
                self._follow(kube.SANDBOX_TEMPLATES, self._templates, self._read_template),
                name="k8s-informer:templates",
            ),
        ]

    async def aclose(self) -> None:
        """Stop the informers and forget the pools (lookups are NotReady until `start` has
        listed again); the hit and miss counts are kept."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._pools.clear()
        self._templates.clear()
        self._listed.clear()
        self._entries = []
        self._index = matching.PoolIndex()
        self._warned = set()

    @property
    def synced(self) -> bool:
        """Whether both initial lists have arrived."""
        return self._index.synced

    def lookup(self, fp: Fingerprint) -> matching.MatchResult[CachedPool]:
        """NotReady until synced, then the pools serving `fp`."""
        return self._index.lookup(fp)

    def match(self, shape: SandboxShape) -> matching.MatchResult[CachedPool]:
        """NotReady until synced, then the pools serving a request of this shape."""
        return self._index.match(shape)

    def entries(self) -> list[CachedPool]:
        """Every opted-in pool, servable or not."""
        return list(self._entries)

    def entry(self, name: str) -> CachedPool | None:
        """The pool called `name`, if cached."""
        return next((e for e in self._entries if e.name == name), None)

    def _read_template(self, template: Obj) -> ReadTemplate:
        """The template read, or the reading kept from the same version (a relist, a re-watch)."""
        known = self._templates.get(template["metadata"]["name"])
        version = str(template["metadata"].get("resourceVersion") or "")
        if known is not None and version and known.version == version:
            return known
        return read_template(template)

    async def _follow(self, resource: kube.Resource, into: dict[str, V], read: Callable[[Obj], V]) -> None:
        def listed(items: list[Obj]) -> None:
            fresh = {i["metadata"]["name"]: read(i) for i in items}  # read before `into` is cleared
            into.clear()
            into.update(fresh)
            self._listed.add(resource.plural)
            self._rebuild()

        def changed(kind: str, obj: Obj) -> None:
            name = obj["metadata"]["name"]
            if kind == "DELETED":
                into.pop(name, None)
            else:
                into[name] = read(obj)
            if not (resource == kube.SANDBOX_WARM_POOLS and kind == "MODIFIED" and self._recounted(obj)):
                self._rebuild()

        try:
            await watching.follow(
                self._api,
                resource,
                self._namespace,
                label_selector=labels.warm_pool_selector(),
                on_list=listed,
                on_event=changed,
                backoff=self._backoff,
            )
        except kube.NotFound as exc:
            # The collection itself is gone: the extension CRDs were removed. The warm path closes
            # the cache and starts it again once they are back.
            log.debug("%s: %s", resource.plural, exc)
            self._on_gone()

    def _recounted(self, pool: Obj) -> bool:
        """Whether a pool's change was to its counts alone (a member's readiness: most pool events,
        several per warm create), now taken into its entry. The index is kept: it matches on
        everything but the counts; the entry is replaced in it."""
        if len(self._listed) < 2:
            return False
        name = pool["metadata"]["name"]
        found = next((i for i, e in enumerate(self._entries) if e.name == name), None)
        if found is None:
            return False
        fresh = _cached(pool, self._templates)
        entry = self._entries[found]
        counted = dataclasses.replace(entry, desired=fresh.desired, ready=fresh.ready)
        if counted != fresh:  # anything else changed (the stats are not compared)
            return False
        self._entries[found] = counted
        if entry.shape is not None:
            self._index.replace(entry.fingerprint, entry, counted)
        self._on_change()
        return True

    def _rebuild(self) -> None:
        if len(self._listed) < 2:
            return  # one kind listed: a pool without its template would be misreported as refused
        entries = []
        warned = set()
        for entry in index_pools(self._pools.values(), self._templates):
            entries.append(dataclasses.replace(entry, stats=self._stats.get(entry.name) or PoolStats()))
            if entry.problem is not None:
                key = (entry.name, entry.problem.reason)
                warned.add(key)
                if key not in self._warned:  # once per pool and problem, not on every event
                    log.warning("warm pool %s is never matched: %s", entry.name, entry.problem.message)
        fingerprints = {e.name: e.fingerprint for e in entries if e.shape is not None}
        for name, others in poolshapes.shared_shapes(fingerprints.items()).items():
            warned.add((name, poolshapes.REASON))
            if (name, poolshapes.REASON) not in self._warned:
                log.warning("warm pool %s: %s", name, poolshapes.shared_shape_message(others, fingerprints[name]))
        self._warned = warned
        self._stats = {e.name: e.stats for e in entries}
        self._entries = entries
        self._index = matching.PoolIndex(
            ((e.fingerprint, e) for e in entries if e.shape is not None),
            accepts=lambda e: e.shape.accepted if e.shape is not None else (),
        )
        self._on_change()
