"""In-memory object storage with one cluster-wide resourceVersion and a bounded event window.

Stored objects are treated as immutable: every write stores a fresh dict, so readers (lists,
watches) can serialise them without copying. Each object's JSON is encoded once and shared by
gets, lists and every watcher. Per resource, the last ``window`` events are kept for watch replay;
asking for anything older is ``410 Gone``, like the real watch cache.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubesim.jsonwire import dumps, loads

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped
ObjRef = tuple[str, str, str, str]  # (group, plural, namespace, name)


@dataclass(eq=False)
class Stored:
    """An object as stored, with its JSON encoding cached per served version."""

    obj: dict[str, Any]
    _json: dict[str, bytes] = field(default_factory=dict)
    #: The compiled schema that admitted this version (a later write validated by the same one
    #: need not walk the fields it leaves unchanged).
    admitted_by: object = None

    @property
    def rv(self) -> int:
        """The object's resourceVersion as an int."""
        return int(self.obj["metadata"]["resourceVersion"])

    def encoded(self, api_version: str | None = None) -> bytes:
        """JSON bytes, with ``apiVersion`` rewritten when served at another version."""
        av = api_version or self.obj.get("apiVersion", "")
        cached = self._json.get(av)
        if cached is None:
            obj = self.obj if av == self.obj.get("apiVersion") else {**self.obj, "apiVersion": av}
            cached = dumps(obj)
            self._json[av] = cached
        return cached

    def copy(self, api_version: str | None = None) -> dict[str, Any]:
        """A private deep copy to edit: decoded from the cached encoding, several times cheaper
        than ``copy.deepcopy`` (objects are plain JSON), and the encoding is served anyway."""
        copied: dict[str, Any] = loads(self.encoded(api_version))
        return copied

    def view(self, api_version: str | None = None) -> dict[str, Any]:
        """The object as served at ``api_version`` (shallow copy only if it differs)."""
        if api_version is None or api_version == self.obj.get("apiVersion"):
            return self.obj
        return {**self.obj, "apiVersion": api_version}


@dataclass(eq=False)
class Event:
    """One change: the new state (the last state for DELETED) and the previous state."""

    rv: int
    type: str
    new: Stored
    old: Stored | None
    _wire: dict[tuple[str, str], bytes] = field(default_factory=dict)

    def wire(self, type_: str, api_version: str | None) -> bytes:
        """The watch-stream line for this event as seen by one watcher."""
        key = (type_, api_version or "")
        line = self._wire.get(key)
        if line is None:
            line = b'{"type":"' + type_.encode() + b'","object":' + self.new.encoded(api_version) + b"}\n"
            self._wire[key] = line
        return line


class Subscriber(Protocol):
    """A watch on one resource; the store offers it every event of that resource in order."""

    def offer(self, event: Event) -> None: ...

    def close(self, error: dict[str, Any] | None = None) -> None: ...


@dataclass
class Bucket:
    """Objects, retained events and subscribers of one resource."""

    objects: dict[Key, Stored] = field(default_factory=dict)
    events: deque[Event] = field(default_factory=deque)
    window_start: int = 0  # events with rv > window_start are all retained
    subscribers: set[Subscriber] = field(default_factory=set)


WriteHook = Callable[[str, str, Event], None]


