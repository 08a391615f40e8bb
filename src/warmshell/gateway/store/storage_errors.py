"""What the stores do when their disk is full or failing: errors a user understands, and (SQLite)
a reserve of space so that updates and deletes (which free space) still work when the disk is full.

Postgres says what failed in its SQLSTATE (`translate_postgres`): an exhausted resource on the
server (disk full, out of memory) is RESOURCE_EXHAUSTED; a read-only server (a standby after a
failover, `default_transaction_read_only`) or one failing its own I/O is UNAVAILABLE. The space
reserve is the database server's business there; a delete needs little of it.

The reserve is a file of `RESERVE_BYTES` beside the database. Creates need it in place and as
much again free (else the disk is full: RESOURCE_EXHAUSTED, naming the directory); an update or
a delete that hits SQLITE_FULL releases it and tries once more. So once the disk fills up, get,
list and delete keep working, and a delete that frees space lets the reserve, then creates, back.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
from pathlib import Path

from warmshell.core.errors import ResourceExhaustedError, UnavailableError, WarmshellError

__all__ = ["RESERVE_BYTES", "Reserve", "is_full", "translate", "translate_postgres"]

RESERVE_BYTES = 4 * 1024 * 1024
_FULL_CODES = {getattr(sqlite3, "SQLITE_FULL", 13)}
# SQLSTATEs (https://www.postgresql.org/docs/current/errcodes-appendix.html) in a user's words.
_PG_EXHAUSTED = {
    "53100": "is out of disk space",  # disk_full
    "53200": "is out of memory",  # out_of_memory
    "53400": "hit a configured limit",  # configuration_limit_exceeded
}
_PG_UNAVAILABLE = {
    "25006": "is read-only (a standby, or default_transaction_read_only): changes fail until a primary is back",
    "58030": "cannot read or write its files (an I/O error on the database server)",
}


def is_full(exc: BaseException) -> bool:
    """Whether an error from SQLite (or the file system) means the disk is full."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        return (code is not None and code & 0xFF in _FULL_CODES) or "disk is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def translate(exc: BaseException, directory: Path) -> WarmshellError:
    """The domain error for a storage failure (never an unexplained sqlite3 class)."""
    if is_full(exc):
        return ResourceExhaustedError(
            f"the gateway's state store is full (no space left in {directory}); "
            "get, list and delete still work — delete sandboxes or free space there"
        )
    return UnavailableError(f"the gateway's state store failed ({exc}); retry later")


def translate_postgres(exc: BaseException, where: str) -> WarmshellError:
    """The domain error for a failure the Postgres server reported (an asyncpg PostgresError,
    read by its `sqlstate`, so this module needs no asyncpg)."""
    state = str(getattr(exc, "sqlstate", "") or "")
    detail = str(exc) or type(exc).__name__
    store = f"the gateway's state store (Postgres at {where})"
    if state.startswith("53"):  # class 53, insufficient resources
        what = _PG_EXHAUSTED.get(state, "is out of a resource")
        return ResourceExhaustedError(
            f"{store} {what} ({detail}); get and list still work — the database server needs room"
        )
    if state in _PG_UNAVAILABLE:
        return UnavailableError(f"{store} {_PG_UNAVAILABLE[state]} ({detail}); retry later")
    return UnavailableError(f"{store} refused the operation: {detail}")


class Reserve:
    """The file that keeps room for updates and deletes on a full disk."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _present(self) -> bool:
        try:
            return self.path.stat().st_size >= RESERVE_BYTES
        except FileNotFoundError:
            return False

    def _make(self) -> None:
        partial = self.path.with_suffix(".tmp")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
            partial.replace(self.path)
        except OSError:
            partial.unlink(missing_ok=True)
            raise

    def _ensure(self) -> None:
        if not self._present():
            self._make()
        # And as much again free: a create also writes the sandbox's files beside the store.
        free = os.statvfs(self.path.parent)
        if free.f_bavail * free.f_frsize < RESERVE_BYTES:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path.parent))

    async def ensure(self) -> None:
        """Make sure the reserve is in place; OSError (ENOSPC) when it cannot be."""
        await asyncio.to_thread(self._ensure)

    def _release(self) -> bool:
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True

    async def release(self) -> bool:
        """Free the reserve's space; True when there was one to free."""
        return await asyncio.to_thread(self._release)
