"""SQLite store (WAL): the embedded default. One connection, owned by one worker thread, so the
event loop never blocks on disk.

Every operation is one function run on that thread (one hop, no lock in the event loop), and the
worker takes whatever has queued up meanwhile as one batch: one transaction, one commit, one
wake-up of the event loop for all of them. A burst of creates therefore shares commits instead of
queueing behind each other's; a lone operation is a batch of one. Each write of a batch runs under
its own savepoint, so a write that fails (a duplicate name) is undone alone; a storage failure (a
full disk, I/O) fails the batch, and on a full disk the reserve is released and the batch tried
once more, so updates and deletes work when creates are refused (see `storage_errors`)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any, TypeVar

from warmshell.core.errors import AlreadyExistsError, ConflictError
from warmshell.core.models import now_ms
from warmshell.gateway.store.base import NewObject, StoredObject, rows_deleted
from warmshell.gateway.store.storage_errors import Reserve, is_full, translate

__all__ = ["SqliteStore", "open_sqlite_store"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    name TEXT NOT NULL,
    workspace TEXT NOT NULL,
    resource_version INTEGER NOT NULL,
    payload TEXT NOT NULL,
    updated_at_ms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (kind, id)
);
CREATE UNIQUE INDEX IF NOT EXISTS objects_by_name ON objects (kind, workspace, name);
"""
T = TypeVar("T")
_COLUMNS = "kind, id, name, workspace, resource_version, payload"


# Operations taken into one transaction at most; more wait for the next (bounds its length).
_BATCH_MAX = 64


def _row(row: sqlite3.Row | tuple[object, ...]) -> StoredObject:
    kind, id_, name, workspace, version, payload = row
    return StoredObject(str(kind), str(id_), str(name), str(workspace), int(str(version)), str(payload))


@dataclass
class _Op:
    """One store operation queued for the worker: `run` is called there with the connection."""

    run: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any]
    write: bool
    outcome: tuple[bool, Any] = field(default=(False, None))


def _outcome(op: _Op, conn: sqlite3.Connection) -> tuple[bool, Any]:
    """Run one operation on the worker; a constraint, the reserve or a lost compare-and-swap
    fails it alone, a storage failure (any other sqlite3 error) propagates to fail the batch."""
    try:
        return True, op.run(conn)
    except (sqlite3.IntegrityError, OSError, ConflictError) as exc:
        return False, exc


def _settle(batch: list[_Op]) -> None:
    """In the event loop: hand each operation's outcome to its waiter."""
    for op in batch:
        if op.future.done():  # the caller was cancelled; the operation ran anyway
            continue
        ok, value = op.outcome
        if ok:
            op.future.set_result(value)
        else:
            op.future.set_exception(value)