class Store:
    """All objects of all resources, and the event log that drives watches."""

    def __init__(self, *, window: int = 5000) -> None:
        self.rv = 1
        self.window = window
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self.by_uid: dict[str, ObjRef] = {}
        self.dependents: dict[str, set[ObjRef]] = {}
        self.hooks: list[WriteHook] = []

    def bucket(self, group: str, plural: str) -> Bucket:
        """The bucket of a resource, created empty on first use."""
        b = self._buckets.get((group, plural))
        if b is None:
            # Nothing of this resource was ever dropped, so any earlier version is still servable.
            b = Bucket(window_start=0)
            self._buckets[(group, plural)] = b
        return b

    def drop_bucket(self, group: str, plural: str) -> None:
        """Forget a resource entirely (its CRD is gone); open watches end."""
        b = self._buckets.pop((group, plural), None)
        if b is not None:
            for sub in list(b.subscribers):
                sub.close()

    def get(self, group: str, plural: str, ns: str, name: str) -> Stored | None:
        """One object or ``None``."""
        return self.bucket(group, plural).objects.get((ns, name))

    def iter(self, group: str, plural: str, ns: str | None) -> Iterator[Stored]:
        """Objects of a resource (optionally one namespace), in (namespace, name) order."""
        objects = self.bucket(group, plural).objects
        for key in sorted(objects):
            if ns is None or key[0] == ns:
                yield objects[key]

    def resolve_uid(self, uid: str) -> Stored | None:
        """The live object with this uid, if any."""
        ref = self.by_uid.get(uid)
        if ref is None:
            return None
        return self.get(*ref)

    # ---- writes ------------------------------------------------------------------------------

    def next_rv(self) -> int:
        """Reserve the next resourceVersion (a write that will happen now)."""
        self.rv += 1
        return self.rv

    def put(self, group: str, plural: str, obj: dict[str, Any], old: Stored | None) -> Stored:
        """Store a new version of ``obj`` (resourceVersion already set) and emit the event."""
        m = obj["metadata"]
        key = (m.get("namespace", ""), m["name"])
        new = Stored(obj)
        b = self.bucket(group, plural)
        b.objects[key] = new
        ref = (group, plural, key[0], key[1])
        if old is not None:
            self._unindex_owners(old.obj, ref)
        self.by_uid[m["uid"]] = ref
        self._index_owners(obj, ref)
        self._emit(group, plural, b, Event(new.rv, "MODIFIED" if old else "ADDED", new, old))
        return new

    def delete(self, group: str, plural: str, current: Stored, last: dict[str, Any] | None = None) -> Stored:
        """Remove an object; the DELETED event carries its last state at a new resourceVersion.

        ``last`` is the final state when a write (say, removing the last finalizer) deletes it.
        """
        rv = self.next_rv()
        final = last if last is not None else current.obj
        obj = {**final, "metadata": {**final["metadata"], "resourceVersion": str(rv)}}
        m = obj["metadata"]
        key = (m.get("namespace", ""), m["name"])
        b = self.bucket(group, plural)
        b.objects.pop(key, None)
        ref = (group, plural, key[0], key[1])
        self.by_uid.pop(m["uid"], None)
        self._unindex_owners(current.obj, ref)
        gone = Stored(obj)
        self._emit(group, plural, b, Event(rv, "DELETED", gone, current))
        return gone

    def _emit(self, group: str, plural: str, b: Bucket, event: Event) -> None:
        b.events.append(event)
        while len(b.events) > self.window:
            b.window_start = b.events.popleft().rv
        for sub in list(b.subscribers):
            sub.offer(event)
        for hook in self.hooks:
            hook(group, plural, event)

    def _index_owners(self, obj: dict[str, Any], ref: ObjRef) -> None:
        for owner in obj["metadata"].get("ownerReferences") or ():
            uid = owner.get("uid")
            if uid:
                self.dependents.setdefault(uid, set()).add(ref)

    def _unindex_owners(self, obj: dict[str, Any], ref: ObjRef) -> None:
        for owner in obj["metadata"].get("ownerReferences") or ():
            deps = self.dependents.get(owner.get("uid", ""))
            if deps is not None:
                deps.discard(ref)
                if not deps:
                    del self.dependents[owner["uid"]]

    # ---- watch support -----------------------------------------------------------------------

    def replay(self, group: str, plural: str, since: int) -> list[Event] | None:
        """Events after ``since``, or ``None`` if some were already dropped (→ 410)."""
        b = self.bucket(group, plural)
        if since < b.window_start:
            return None
        return [e for e in b.events if e.rv > since]

    def snapshot(self, group: str, plural: str, rv: int) -> dict[Key, Stored] | None:
        """The objects as they were at ``rv``, rebuilt by undoing later events; ``None`` if too old."""
        b = self.bucket(group, plural)
        if rv >= self.rv:
            return b.objects
        if rv < b.window_start:
            return None
        state = dict(b.objects)
        for event in reversed(b.events):
            if event.rv <= rv:
                break
            m = event.new.obj["metadata"]
            key = (m.get("namespace", ""), m["name"])
            if event.old is None:
                state.pop(key, None)
            else:
                state[key] = event.old
        return state

    def oldest(self, group: str, plural: str) -> int:
        """The oldest resourceVersion a watch of this resource can still start from."""
        return self.bucket(group, plural).window_start

    def compact(self) -> None:
        """Drop every retained event, so any watch from an older version gets 410."""
        for b in self._buckets.values():
            b.events.clear()
            b.window_start = self.rv

    def subscribers(self, group: str | None = None, plural: str | None = None) -> list[Subscriber]:
        """Open watches, optionally of one resource."""
        out: list[Subscriber] = []
        for (g, p), b in self._buckets.items():
            if (group is None or g == group) and (plural is None or p == plural):
                out.extend(b.subscribers)
        return out
