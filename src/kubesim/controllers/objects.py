"""Small helpers over Kubernetes objects as plain JSON dicts (what the API server sends)."""

from __future__ import annotations

import datetime
from typing import Any

from kubesim import jsonwire

Obj = dict[str, Any]


def meta(obj: Obj) -> Obj:
    m: Obj = obj.setdefault("metadata", {})
    return m


def name_of(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def namespace_of(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("namespace", ""))


def uid_of(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("uid", ""))


def labels_of(obj: Obj) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("labels") or {})


def annotations_of(obj: Obj) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("annotations") or {})


def is_deleting(obj: Obj) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


def controller_ref(obj: Obj) -> Obj | None:
    """The ownerReference with ``controller: true``, as ``metav1.GetControllerOf``."""
    refs: list[Obj] = obj.get("metadata", {}).get("ownerReferences") or []
    for ref in refs:
        if ref.get("controller"):
            return ref  # callers only read it
    return None


def controller_uid(obj: Obj) -> list[str]:
    """The controller's uid as an informer index value (none when uncontrolled)."""
    ref = controller_ref(obj)
    return [str(ref["uid"])] if ref and ref.get("uid") else []


def is_controlled_by(obj: Obj, owner_uid: str) -> bool:
    ref = controller_ref(obj)
    return ref is not None and ref.get("uid") == owner_uid


def owner_reference(owner: Obj) -> Obj:
    """A controller ownerReference as ``SetControllerReference`` writes it."""
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": name_of(owner),
        "uid": uid_of(owner),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def ref_group_kind(ref: Obj) -> tuple[str, str]:
    api_version = str(ref.get("apiVersion", ""))
    group = api_version.split("/", 1)[0] if "/" in api_version else ""
    return group, str(ref.get("kind", ""))


def deep(obj: Any) -> Any:
    """A private deep copy of an API object to edit (informers' objects are shared, read-only)."""
    return jsonwire.copy_of(obj)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def rfc3339(t: datetime.datetime) -> str:
    """metav1.Time serialisation: second precision, ``Z``."""
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_nano(t: datetime.datetime) -> str:
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def get_condition(conditions: list[Obj] | None, ctype: str) -> Obj | None:
    for cond in conditions or ():
        if cond.get("type") == ctype:
            return cond
    return None


def condition_true(obj: Obj, ctype: str) -> bool:
    status = obj.get("status")
    for cond in (status.get("conditions") or ()) if status else ():
        if cond.get("type") == ctype:
            return bool(cond.get("status") == "True")
    return False


def set_condition(conditions: list[Obj], new: Obj, *, at: datetime.datetime) -> list[Obj]:
    """``meta.SetStatusCondition``: keep lastTransitionTime unless the status flips."""
    out = [dict(c) for c in conditions if c.get("type") != new["type"]]
    old = get_condition(conditions, new["type"])
    cond = dict(new)
    if old is not None and old.get("status") == cond["status"] and old.get("lastTransitionTime"):
        cond["lastTransitionTime"] = old["lastTransitionTime"]
    else:
        cond.setdefault("lastTransitionTime", rfc3339(at))
    out.append(cond)
    return out


def remove_condition(conditions: list[Obj], ctype: str) -> list[Obj]:
    return [dict(c) for c in conditions if c.get("type") != ctype]


class OwnWrites:
    """Remembers the resourceVersion our last write of each object returned (by uid).

    An informer may still hold the version from before that write; reconciling from it would
    recompute a status we already wrote and send a doomed or redundant write. Such reconciles
    are skipped: the watch event of our own write brings the object back (kopf does the same).
    """

    def __init__(self) -> None:
        self._rv: dict[str, int] = {}
        # Objects with a reconcile skipped as stale since our last write: its echo is owed one.
        self._owed: set[str] = set()

    def record(self, written: Obj) -> None:
        rv = _rv_int(written)
        if rv:
            uid = uid_of(written)
            self._rv[uid] = rv
            self._owed.discard(uid)

    def is_stale(self, cached: Obj) -> bool:
        uid = uid_of(cached)
        seen = self._rv.get(uid)
        stale = seen is not None and _rv_int(cached) < seen
        if stale:
            self._owed.add(uid)
        return stale

    def is_echo(self, event_obj: Obj) -> bool:
        """The watch event is our own last write coming back, and no reconcile was skipped as
        stale since: the reconcile that wrote it read everything this version holds (a write
        by anyone else has another resourceVersion, and other objects have their own events),
        so it needs no reconcile of its own. A skipped one makes the echo the reconcile it owes."""
        uid = uid_of(event_obj)
        if uid in self._owed:
            self._owed.discard(uid)
            return False
        seen = self._rv.get(uid)
        return seen is not None and seen == _rv_int(event_obj)

    def forget(self, uid: str) -> None:
        self._rv.pop(uid, None)
        self._owed.discard(uid)


def _rv_int(obj: Obj) -> int:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion") or 0)
    except ValueError:
        return 0
