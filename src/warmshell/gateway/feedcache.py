"""Rows of a store shared by replicas, kept between changes while the change feed is heard.

Another replica's write reaches this one only through the store's change feed (LISTEN/NOTIFY),
a few milliseconds after it committed, so a kept row may lag the store by that much: what is
kept here serves only readers that are told of every change and read again then (a watcher),
and the start of a compare-and-swap mutation (a lagging start loses its swap and is read again
from the store). A decision that must see the store as it is reads the store.

Kept only while the feed is heard: a lost feed forgets everything and keeps nothing until it is
back, since writes made meanwhile are heard of by no one. A read answered after a change to its
row was heard (or after the feed was lost) is not kept: it may be older than that change, and
no later notification would correct it. With three replicas at a few warm creates a second,
each create's watcher re-read its record on every change, a query and a decode each."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from warmshell.gateway.store.base import StoredObject

__all__ = ["FeedCache"]

# Ids whose change was heard while some call was in flight: past this many, a heard change
# counts as "everything changed" for the calls in flight (bounded memory under constant load).
_FORGOTTEN_LIMIT = 10_000


class FeedCache:
    """Rows by id, each at the newest version heard of or read, while the change feed is up."""

    def __init__(self) -> None:
        self._rows: dict[str, StoredObject] = {}
        self._up = False
        # Counts every change heard; a call takes it at its start (`fetching`) to tell, at its
        # end, whether a change its answer may predate was heard meanwhile.
        self._epoch = 0
        self._cleared_at = 0  # the epoch of the last forget-everything
        self._forgotten: dict[str, int] = {}  # id -> epoch of its last change heard (reads in flight)
        self._calls = 0  # reads and writes in flight whose answers may be kept
        # id -> the newest version this replica's watchers were told of (its own writes, heard).
        self._told: dict[str, int] = {}

    def row(self, sandbox_id: str) -> StoredObject | None:
        """The row as kept (possibly a few milliseconds behind another replica's write)."""
        return self._rows.get(sandbox_id)

    @contextlib.contextmanager
    def fetching(self) -> Iterator[int]:
        """Around a read or write of the store whose answer may be kept: yields the epoch to
        pass to `keep` inside the block."""
        self._calls += 1
        try:
            yield self._epoch
        finally:
            self._calls -= 1
            if not self._calls:
                self._forgotten.clear()  # no call in flight can predate a change heard so far

    def keep(self, row: StoredObject, *, since: int) -> None:
        """Keep `row`, read or written by a call started at epoch `since`, unless a change to it
        (or the feed's loss) was heard since then, or a newer version is kept."""
        if not self._up or self._cleared_at > since or self._forgotten.get(row.id, -1) > since:
            return
        kept = self._rows.get(row.id)
        if kept is None or kept.resource_version < row.resource_version:
            self._rows[row.id] = row

    def tell(self, sandbox_id: str, version: int) -> bool:
        """Whether this replica's watchers are still to be told of `version` (then taken as
        told): a write's answer and its echo on the feed arrive on two connections in either
        order, and only the first tells."""
        if not self._up:
            return True
        if version <= self._told.get(sandbox_id, 0):
            return False
        self._told[sandbox_id] = version
        return True

    def heard(self, sandbox_id: str, version: int) -> bool:
        """A change to the row heard on the feed (`version` 0: not said); whether this
        replica's watchers are to be told of it (see `tell`)."""
        kept = self._rows.get(sandbox_id)
        if not (version and kept is not None and kept.resource_version >= version):
            self._forget(sandbox_id)  # (not a row this replica already holds at that version)
        return self.tell(sandbox_id, version) if version else True

    def _forget(self, sandbox_id: str) -> None:
        self._epoch += 1
        self._rows.pop(sandbox_id, None)
        if self._calls:
            if len(self._forgotten) >= _FORGOTTEN_LIMIT:
                self._forgotten.clear()
                self._cleared_at = self._epoch
            else:
                self._forgotten[sandbox_id] = self._epoch

    def removed(self, sandbox_id: str) -> None:
        """The row was deleted (by this replica, or heard), or lost a swap (it lagged)."""
        self._forget(sandbox_id)
        self._told.pop(sandbox_id, None)

    def feed(self, *, up: bool) -> None:
        """The change feed is listening again (`up`: anything may have changed while it was
        not) or was lost: forget every row either way; keep none while it is down."""
        self._up = up
        self._epoch += 1
        self._cleared_at = self._epoch
        self._rows.clear()
        self._told.clear()
        self._forgotten.clear()
