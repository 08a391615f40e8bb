"""Watch streams: one ``Watcher`` per open watch, fed synchronously by the store on each write.

Events are queued as ready-made JSON lines, so delivery costs one socket write per batch. A
watcher that falls too far behind is closed (the client re-watches), like a slow consumer on a
real server. Bookmarks carry the current cluster resourceVersion, which is safe because the store
enqueues every earlier event of the resource before a bookmark is queued.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from aiohttp import web

from kubesim.apiserver.selectors import Predicate
from kubesim.apiserver.store import Event, Store, Stored
from kubesim.jsonwire import dumps

MAX_BACKLOG = 100_000


def expired_status(since: int, oldest: int) -> dict[str, Any]:
    """The Status a watch gets when its resourceVersion fell out of the window."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {since} ({oldest + 1})",
        "reason": "Expired",
        "code": 410,
    }


class Watcher:
    """A subscriber that filters events for one watch and queues their wire lines."""

    def __init__(
        self,
        *,
        namespace: str | None,
        predicate: Predicate | None,
        api_version: str | None,
        user: str = "",
        after: int = 0,
        render: Callable[[str, Stored], bytes] | None = None,
    ) -> None:
        self.namespace = namespace
        # Events at or below this resourceVersion were already seen (a watch from a future version).
        self.after = after
        # Set when the client asked for Tables: each event's object is then rendered per watcher.
        self.render = render
        self.predicate = predicate
        self.api_version = api_version
        self.user = user
        self.lines: deque[bytes] = deque()
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None

    def _matches(self, stored: Stored | None) -> bool:
        if stored is None:
            return False
        if self.namespace is not None and stored.obj["metadata"].get("namespace") != self.namespace:
            return False
        return self.predicate is None or self.predicate(stored.obj)

    def offer(self, event: Event) -> None:
        """Queue the event as this watch should see it (selectors can turn it into ADDED/DELETED)."""
        if self.closed or event.rv <= self.after:
            return
        if event.type == "DELETED":
            kind = "DELETED" if self._matches(event.new) else None
        else:
            now = self._matches(event.new)
            before = event.type == "MODIFIED" and self._matches(event.old)
            kind = ("MODIFIED" if before else "ADDED") if now else ("DELETED" if before else None)
        if kind is None:
            return
        self.deliver(kind, event.new, event)

    def added(self, stored: Stored) -> None:
        """Queue a synthetic ADDED event for an object that existed when the watch began."""
        self.deliver("ADDED", stored, None)

    def deliver(self, kind: str, stored: Stored, event: Event | None) -> None:
        """Queue one event of this watch as its wire line (shared by every watcher of ``event``)."""
        if self.render is not None:
            self.push(self.render(kind, stored))
        elif event is not None:
            self.push(event.wire(kind, self.api_version))
        else:
            self.push(b'{"type":"' + kind.encode() + b'","object":' + stored.encoded(self.api_version) + b"}\n")

    def push(self, line: bytes) -> None:
        """Queue a raw line; a watcher too far behind is closed instead."""
        if len(self.lines) >= MAX_BACKLOG:
            self.close()
            return
        self.lines.append(line)
        self._wake()

    def close(self, error: dict[str, Any] | None = None) -> None:
        """End the stream, after an optional ERROR event."""
        if self.closed:
            return
        if error is not None:
            self.lines.append(b'{"type":"ERROR","object":' + dumps(error) + b"}\n")
        self.closed = True
        self._wake()

    def pending(self) -> bool:
        """Whether events are queued for the consumer."""
        return bool(self.lines)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, deadline: float) -> None:
        """Return when a line is queued, the watch closes, or ``deadline`` (loop time) passes."""
        if self.pending() or self.closed:
            return
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        handle = loop.call_at(deadline, self._wake)
        try:
            await self._waiter
        finally:
            handle.cancel()
            self._waiter = None


class ObjectWatcher(Watcher):
    """A watch consumed in the API server's own process (kubesim's controllers and kubelet): the
    same filtering as a wire watch, but each event is queued as the stored object itself, never
    encoded. Stored objects are immutable (every write stores a fresh dict), so sharing them is
    safe as long as the consumer treats them as read-only, as client-go's informers require."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.events: deque[tuple[str, dict[str, Any]]] = deque()
        #: Set by ``expire`` (the consumer's one deadline timer): the watch's time is up.
        self.expired = False

    async def next_events(self) -> None:
        """Return when an event is queued, the watch closes or it expires. Unlike ``wait`` it arms
        no timer of its own: the consumer arms one for the watch's whole life (``expire``). About
        ten informers wake on every write; each wait armed and cancelled a timer, and the loop's
        heap kept the cancelled ones, a measurable share of the in-process watches' cost."""
        if self.events or self.closed or self.expired:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def expire(self) -> None:
        """The watch's time is up: wake its consumer, which ends it."""
        self.expired = True
        self._wake()

    def deliver(self, kind: str, stored: Stored, event: Event | None) -> None:
        if len(self.events) >= MAX_BACKLOG:
            self.close()
            return
        self.events.append((kind, stored.view(self.api_version)))
        self._wake()

    def close(self, error: dict[str, Any] | None = None) -> None:
        if self.closed:
            return
        if error is not None:
            self.events.append(("ERROR", error))
        self.closed = True
        self._wake()

    def pending(self) -> bool:
        return bool(self.events)


def bookmark(kind: str, api_version: str, rv: int, *, initial_end: bool = False) -> bytes:
    """A BOOKMARK line: only kind, apiVersion and metadata.resourceVersion are meaningful."""
    metadata: dict[str, Any] = {"resourceVersion": str(rv), "creationTimestamp": None}
    if initial_end:
        metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
    return (
        b'{"type":"BOOKMARK","object":'
        + dumps({"kind": kind, "apiVersion": api_version, "metadata": metadata})
        + b"}\n"
    )


async def stream(
    request: web.Request,
    watcher: Watcher,
    *,
    store: Store,
    kind: str,
    api_version: str,
    duration: float,
    bookmarks: bool,
    bookmark_interval: float,
) -> web.StreamResponse:
    """Serve a subscribed watcher as a chunked ``application/json`` watch stream."""
    resp = web.StreamResponse(status=200)
    resp.content_type = "application/json"
    resp.headers["Transfer-Encoding"] = "chunked"
    await resp.prepare(request)
    loop = asyncio.get_running_loop()
    end = loop.time() + duration
    try:
        await _pump(
            resp,
            watcher,
            store=store,
            kind=kind,
            api_version=api_version,
            end=end,
            bookmarks=bookmarks,
            bookmark_interval=bookmark_interval,
        )
    except ConnectionResetError:
        return resp  # the client went away; nothing left to tell it
    await resp.write_eof()
    return resp


async def _pump(
    resp: web.StreamResponse,
    watcher: Watcher,
    *,
    store: Store,
    kind: str,
    api_version: str,
    end: float,
    bookmarks: bool,
    bookmark_interval: float,
) -> None:
    loop = asyncio.get_running_loop()
    next_bookmark = loop.time() + bookmark_interval
    while True:
        if watcher.lines:
            batch = b"".join(watcher.lines)
            watcher.lines.clear()
            await resp.write(batch)
            continue
        if watcher.closed:
            break
        now = loop.time()
        if now >= end:
            break
        if bookmarks and now >= next_bookmark:
            watcher.push(bookmark(kind, api_version, store.rv))
            next_bookmark = now + bookmark_interval
            continue
        await watcher.wait(min(end, next_bookmark) if bookmarks else end)
