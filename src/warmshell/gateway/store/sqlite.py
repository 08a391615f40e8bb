"""SQLite store (WAL): the embedded default. One connection, writes serialised by aiosqlite's
worker thread, so the event loop never blocks on disk."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

import aiosqlite

from warmshell.core.errors import AlreadyExistsError, ConflictError
from warmshell.core.models import now_ms
from warmshell.gateway.store.base import StoredObject

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
_COLUMNS = "kind, id, name, workspace, resource_version, payload"


def _row(row: sqlite3.Row | tuple[object, ...]) -> StoredObject:
    kind, id_, name, workspace, version, payload = row
    return StoredObject(str(kind), str(id_), str(name), str(workspace), int(str(version)), str(payload))


class SqliteStore:
    """`Store` on one SQLite file."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    async def create(self, *, kind: str, id: str, name: str, workspace: str, payload: str) -> StoredObject:
        """Insert at resource_version 1."""
        try:
            await self._conn.execute(
                f"INSERT INTO objects ({_COLUMNS}, updated_at_ms) VALUES (?, ?, ?, ?, 1, ?, ?)",
                (kind, id, name, workspace, payload, now_ms()),
            )
            await self._conn.commit()
        except sqlite3.IntegrityError as exc:
            await self._conn.rollback()
            raise AlreadyExistsError(f"{kind} {workspace}/{name} already exists") from exc
        return StoredObject(kind, id, name, workspace, 1, payload)

    async def get(self, kind: str, id: str) -> StoredObject | None:
        """Look up by id."""
        async with self._conn.execute(
            f"SELECT {_COLUMNS} FROM objects WHERE kind = ? AND id = ?", (kind, id)
        ) as cursor:
            row = await cursor.fetchone()
        return _row(row) if row else None

    async def get_by_name(self, kind: str, workspace: str, name: str) -> StoredObject | None:
        """Look up by (workspace, name)."""
        async with self._conn.execute(
            f"SELECT {_COLUMNS} FROM objects WHERE kind = ? AND workspace = ? AND name = ?",
            (kind, workspace, name),
        ) as cursor:
            row = await cursor.fetchone()
        return _row(row) if row else None

    async def list(self, kind: str, workspace: str | None = None) -> list[StoredObject]:
        """All objects of a kind, ordered by workspace and name."""
        query = f"SELECT {_COLUMNS} FROM objects WHERE kind = ?"
        args: tuple[str, ...] = (kind,)
        if workspace is not None:
            query += " AND workspace = ?"
            args = (kind, workspace)
        async with self._conn.execute(query + " ORDER BY workspace, name", args) as cursor:
            rows = await cursor.fetchall()
        return [_row(r) for r in rows]

    async def update(self, *, kind: str, id: str, expected_version: int, payload: str) -> StoredObject:
        """Compare-and-swap the payload."""
        async with self._conn.execute(
            "UPDATE objects SET payload = ?, resource_version = resource_version + 1,"
            " updated_at_ms = ? WHERE kind = ? AND id = ? AND resource_version = ?"
            f" RETURNING {_COLUMNS}",
            (payload, now_ms(), kind, id, expected_version),
        ) as cursor:
            row = await cursor.fetchone()
        await self._conn.commit()
        if row is None:
            raise ConflictError(f"{kind} {id} is no longer at resource version {expected_version}")
        return _row(row)

    async def delete(self, kind: str, id: str, expected_version: int | None = None) -> bool:
        """Delete (conditionally when expected_version is given)."""
        if expected_version is None:
            cursor = await self._conn.execute("DELETE FROM objects WHERE kind = ? AND id = ?", (kind, id))
        else:
            cursor = await self._conn.execute(
                "DELETE FROM objects WHERE kind = ? AND id = ? AND resource_version = ?",
                (kind, id, expected_version),
            )
        await self._conn.commit()
        if cursor.rowcount == 0 and expected_version is not None and await self.get(kind, id):
            raise ConflictError(f"{kind} {id} is no longer at resource version {expected_version}")
        return cursor.rowcount > 0

    async def aclose(self) -> None:
        """Close the connection (checkpointing the WAL)."""
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
    return SqliteStore(conn)
