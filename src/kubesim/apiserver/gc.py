"""Built-in controllers the real control plane runs beside the API server.

- the garbage collector: deletes dependents whose owners are all gone, resolves the
  ``foregroundDeletion`` and ``orphan`` finalizers;
- the namespace controller: empties a terminating namespace, then removes it;
- the service-account controller: gives every namespace a ``default`` ServiceAccount.

They react to store events through one queue and run after the write that caused them (never
inside it), which keeps their effects asynchronous, as upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from kubesim.apiserver import deletion, errors
from kubesim.apiserver.rest import Rest, WriteOptions
from kubesim.apiserver.store import Event, ObjRef, Stored

log = logging.getLogger(__name__)
_SYSTEM = WriteOptions(field_validation="Ignore")


class Controllers:
    """Runs the built-in controllers on one asyncio task."""

    def __init__(self, rest: Rest) -> None:
        self.rest = rest
        self._queue: asyncio.Queue[tuple[str, str, Event]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._terminating: set[str] = set()
        rest.store.hooks.append(self._on_event)

    def _on_event(self, group: str, plural: str, event: Event) -> None:
        self._queue.put_nowait((group, plural, event))

    def start(self) -> None:
        """Start the worker task."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="kubesim-gc")

    async def stop(self) -> None:
        """Stop the worker task."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_idle(self) -> None:
        """Return once every queued event has been handled (for tests)."""
        await self._queue.join()

    async def _run(self) -> None:
        while True:
            group, plural, event = await self._queue.get()
            try:
                self._handle(group, plural, event)
            except Exception:  # a controller bug must not kill the server
                log.exception("built-in controller failed on %s/%s", group, plural)
            finally:
                self._queue.task_done()

    # ---- dispatch ----------------------------------------------------------------------------

    def _handle(self, group: str, plural: str, event: Event) -> None:
        obj = event.new.obj
        m = obj["metadata"]
        if event.type == "ADDED" and m.get("ownerReferences"):
            self._collect_if_orphaned(group, plural, event.new)
        if (group, plural) == ("", "namespaces"):
            if event.type == "ADDED":
                self._ensure_default_sa(m["name"])
            elif m.get("deletionTimestamp") and event.type == "MODIFIED":
                self._terminating.add(m["name"])
        if event.type == "DELETED":
            self._owner_gone(m["uid"])
            self._dependent_gone(obj)
        elif m.get("deletionTimestamp"):
            finalizers = m.get("finalizers") or []
            if deletion.ORPHAN in finalizers:
                self._orphan(group, plural, event.new)
            elif deletion.FOREGROUND in finalizers:
                self._foreground(group, plural, event.new)
        ns = m.get("namespace")
        if (group, plural) == ("", "namespaces") and m["name"] in self._terminating:
            self._drain_namespace(m["name"])
        elif ns and ns in self._terminating:
            self._drain_namespace(ns)

    # ---- garbage collection ------------------------------------------------------------------

    def _owners_alive(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            ref
            for ref in obj["metadata"].get("ownerReferences") or ()
            if self.rest.store.resolve_uid(ref.get("uid", "")) is not None
        ]

    def _collect_if_orphaned(self, group: str, plural: str, stored: Stored) -> None:
        if not self._owners_alive(stored.obj):
            self._delete(group, plural, stored, "Background")

    def _owner_gone(self, uid: str) -> None:
        for ref in list(self.rest.store.dependents.get(uid, ())):
            stored = self.rest.store.get(*ref)
            if stored is None:
                continue
            alive = self._owners_alive(stored.obj)
            if not alive:
                self._delete(ref[0], ref[1], stored, "Background")
            else:
                self._set_owner_refs(ref, stored, alive)

    def _blocking(self, owner_uid: str) -> list[Stored]:
        # Only dependents whose reference sets blockOwnerDeletion hold a foreground deletion.
        out = []
        for ref in self.rest.store.dependents.get(owner_uid, ()):
            dep = self.rest.store.get(*ref)
            if dep is None:
                continue
            refs = dep.obj["metadata"].get("ownerReferences") or ()
            if any(r.get("uid") == owner_uid and r.get("blockOwnerDeletion") for r in refs):
                out.append(dep)
        return out

    def _foreground(self, group: str, plural: str, stored: Stored) -> None:
        uid = stored.obj["metadata"]["uid"]
        for ref in list(self.rest.store.dependents.get(uid, ())):
            dep = self.rest.store.get(*ref)
            if dep is not None and not dep.obj["metadata"].get("deletionTimestamp"):
                self._delete(ref[0], ref[1], dep, "Background")
        if not self._blocking(uid):
            self._drop_finalizer(group, plural, stored, deletion.FOREGROUND)

    def _dependent_gone(self, obj: dict[str, Any]) -> None:
        # A foreground-deleting owner waits for its last blocking dependent.
        for ref in obj["metadata"].get("ownerReferences") or ():
            owner = self.rest.store.resolve_uid(ref.get("uid", ""))
            if owner is None:
                continue
            om = owner.obj["metadata"]
            if deletion.FOREGROUND in (om.get("finalizers") or []) and not self._blocking(om["uid"]):
                where = self.rest.store.by_uid[om["uid"]]
                self._drop_finalizer(where[0], where[1], owner, deletion.FOREGROUND)

    def _orphan(self, group: str, plural: str, stored: Stored) -> None:
        uid = stored.obj["metadata"]["uid"]
        for ref in list(self.rest.store.dependents.get(uid, ())):
            dep = self.rest.store.get(*ref)
            if dep is not None:
                keep = [o for o in dep.obj["metadata"].get("ownerReferences") or () if o.get("uid") != uid]
                self._set_owner_refs(ref, dep, keep)
        self._drop_finalizer(group, plural, stored, deletion.ORPHAN)

    # ---- namespaces and service accounts -----------------------------------------------------

    def _drain_namespace(self, ns: str) -> None:
        store = self.rest.store
        remaining = 0
        for rt in self.rest.registry.all():
            if not rt.namespaced:
                continue
            for stored in list(store.iter(rt.group, rt.plural, ns)):
                remaining += 1
                if not stored.obj["metadata"].get("deletionTimestamp"):
                    self._delete(rt.group, rt.plural, stored, "Background")
        if remaining and any(
            True for rt in self.rest.registry.all() if rt.namespaced for _ in store.iter(rt.group, rt.plural, ns)
        ):
            return  # objects with finalizers are still going; their DELETED events bring us back
        self._terminating.discard(ns)
        found = store.get("", "namespaces", "", ns)
        if found is not None:
            store.delete("", "namespaces", found)

    def _ensure_default_sa(self, ns: str) -> None:
        if self.rest.store.get("", "serviceaccounts", ns, "default") is not None:
            return
        rt = self.rest.registry.get("", "serviceaccounts")
        assert rt is not None
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}}
        with contextlib.suppress(errors.ApiError):
            self.rest.create(rt, "v1", ns, body, _SYSTEM)

    # ---- writes ------------------------------------------------------------------------------

    def _delete(self, group: str, plural: str, stored: Stored, policy: str) -> None:
        rt = self.rest.registry.get(group, plural)
        if rt is None:
            return
        m = stored.obj["metadata"]
        opts = deletion.DeleteOptions(propagation=policy, uid=m["uid"])
        with contextlib.suppress(errors.ApiError):
            deletion.delete(self.rest, rt, rt.storage_version, m.get("namespace", ""), m["name"], opts)

    def _set_owner_refs(self, ref: ObjRef, stored: Stored, owners: list[dict[str, Any]]) -> None:
        rt = self.rest.registry.get(ref[0], ref[1])
        if rt is None:
            return
        new = stored.copy()
        if owners:
            new["metadata"]["ownerReferences"] = owners
        else:
            new["metadata"].pop("ownerReferences", None)
        with contextlib.suppress(errors.ApiError):
            self.rest.update(rt, rt.storage_version, ref[2], ref[3], new, _SYSTEM, is_patch=True)

    def _drop_finalizer(self, group: str, plural: str, stored: Stored, finalizer: str) -> None:
        rt = self.rest.registry.get(group, plural)
        if rt is None:
            return
        new = stored.copy()
        new["metadata"]["finalizers"] = [f for f in new["metadata"].get("finalizers") or [] if f != finalizer]
        if not new["metadata"]["finalizers"]:
            del new["metadata"]["finalizers"]
        m = stored.obj["metadata"]
        with contextlib.suppress(errors.ApiError):
            self.rest.update(rt, rt.storage_version, m.get("namespace", ""), m["name"], new, _SYSTEM, is_patch=True)
