"""SQLite store (WAL): the embedded default. One connection, writes serialised by aiosqlite's
worker thread, so the event loop never blocks on disk."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import sqlite3
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TypeVar

import aiosqlite

from warmshell.core.errors import AlreadyExistsError, ConflictError
from warmshell.core.models import now_ms
from warmshell.gateway.store.base import StoredObject
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


def _row(row: sqlite3.Row | tuple[object, ...]) -> StoredObject:
    kind, id_, name, workspace, version, payload = row
    return StoredObject(str(kind), str(id_), str(name), str(workspace), int(str(version)), str(payload))


class SqliteStore:
    """`Store` on one SQLite file.

    Every operation runs under one asyncio lock and fetches its rows in the same worker-thread
    hop: an open cursor from one coroutine and a commit from another would otherwise interleave on
    the shared connection ("cannot commit transaction - SQL statements in progress")."""

    def __init__(self, conn: aiosqlite.Connection, path: Path) -> None:
        self._conn = conn
        self._lock = asyncio.Lock()
        self._directory = path.parent
        self._reserve = Reserve(path.with_name(path.name + ".reserve"))

    async def _fetch(self, query: str, args: tuple[object, ...]) -> list[StoredObject]:
        async with self._lock:
            try:
                rows = await self._conn.execute_fetchall(query, args)
            except sqlite3.Error as exc:
                raise translate(exc, self._directory) from exc
        return [_row(tuple(r)) for r in rows]

    async def _write(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run one write transaction (under the lock); on a full disk release the reserve and try
        once more, so updates and deletes work when creates are refused."""
        for attempt in (1, 2):
            try:
                return await work()
            except sqlite3.IntegrityError:
                await self._conn.rollback()
                raise
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    await self._conn.rollback()
                if attempt == 1 and is_full(exc) and await self._reserve.release():
                    continue
                raise translate(exc, self._directory) from exc
        raise AssertionError("unreachable")

    async def create(self, *, kind: str, id: str, name: str, workspace: str, payload: str) -> StoredObject:
        """Insert at resource_version 1; RESOURCE_EXHAUSTED while the disk is too full to keep
        the reserve for updates and deletes."""

        async def insert() -> None:
            await self._conn.execute(
                f"INSERT INTO objects ({_COLUMNS}, updated_at_ms) VALUES (?, ?, ?, ?, 1, ?, ?)",
                (kind, id, name, workspace, payload, now_ms()),
            )
            await self._conn.commit()

        async with self._lock:
            try:
                await self._reserve.ensure()
            except OSError as exc:
                raise translate(exc, self._directory) from exc
            try:
                await self._write(insert)
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

        async def change() -> Iterable[sqlite3.Row]:
            rows = await self._conn.execute_fetchall(
                "UPDATE objects SET payload = ?, resource_version = resource_version + 1,"
                " updated_at_ms = ? WHERE kind = ? AND id = ? AND resource_version = ?"
                f" RETURNING {_COLUMNS}",
                (payload, now_ms(), kind, id, expected_version),
            )
            await self._conn.commit()
            return rows

        async with self._lock:
            rows = await self._write(change)
        if not rows:
            raise ConflictError(f"{kind} {id} is no longer at resource version {expected_version}")
        return _row(tuple(next(iter(rows))))

    async def delete(self, kind: str, id: str, expected_version: int | None = None) -> bool:
        """Delete (conditionally when expected_version is given)."""
        query = "DELETE FROM objects WHERE kind = ? AND id = ?"
        args: tuple[object, ...] = (kind, id)
        if expected_version is not None:
            query, args = query + " AND resource_version = ?", (kind, id, expected_version)

        async def remove() -> bool:
            cursor = await self._conn.execute(query, args)
            removed = cursor.rowcount > 0
            await cursor.close()
            await self._conn.commit()
            return removed

        async with self._lock:
            deleted = await self._write(remove)
        if not deleted and expected_version is not None and await self.get(kind, id):
            raise ConflictError(f"{kind} {id} is no longer at resource version {expected_version}")
        return deleted

    async def dump(self) -> builtins.list[StoredObject]:
        """Every object of every kind."""
        return await self._fetch(f"SELECT {_COLUMNS} FROM objects ORDER BY kind, id", ())

    async def restore(self, obj: StoredObject) -> bool:
        """Write `obj` exactly (its resource_version too) unless the row is already as new."""
        async with self._lock:
            try:
                cursor = await self._conn.execute(
                    f"INSERT INTO objects ({_COLUMNS}, updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (kind, id) DO UPDATE SET name = excluded.name, workspace = excluded.workspace,"
                    " resource_version = excluded.resource_version, payload = excluded.payload,"
                    " updated_at_ms = excluded.updated_at_ms"
                    " WHERE objects.resource_version < excluded.resource_version",
                    (obj.kind, obj.id, obj.name, obj.workspace, obj.resource_version, obj.payload, now_ms()),
                )
                written = cursor.rowcount > 0
                await cursor.close()
                await self._conn.commit()
            except sqlite3.IntegrityError as exc:
                await self._conn.rollback()
                raise AlreadyExistsError(
                    f"{obj.kind} {obj.workspace}/{obj.name} already exists with another id than {obj.id}"
                ) from exc
        return written

    async def ping(self) -> None:
        """A file store is there while the gateway is: nothing to check."""

    async def aclose(self) -> None:
        """Close the connection (checkpointing the WAL)."""
        async with self._lock:
            await self._conn.close()


async def open_sqlite_store(path: Path) -> SqliteStore:
    """Open (creating if needed) the store file with WAL and owner-only permissions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = await aiosqlite.connect(path)
    # WAL lets readers proceed during writes; synchronous=NORMAL is durable across process
    # crashes (the gateway's failure mode) at a fraction of FULL's fsync cost.
    await conn.execute("PRAGMA journal_mode=WAL")
    await conn.execute("PRAGMA synchronous=NORMAL")
    await conn.execute("PRAGMA busy_timeout=5000")
    await conn.executescript(_SCHEMA)
    await conn.commit()
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{path}{suffix}", 0o600)
    return SqliteStore(conn, path)