class SqliteStore:
    """`Store` on one SQLite file (see the module doc for how operations reach it)."""

    def __init__(self, conn: sqlite3.Connection, path: Path, loop: asyncio.AbstractEventLoop) -> None:
        self._conn = conn
        self._loop = loop
        self._directory = path.parent
        self._reserve = Reserve(path.with_name(path.name + ".reserve"))
        self._queue: SimpleQueue[_Op | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="warmshell-sqlite", daemon=True)
        self._thread.start()
        self._closed = False
        self.batches = 0
        """Transactions run so far (fewer than writes when writes arrived together)."""

    # -- the worker thread -----------------------------------------------------------------

    def _work(self) -> None:
        with contextlib.suppress(OSError):  # the thread's name in /proc, top and profilers (Linux)
            Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text("ws-sqlite")
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < _BATCH_MAX:
                try:
                    item = self._queue.get_nowait()
                except Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            try:
                self._run_batch(batch)
            except Exception as exc:  # a bug in an operation: fail its batch, keep the worker
                with contextlib.suppress(sqlite3.Error):
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                for op in batch:
                    op.outcome = (False, exc)
            self.batches += 1
            self._loop.call_soon_threadsafe(_settle, batch)
            if stop:
                return

    def _run_batch(self, batch: list[_Op]) -> None:
        conn = self._conn
        if not any(op.write for op in batch):
            for op in batch:
                try:
                    op.outcome = _outcome(op, conn)
                except sqlite3.Error as exc:  # a read fails alone
                    op.outcome = (False, exc)
            return
        savepoints = len(batch) > 1  # a lone write's failure undoes its whole transaction instead
        for attempt in (1, 2):
            try:
                conn.execute("BEGIN IMMEDIATE")
                for op in batch:
                    guarded = op.write and savepoints
                    if guarded:
                        conn.execute("SAVEPOINT op")
                    op.outcome = _outcome(op, conn)
                    if guarded:
                        if not op.outcome[0]:
                            conn.execute("ROLLBACK TO op")
                        conn.execute("RELEASE op")
                failed_alone = not savepoints and not batch[0].outcome[0]
                conn.execute("ROLLBACK" if failed_alone else "COMMIT")
                return
            except sqlite3.Error as exc:  # the storage failed: the batch did not happen
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if attempt == 1 and is_full(exc) and self._reserve._release():
                    continue
                for op in batch:
                    op.outcome = (False, exc)
                return

    # -- the event loop side ---------------------------------------------------------------

    async def _submit(self, run: Callable[[sqlite3.Connection], T], *, write: bool) -> T:
        future: asyncio.Future[T] = self._loop.create_future()
        self._queue.put(_Op(run, future, write))
        try:
            return await future
        except sqlite3.IntegrityError:
            raise
        except (sqlite3.Error, OSError) as exc:
            raise translate(exc, self._directory) from exc

    async def _fetch(self, query: str, args: tuple[object, ...]) -> list[StoredObject]:
        def run(conn: sqlite3.Connection) -> list[StoredObject]:
            return [_row(r) for r in conn.execute(query, args).fetchall()]

        return await self._submit(run, write=False)

    async def create(
        self, *, kind: str, id: str, name: str, workspace: str, payload: str, beside: Sequence[NewObject] = ()
    ) -> StoredObject:
        """Insert at resource_version 1, with `beside` in the same statement (all or none);
        RESOURCE_EXHAUSTED while the disk is too full to keep the reserve for updates and deletes."""
        written_ms = now_ms()
        query = f"INSERT INTO objects ({_COLUMNS}, updated_at_ms) VALUES " + ", ".join(
            ["(?, ?, ?, ?, 1, ?, ?)"] * (1 + len(beside))
        )
        args = [kind, id, name, workspace, payload, written_ms]
        for obj in beside:
            args += [obj.kind, obj.id, obj.name, obj.workspace, obj.payload, written_ms]

        def insert(conn: sqlite3.Connection) -> None:
            self._reserve._ensure()  # on this thread: a stat and a statvfs, no hop of their own
            conn.execute(query, args)

        try:
            await self._submit(insert, write=True)
        except sqlite3.IntegrityError as exc:
            raise AlreadyExistsError(f"{kind} {workspace}/{name} already exists") from exc
        return StoredObject(kind, id, name, workspace, 1, payload)

    async def get(self, kind: str, id: str) -> StoredObject | None:
        """Look up by id."""
        rows = await self._fetch(f"SELECT {_COLUMNS} FROM objects WHERE kind = ? AND id = ?", (kind, id))
        return rows[0] if rows else None

    async def get_by_name(self, kind: str, workspace: str, name: str) -> StoredObject | None:
        """Look up by (workspace, name)."""
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM objects WHERE kind = ? AND workspace = ? AND name = ?", (kind, workspace, name)
        )
        return rows[0] if rows else None

    async def list(self, kind: str, workspace: str | None = None) -> builtins.list[StoredObject]:
        """All objects of a kind, ordered by workspace and name."""
        query = f"SELECT {_COLUMNS} FROM objects WHERE kind = ?"
        args: tuple[str, ...] = (kind,)
        if workspace is not None:
            query += " AND workspace = ?"
            args = (kind, workspace)
        return await self._fetch(query + " ORDER BY workspace, name", args)

    async def update(self, *, kind: str, id: str, expected_version: int, payload: str) -> StoredObject:
        """Compare-and-swap the payload."""
        written_ms = now_ms()

        def change(conn: sqlite3.Connection) -> StoredObject:
            row = conn.execute(
                "UPDATE objects SET payload = ?, resource_version = resource_version + 1,"
                " updated_at_ms = ? WHERE kind = ? AND id = ? AND resource_version = ?"
                f" RETURNING {_COLUMNS}",
                (payload, written_ms, kind, id, expected_version),
            ).fetchone()
            if row is None:
                raise ConflictError(f"{kind} {id} is no longer at resource version {expected_version}")
            return _row(row)

        return await self._submit(change, write=True)

    async def delete(
        self, kind: str, id: str, expected_version: int | None = None, *, beside: Sequence[tuple[str, str]] = ()
    ) -> bool:
        """Delete (conditionally when expected_version is given), and `beside` (`rows_deleted`)."""
        if beside:
            return await self._delete_rows(rows_deleted(kind, id, expected_version, beside))
        query = "DELETE FROM objects WHERE kind = ? AND id = ?"
        args: tuple[object, ...] = (kind, id)
        if expected_version is not None:
            query, args = query + " AND resource_version = ?", (kind, id, expected_version)

        def remove(conn: sqlite3.Connection) -> bool:
            if conn.execute(query, args).rowcount > 0:
                return True
            exists = conn.execute("SELECT 1 FROM objects WHERE kind = ? AND id = ?", (kind, id)).fetchone()
            if exists is not None and expected_version is not None:
                raise ConflictError(f"{kind} {id} is no longer at resource version {expected_version}")
            return False

        return await self._submit(remove, write=True)

    async def _delete_rows(self, rows: builtins.list[tuple[str, str]]) -> bool:
        """Delete `rows` (kind, id) in one statement; whether the first was there."""
        query = "DELETE FROM objects WHERE (kind, id) IN (VALUES " + ", ".join(["(?, ?)"] * len(rows)) + ")"
        query += " RETURNING kind, id"
        args = [part for row in rows for part in row]

        def remove(conn: sqlite3.Connection) -> bool:
            return tuple(rows[0]) in {tuple(gone) for gone in conn.execute(query, args).fetchall()}

        return await self._submit(remove, write=True)

    async def dump(self) -> builtins.list[StoredObject]:
        """Every object of every kind."""
        return await self._fetch(f"SELECT {_COLUMNS} FROM objects ORDER BY kind, id", ())

    async def restore(self, obj: StoredObject) -> bool:
        """Write `obj` exactly (its resource_version too) unless the row is already as new."""
        written_ms = now_ms()

        def write(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                f"INSERT INTO objects ({_COLUMNS}, updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (kind, id) DO UPDATE SET name = excluded.name, workspace = excluded.workspace,"
                " resource_version = excluded.resource_version, payload = excluded.payload,"
                " updated_at_ms = excluded.updated_at_ms"
                " WHERE objects.resource_version < excluded.resource_version",
                (obj.kind, obj.id, obj.name, obj.workspace, obj.resource_version, obj.payload, written_ms),
            )
            return cursor.rowcount > 0

        try:
            return await self._submit(write, write=True)
        except sqlite3.IntegrityError as exc:
            raise AlreadyExistsError(
                f"{obj.kind} {obj.workspace}/{obj.name} already exists with another id than {obj.id}"
            ) from exc

    async def ping(self) -> None:
        """A file store is there while the gateway is: nothing to check."""

    async def aclose(self) -> None:
        """Close the connection (checkpointing the WAL) and end the worker."""
        if self._closed:
            return
        self._closed = True
        await self._submit(lambda conn: conn.close(), write=False)
        self._queue.put(None)
        await asyncio.to_thread(self._thread.join)


async def open_sqlite_store(path: Path) -> SqliteStore:
    """Open (creating if needed) the store file with WAL and owner-only permissions."""
    conn = await asyncio.to_thread(_open, path)
    return SqliteStore(conn, path, asyncio.get_running_loop())


def _open(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Transactions are begun and committed by the worker itself (isolation_level=None).
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    # WAL lets readers proceed during writes; synchronous=NORMAL is durable across process
    # crashes (the gateway's failure mode) at a fraction of FULL's fsync cost: a commit is a
    # write to the WAL, the fsync comes at checkpoints (bench/HISTORY.md weighs it).
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.executescript(_SCHEMA)
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{path}{suffix}", 0o600)
    return conn
