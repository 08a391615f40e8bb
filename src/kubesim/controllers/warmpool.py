"""The SandboxWarmPool controller: keep ``spec.replicas`` warm Sandboxes (notes §10).

Creates go out in slow-start batches (1, 2, 4, …) and are remembered as *expectations* until the
watch shows them, so a reconcile that runs before its own creates are observed never creates twice.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubesim.controllers import client as kc
from kubesim.controllers import labels as L
from kubesim.controllers import objects as o
from kubesim.controllers import pools
from kubesim.controllers.hashing import name_hash
from kubesim.controllers.informer import Informer, Key
from kubesim.controllers.workqueue import WorkQueue
from kubesim.timing import Timing

Obj = dict[str, Any]
log = logging.getLogger(__name__)


class _Expectations:
    """Creates (by name) and deletes (by uid) issued but not yet seen through the watch."""

    def __init__(self) -> None:
        self.creates: dict[str, float] = {}
        self.deletes: dict[str, tuple[str, float]] = {}  # uid -> (name, issued at)

    def outstanding(self, sandboxes: Informer, namespace: str, now: float, ttl: float) -> int:
        for name, at in list(self.creates.items()):
            if sandboxes.get(namespace, name) is not None or now - at > ttl:
                del self.creates[name]
        for uid, (name, at) in list(self.deletes.items()):
            sb = sandboxes.get(namespace, name)
            if sb is None or o.uid_of(sb) != uid or o.is_deleting(sb) or now - at > ttl:
                del self.deletes[uid]
        return len(self.creates) + len(self.deletes)


class WarmPoolController:
    def __init__(
        self,
        api: kc.KubeClient,
        *,
        pools_informer: Informer,
        sandboxes: Informer,
        templates: Informer,
        timing: Timing,
    ) -> None:
        self._api = api
        self._pools = pools_informer
        self._sandboxes = sandboxes
        self._templates = templates
        self._timing = timing
        self._expect: dict[Key, _Expectations] = {}
        #: The pool as our last status write returned it: the informer may not have it yet.
        self._written: dict[Key, Obj] = {}
        #: Per member uid: the informer's object its plan facts were read from, and those facts.
        self._facts: dict[str, tuple[Obj, pools.MemberFacts]] = {}
        # Upstream runs one worker for pools; that serialises pools but keeps creates parallel.
        self.queue: WorkQueue[Key] = WorkQueue(
            "sandboxwarmpool",
            self.reconcile,
            workers=4,
            delay=max(timing.reconcile_delay, timing.pool_batch_window),
        )
        sandboxes.add_index(SANDBOX_BY_POOL, _pool_label)
        pools_informer.add_handler(self._on_pool)
        sandboxes.add_handler(self._on_sandbox)
        templates.add_handler(self._on_template)

    def _on_pool(self, etype: str, obj: Obj, old: Obj | None) -> None:
        key = (o.namespace_of(obj), o.name_of(obj))
        if etype == "DELETED":
            self._expect.pop(key, None)
            self._written.pop(key, None)
        elif not _own_echo(obj, self._written.get(key)):
            self.queue.add(key)

    def _on_sandbox(self, etype: str, obj: Obj, old: Obj | None) -> None:
        if etype == "DELETED":
            self._facts.pop(o.uid_of(obj), None)
        if etype == "MODIFIED" and old is not None and _as_planned(old) == _as_planned(obj):
            # Nothing the plan reads changed (most status writes of a starting member): with
            # hundreds of members, planning costs milliseconds, and this spares a plan per write.
            return
        # Enqueue the pool that controls (or controlled) the Sandbox: after an adoption the new
        # object names the claim, the old one the pool, which must replenish at once.
        for item in (obj, old):
            ref = o.controller_ref(item) if item else None
            if item is not None and ref and ref.get("kind") == "SandboxWarmPool":
                self.queue.add((o.namespace_of(item), str(ref["name"])))

    def _on_template(self, etype: str, obj: Obj, old: Obj | None) -> None:
        for pool in self._pools.items(o.namespace_of(obj)):
            ref = (pool.get("spec", {}).get("sandboxTemplateRef") or {}).get("name")
            if ref == o.name_of(obj):
                self.queue.add((o.namespace_of(pool), o.name_of(pool)))

    def _facts_of(self, member: Obj) -> pools.MemberFacts:
        """A member's plan facts, read once per version (the informer holds one object per
        version): a pool of 150 members was planned ~4 times per warm claim, and reading every
        member's owner, deletion, readiness and age each time was ~15 % of kubesim's busy samples."""
        uid = o.uid_of(member)
        seen = self._facts.get(uid)
        if seen is not None and seen[0] is member:
            return seen[1]
        facts = pools.member_facts(member)
        self._facts[uid] = (member, facts)
        return facts

    async def reconcile(self, key: Key) -> float | None:
        ns, name = key
        pool = self._pools.get(ns, name)
        if pool is None or o.is_deleting(pool):
            return None
        pool_hash = name_hash(name)
        members = self._sandboxes.by_index(SANDBOX_BY_POOL, f"{ns}/{pool_hash}")
        tname = (pool.get("spec", {}).get("sandboxTemplateRef") or {}).get("name", "")
        template = self._templates.get(ns, tname)
        expect = self._expect.setdefault(key, _Expectations())
        loop = asyncio.get_running_loop()
        unobserved = expect.outstanding(self._sandboxes, ns, loop.time(), self._timing.pool_expectations_timeout)
        plan = pools.plan_pool(
            pool,
            members,
            template,
            unobserved=unobserved,
            now=o.now(),
            readiness_grace=self._timing.pool_readiness_grace,
            facts=self._facts_of,
        )
        for sandbox in plan.delete:
            expect.deletes[o.uid_of(sandbox)] = (o.name_of(sandbox), loop.time())
            try:
                await self._api.delete(kc.SANDBOXES, ns, o.name_of(sandbox), uid=o.uid_of(sandbox))
            except kc.ApiError as exc:
                expect.deletes.pop(o.uid_of(sandbox), None)
                if not (exc.not_found or exc.status == 409):
                    raise
        if plan.create and template is not None:
            await self._create_batches(pool, template, plan.create, expect)
        if _newest(pool, self._written.get(key)).get("status") != plan.status:
            patch = {"status": plan.status}
            try:
                self._written[key] = await self._api.patch(kc.POOLS, ns, name, patch, sub="status")
            except kc.ApiError as exc:
                if not exc.not_found:
                    raise
        if unobserved:
            # The watch normally wakes us; this is the fallback if an expectation never resolves.
            return min(1.0, self._timing.pool_expectations_timeout)
        return plan.recheck_in

    async def _create_batches(self, pool: Obj, template: Obj, count: int, expect: _Expectations) -> None:
        """``slowStartBatch``: 1, 2, 4, … creates in parallel, stopping at the first failure."""
        ns = o.namespace_of(pool)
        body = pools.build_warm_sandbox(pool, template)
        loop = asyncio.get_running_loop()
        remaining, size = count, 1
        while remaining > 0:
            batch = min(size, remaining)
            results = await asyncio.gather(
                *(self._api.create(kc.SANDBOXES, ns, o.deep(body)) for _ in range(batch)),
                return_exceptions=True,
            )
            failed = False
            for result in results:
                if isinstance(result, BaseException):
                    failed = True
                    log.warning("pool %s: create failed: %s", o.name_of(pool), result)
                else:
                    name = o.name_of(result)
                    if self._sandboxes.get(ns, name) is None:
                        expect.creates[name] = loop.time()
            if failed:
                return
            remaining -= batch
            size *= 2


SANDBOX_BY_POOL = "warm-pool-sandbox"


def _newest(cached: Obj, written: Obj | None) -> Obj:
    """The later of the informer's pool and the one our last status write returned. Comparing a
    new status with a cached pool that predates our own write re-sent that write (a no-op the
    server answers without a new resourceVersion, but a full write path all the same): with one
    member claimed and one created per warm claim, about one pool status patch in four."""
    if written is not None and o.uid_of(written) == o.uid_of(cached) and _rv(written) > _rv(cached):
        return written
    return cached


def _own_echo(event_obj: Obj, written: Obj | None) -> bool:
    """The watch event is our own status write coming back: nothing the plan reads changed since
    we planned it (members have their own events), so it needs no reconcile."""
    return written is not None and _rv(event_obj) == _rv(written) and o.uid_of(event_obj) == o.uid_of(written)


def _rv(obj: Obj) -> int:
    return int(obj.get("metadata", {}).get("resourceVersion") or 0)


def _as_planned(sandbox: Obj) -> tuple[Any, ...]:
    """What ``pools.plan_pool`` reads of a member: its owner, labels, deletion, readiness and spec."""
    meta = sandbox.get("metadata", {})
    return (
        meta.get("ownerReferences"),
        meta.get("labels"),
        meta.get("deletionTimestamp"),
        meta.get("generation"),
        o.condition_true(sandbox, "Ready"),
    )


def _pool_label(sandbox: Obj) -> list[str]:
    value = o.labels_of(sandbox).get(L.WARM_POOL_SANDBOX)
    return [f"{o.namespace_of(sandbox)}/{value}"] if value else []
