"""Sandbox records in the store: typed reads, and serialised compare-and-swap mutations that tell
watchers about every change.

With a store only this gateway writes (SQLite: one gateway per file), the rows it read or wrote
are kept in memory, by id and by name, decoded: a read — a watcher's after every change, an
activation's, a lookup by name, an expiry pass over every sandbox — costs neither a trip to the
store nor a decode. What a read returns is shared with every other reader: it is to read, never
to change (a mutation's `change` gets a copy of its own, decoded from the row). Writes still go
through the store first; a lost compare-and-swap drops the cached row and reads it again.

While a create is in flight (`hold` to `release`), the other mutations of its record — its
activation, its backend's first view, often its session — are folded into the record in memory
and written with the create's own change, in one write instead of three or four. Reads see the
folded record meanwhile, so every check still sees what has happened. Only with a store of our
own: nothing else can move the row in between. A warm create whose caller waits for Ready stays
held until then (`until_held` wakes at each change folded in), so its session is folded in too.

With a store of our own a mutation also need not wait for the write before it to finish: it is
applied to the record as the writes already sent will leave it, and sent behind them (the store
gives each write the next version, in the order sent). A warm create's activation and its
session's Ready, a few milliseconds apart, were two such writes (now one, below): under load
one SQLite write takes ~5 ms (the worker thread waits for the GIL), and the session's waited
that long for the activation's before even starting its own. If a write fails, the ones sent
behind it fail their compare-and-swap and start over from the store.

A change no reader waits for (an activation's timeline and incarnation, a backend's progress
before Ready) may be *deferred* (`mutate_later`): applied to a copy in memory, which reads do
not see (a watcher keeps the record it last read to compare with the next, and the write that
takes the copy changes it in place), and written with the record's next write — a warm
create's session follows its activation within milliseconds, so the two are one write — or
alone once `within` has passed. Only with a store of our own; with replicas it is written at
once, as any mutation. A crash loses a deferred change, so one may be deferred only when losing
it is safe (see `mutate_later`).

With a store shared by replicas, rows are kept only while the change feed says they are current
(`feedcache`), and serve only a watcher's re-read (`get(..., may_lag=True)`) and the start of a
mutation (its compare-and-swap catches a start that lags); every other read asks the store."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar
from weakref import WeakValueDictionary

from warmshell.core.errors import ConflictError, NotFoundError
from warmshell.core.ids import SandboxId
from warmshell.core.models import SandboxRecord
from warmshell.gateway.events import Changed, EventBus
from warmshell.gateway.feedcache import FeedCache
from warmshell.gateway.store.base import NewObject, Store, StoredObject

__all__ = ["KIND_SANDBOX", "SandboxRecords"]

KIND_SANDBOX = "sandbox"
_CAS_ATTEMPTS = 8
_CHANGED = Changed()
_Row = TypeVar("_Row", StoredObject, StoredObject | None)


def _decode(row: StoredObject) -> SandboxRecord:
    record = SandboxRecord.model_validate_json(row.payload)
    record.resource_version = row.resource_version
    return record


def _encode(record: SandboxRecord) -> str:
    return record.model_dump_json(exclude={"resource_version"})


class SandboxRecords:
    """The gateway's access to stored sandboxes."""

    def __init__(self, store: Store, bus: EventBus, *, exclusive: bool = False) -> None:
        """`exclusive`: no one else writes the store, so the rows read and written here may be
        served from memory (never true of a store shared by replicas)."""
        self._store = store
        self._bus = bus
        self._rows: dict[str, StoredObject] | None = {} if exclusive else None
        # A shared store: its rows kept while the change feed says they are current.
        self._feed = None if exclusive else FeedCache()
        # The kept rows decoded (at the row's resource_version), for readers only.
        self._decoded: dict[str, SandboxRecord] = {}
        # (workspace, name) -> id of the rows kept: a name never changes, and a row leaves with its id.
        self._names: dict[tuple[str, str], str] = {}
        # Held records (see `hold`): their folded, unwritten state (None until a change arrives),
        # and for those someone waits on (`until_held`), set at each change folded in.
        self._held: dict[str, SandboxRecord | None] = {}
        self._held_changes: dict[str, asyncio.Event] = {}
        # One lock per sandbox: mutations inside this gateway queue up instead of racing each
        # other into CAS conflicts; CAS still guards against other replicas.
        self._locks: WeakValueDictionary[SandboxId, asyncio.Lock] = WeakValueDictionary()
        self._observers: list[Callable[[SandboxRecord], None]] = []
        # Exclusive store: the row as the writes sent and not yet answered will leave it (the
        # last one's payload, at the version the store will give it).
        self._sent: dict[str, StoredObject] = {}
        # Exclusive store: records with deferred changes not written yet (see `mutate_later`),
        # and the timer that writes each alone if no other write takes it first.
        self._deferred: dict[str, SandboxRecord] = {}
        self._deferred_timers: dict[str, asyncio.TimerHandle] = {}
        self._flushes: set[asyncio.Task[None]] = set()

    @property
    def sees_every_write(self) -> bool:
        """Whether every write of the store goes through here (a store of our own), so an
        observer hears of every change; with replicas, the others' writes it does not."""
        return self._rows is not None

    def observe(self, observer: Callable[[SandboxRecord], None]) -> None:
        """Call `observer` with each record this gateway writes (inserted or changed), once it
        is written; the record is to read (see the module doc)."""
        self._observers.append(observer)

    def _written(self, record: SandboxRecord) -> None:
        for observer in self._observers:
            observer(record)

    async def insert(self, record: SandboxRecord, beside: Sequence[NewObject] = ()) -> SandboxRecord:
        """Persist a new record, and `beside` in the same write (all or none; AlreadyExistsError
        on a duplicate name); `record` is the readers' from now on (see the module doc)."""
        row = await self._fetched(
            self._store.create(
                kind=KIND_SANDBOX,
                id=record.id,
                name=record.name,
                workspace=record.workspace,
                payload=_encode(record),
                beside=beside,
            )
        )
        record.resource_version = row.resource_version
        self._keep(row, record)
        if self._feed is not None:
            self._feed.tell(record.id, row.resource_version)  # (nothing watches it yet)
        self._written(record)
        return record

    def _keep(self, row: StoredObject, decoded: SandboxRecord | None = None) -> None:
        """Remember the row (and, when given, the record it encodes) with an exclusive store;
        never over a newer one (a listing read before a write may be answered after it)."""
        if self._rows is not None:
            if (newer := self._rows.get(row.id)) is not None and newer.resource_version > row.resource_version:
                return
            self._rows[row.id] = row
            self._names[(row.workspace, row.name)] = row.id
            if decoded is not None:
                self._decoded[row.id] = decoded
            elif (stale := self._decoded.get(row.id)) is not None and stale.resource_version != row.resource_version:
                del self._decoded[row.id]

    def _drop(self, sandbox_id: str) -> None:
        self._undefer(sandbox_id)
        if self._feed is not None:
            self._feed.removed(sandbox_id)
        self._sent.pop(sandbox_id, None)
        row = self._rows.pop(sandbox_id, None) if self._rows is not None else None
        self._decoded.pop(sandbox_id, None)
        if row is not None and self._names.get(key := (row.workspace, row.name)) == sandbox_id:
            del self._names[key]  # (and not a successor's of the same name)

    def _read(self, row: StoredObject) -> SandboxRecord:
        """The row decoded for readers: the kept decode when it is of this version."""
        kept = self._decoded.get(row.id)
        if kept is not None and kept.resource_version == row.resource_version:
            return kept
        record = _decode(row)
        self._keep(row, record)
        if self._feed is not None and self._feed.row(row.id) is row:
            self._decoded[row.id] = record
        return record

    async def _fetched(self, call: Awaitable[_Row]) -> _Row:
        """The store's answer to `call` (a read or a write of one row), kept with a shared
        store unless a change to the row was heard while it was on its way."""
        if self._feed is None:
            return await call
        with self._feed.fetching() as since:
            row = await call
            if row is not None:
                self._feed.keep(row, since=since)
        return row

    async def _row(self, sandbox_id: SandboxId, *, may_lag: bool = False) -> StoredObject | None:
        """The row: kept, or from the store; with a shared store a kept one only when `may_lag`."""
        row = self._kept_row(sandbox_id, may_lag=may_lag)
        if row is None:
            row = await self._fetched(self._store.get(KIND_SANDBOX, sandbox_id))
            if row is not None:
                self._keep(row)
        return row

    async def get(self, sandbox_id: SandboxId, *, may_lag: bool = False) -> SandboxRecord | None:
        """By id, to read (see the module doc); a held record's folded state likewise.

        `may_lag`: with a store shared by replicas, the record as last heard of may do (a
        few milliseconds behind another replica's write): only for a reader that is told of
        every change and reads again then (a watcher), never for a decision."""
        if (held := self._held.get(sandbox_id)) is not None:
            return held
        row = await self._row(sandbox_id, may_lag=may_lag)
        return self._read(row) if row else None

    def kept(self, sandbox_id: SandboxId) -> SandboxRecord | None:
        """The record as this gateway keeps it, to read, without asking the store (None when it
        keeps none); with a store shared by replicas it may lag as `get(may_lag=True)` does:
        to screen with, a decision on it then taken on `get`."""
        if (held := self._held.get(sandbox_id)) is not None:
            return held
        row = self._kept_row(sandbox_id, may_lag=True)
        return self._read(row) if row is not None else None

    def _kept_row(self, sandbox_id: str, *, may_lag: bool) -> StoredObject | None:
        """The row this gateway keeps: its own store's, or with a shared store (`may_lag` only)
        the one the change feed says is current."""
        if self._rows is not None:
            return self._rows.get(sandbox_id)
        return self._feed.row(sandbox_id) if self._feed is not None and may_lag else None

    async def get_by_name(self, workspace: str, name: str) -> SandboxRecord:
        """By name, to read; NotFoundError names what was looked for."""
        kept = self._names.get((workspace, name))
        if kept is not None and (held := self._held.get(kept)) is not None:
            return held
        row = self._rows.get(kept) if self._rows is not None and kept is not None else None
        if row is None:
            row = await self._fetched(self._store.get_by_name(KIND_SANDBOX, workspace, name))
        if row is None:
            raise NotFoundError(f"sandbox {workspace}/{name} not found")
        self._keep(row)
        return self._read(row)

    async def list(self, workspace: str | None = None) -> list[SandboxRecord]:
        """All sandboxes (in one workspace, or all), to read."""
        if self._feed is None:
            rows = await self._store.list(KIND_SANDBOX, workspace)
            return [self._read(r) for r in rows]
        with self._feed.fetching() as since:
            rows = await self._store.list(KIND_SANDBOX, workspace)
            for row in rows:
                self._feed.keep(row, since=since)
        return [self._read(r) for r in rows]

    async def _copy(self, sandbox_id: SandboxId, *, may_lag: bool = False) -> SandboxRecord | None:
        """The current record as a copy of the caller's own, to change (`may_lag`: see `_row`)."""
        if (held := self._held.get(sandbox_id)) is not None:
            return held  # (already the holder's own: folded changes accumulate on it)
        row = self._sent.get(sandbox_id) or await self._row(sandbox_id, may_lag=may_lag)
        return _decode(row) if row else None

    def _lock(self, sandbox_id: SandboxId) -> asyncio.Lock:
        lock = self._locks.get(sandbox_id)
        if lock is None:
            lock = self._locks[sandbox_id] = asyncio.Lock()
        return lock

    def hold(self, sandbox_id: SandboxId) -> None:
        """Fold the record's mutations into memory until `release` (a create in flight; see the
        module doc). A no-op with a store shared by replicas."""
        if self._rows is not None:
            # Changes deferred before (a resume's record) are folded in, not dropped.
            self._held[sandbox_id] = self._undefer(sandbox_id)

    def holds(self, sandbox_id: SandboxId) -> bool:
        """Whether the record is held (see `hold`)."""
        return sandbox_id in self._held

    async def until_held(self, sandbox_id: SandboxId, done: Callable[[SandboxRecord], bool], *, within: float) -> None:
        """Wait until the held record's folded state is `done`, it is no longer held, or
        `within` seconds have passed."""
        event = self._held_changes.setdefault(sandbox_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                while sandbox_id in self._held:
                    held = self._held[sandbox_id]
                    if held is not None and done(held):
                        return
                    event.clear()
                    await event.wait()

    def _unhold(self, sandbox_id: str) -> None:
        self._held.pop(sandbox_id, None)
        if (event := self._held_changes.pop(sandbox_id, None)) is not None:
            event.set()  # its waiter sees the record released

    def _fold(self, sandbox_id: str, record: SandboxRecord) -> None:
        """A change to a held record, kept in memory (see `hold`)."""
        self._held[sandbox_id] = record
        if (event := self._held_changes.get(sandbox_id)) is not None:
            event.set()

    async def release(
        self, sandbox_id: SandboxId, change: Callable[[SandboxRecord], None] | None = None
    ) -> SandboxRecord | None:
        """Stop holding the record: write what was folded with `change` applied on top, and
        return it (None, and no write, when neither changed anything)."""
        async with self._lock(sandbox_id):
            try:
                if self._held.get(sandbox_id) is None and change is None:
                    return None
                # Reads see the folded record until it is written (it stays held till then).
                return await self._write(sandbox_id, change or (lambda _: None), self._held.get(sandbox_id))
            finally:
                self._unhold(sandbox_id)

    async def mutate(self, sandbox_id: SandboxId, change: Callable[[SandboxRecord], bool | None]) -> SandboxRecord:
        """Apply `change` to the current record and write it back (retrying lost CAS races); a
        held record's change is folded into memory instead (see `hold`).

        `change` edits the record in place; returning False means "nothing to write"."""
        async with self._lock(sandbox_id):
            if sandbox_id in self._held:
                record = await self._copy(sandbox_id)
                if record is None:
                    raise NotFoundError(f"sandbox {sandbox_id} not found")
                if change(record) is not False:
                    self._fold(sandbox_id, record)
                return record
            if self._rows is None:
                return await self._write(sandbox_id, change)
            sending = await self._send(sandbox_id, change)
        if isinstance(sending, SandboxRecord):
            return sending  # nothing to write
        try:
            return await self._written_as_sent(*sending)
        except ConflictError:  # a write sent before it failed: start over from the store
            async with self._lock(sandbox_id):
                return await self._write(sandbox_id, change)

    async def _write(
        self,
        sandbox_id: SandboxId,
        change: Callable[[SandboxRecord], bool | None],
        start: SandboxRecord | None = None,
    ) -> SandboxRecord:
        """Under the record's lock: `change` applied to `start` (else the current record), written."""
        for _ in range(_CAS_ATTEMPTS):
            sending, start = await self._send(sandbox_id, change, start), None
            if isinstance(sending, SandboxRecord):
                return sending
            try:
                return await self._written_as_sent(*sending)
            except ConflictError:
                continue  # read the row that won from the store
        raise ConflictError(f"sandbox {sandbox_id} kept changing; gave up after {_CAS_ATTEMPTS} attempts")

    async def _send(
        self,
        sandbox_id: SandboxId,
        change: Callable[[SandboxRecord], bool | None],
        start: SandboxRecord | None = None,
    ) -> SandboxRecord | tuple[SandboxRecord, asyncio.Future[StoredObject]]:
        """Under the record's lock: `change` applied to `start` (else the current record, as the
        writes already sent will leave it, with its deferred changes), and its write sent; the
        record alone when neither `change` nor a deferred change had anything to write."""
        deferred = self._undefer(sandbox_id)
        # A shared store's kept row may lag another replica's write: the swap then fails and
        # the next attempt reads the store (`_drop`).
        lagging = start is None and deferred is None and self._feed is not None
        record = start or deferred or await self._copy(sandbox_id, may_lag=lagging)
        if record is None:
            raise NotFoundError(f"sandbox {sandbox_id} not found")
        if change(record) is False and deferred is None:
            if not lagging:
                return record
            # "Nothing to write" is a decision no swap checks: take it on the store's record.
            record = await self._copy(sandbox_id)
            if record is None:
                raise NotFoundError(f"sandbox {sandbox_id} not found")
            if change(record) is False:
                return record
        payload = _encode(record)
        if self._rows is not None and (row := self._rows.get(sandbox_id)) is not None:
            # The store gives the row the next version (nothing else writes it).
            self._sent[sandbox_id] = dataclasses.replace(
                row, payload=payload, resource_version=record.resource_version + 1
            )
        # A task: it reaches the store before any write sent after it (tasks start in order).
        update = self._store.update(
            kind=KIND_SANDBOX, id=sandbox_id, expected_version=record.resource_version, payload=payload
        )
        sending = asyncio.ensure_future(self._fetched(update))
        # Cancelled before its first turn (the caller gone, a gateway stopping), `_fetched` never
        # awaited the store's call: closed here, it is not reported as a coroutine never awaited.
        sending.add_done_callback(lambda _: update.close())
        return record, sending

    async def _written_as_sent(self, record: SandboxRecord, sending: asyncio.Future[StoredObject]) -> SandboxRecord:
        """The record once its write is done (ConflictError when it lost, the row dropped)."""
        try:
            row = await sending
        except ConflictError:
            self._drop(record.id)
            raise
        except BaseException:
            self._sent.pop(record.id, None)  # the writes sent after it will lose their CAS
            raise
        if (sent := self._sent.get(record.id)) is not None and sent.resource_version <= row.resource_version:
            del self._sent[record.id]
        record.resource_version = row.resource_version
        if self._rows is not None and record.id in self._rows:
            # Only a row still kept is refreshed. A write's answer comes back through its task, a
            # loop turn after the store answered it, so a `remove` that the store ran just after
            # this write (a delete racing a resume's release) has already dropped the row: kept
            # again, it would be found by name forever while the store has none.
            self._keep(row, record)
        if self._feed is not None and self._feed.row(record.id) is row:
            self._decoded[record.id] = record
        # With a shared store the write's echo on the change feed may have told the watchers first.
        if self._feed is None or self._feed.tell(record.id, row.resource_version):
            self._bus.publish(record.id, _CHANGED)
        self._written(record)
        return record

    async def mutate_later(
        self, sandbox_id: SandboxId, change: Callable[[SandboxRecord], bool | None], *, within: float
    ) -> SandboxRecord:
        """`mutate`, with the write deferred (see the module doc): `change` is applied in memory
        now and written with the record's next write, or alone after `within` seconds. For a
        change whose loss in a crash is harmless or repaired (the next start relists the
        backend; what a check relies on is carried elsewhere too), never for one a check reads
        from the store. With a store shared by replicas, or while held, the same as `mutate`
        (held: folded into the create's write)."""
        if self._rows is None:
            return await self.mutate(sandbox_id, change)
        async with self._lock(sandbox_id):
            deferred = self._deferred.get(sandbox_id)
            record = deferred or await self._copy(sandbox_id)
            if record is None:
                raise NotFoundError(f"sandbox {sandbox_id} not found")
            if change(record) is False or deferred is not None:
                return record
            if sandbox_id in self._held:  # written with the create's result
                self._fold(sandbox_id, record)
                return record
            self._deferred[sandbox_id] = record
            loop = asyncio.get_running_loop()
            self._deferred_timers[sandbox_id] = loop.call_later(within, self._flush_soon, sandbox_id)
            return record

    def _undefer(self, sandbox_id: str) -> SandboxRecord | None:
        """Take the record's deferred changes (now to be written by the caller), if any."""
        if (timer := self._deferred_timers.pop(sandbox_id, None)) is not None:
            timer.cancel()
        return self._deferred.pop(sandbox_id, None)

    def _flush_soon(self, sandbox_id: str) -> None:
        """`within` passed with no other write: write the deferred changes alone."""
        self._deferred_timers.pop(sandbox_id, None)
        task = asyncio.get_running_loop().create_task(self._flush(SandboxId(sandbox_id)))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush(self, sandbox_id: SandboxId) -> None:
        if sandbox_id in self._deferred:
            with contextlib.suppress(NotFoundError):  # removed meanwhile: nothing to write
                await self.mutate(sandbox_id, lambda _: False)  # writes the deferred changes alone

    async def flush_deferred(self) -> None:
        """Write every deferred change now (a gateway stopping: nothing is left to a crash)."""
        await asyncio.gather(*self._flushes, return_exceptions=True)
        for sandbox_id in list(self._deferred):
            await self._flush(SandboxId(sandbox_id))

    async def remove(self, sandbox_id: SandboxId, beside: Sequence[tuple[str, str]] = ()) -> bool:
        """Delete the row, and the rows `beside` (kind, id) in the same statement, and tell watchers."""
        self._unhold(sandbox_id)  # first: even if the delete fails, nothing stays folded
        self._undefer(sandbox_id)
        removed = await self._store.delete(KIND_SANDBOX, sandbox_id, beside=beside)
        self._drop(sandbox_id)
        self._bus.forget(sandbox_id)
        return removed

    def heard_changed(self, sandbox_id: SandboxId, version: int) -> bool:
        """Another replica's write (or this one's echo) heard on the change feed, at `version`
        (0: not said); whether it is news to this replica's watchers."""
        return self._feed.heard(sandbox_id, version) if self._feed is not None else True

    def heard_removed(self, sandbox_id: SandboxId) -> None:
        """A delete heard on the change feed."""
        self._drop(sandbox_id)

    def feed_listening(self, up: bool) -> None:
        """The change feed is listening (again: anything may have changed) or was lost."""
        if self._feed is not None:
            self._feed.feed(up=up)
            self._decoded.clear()
