"""Storage failures become errors a user understands, never an unexplained sqlite3 class."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import asyncpg
import pytest

from warmshell.core.errors import ResourceExhaustedError, UnavailableError
from warmshell.gateway.store.storage_errors import is_full, translate, translate_postgres


def test_a_full_disk_is_resource_exhausted_naming_the_directory() -> None:
    for exc in (sqlite3.OperationalError("database or disk is full"), OSError(errno.ENOSPC, "No space left")):
        assert is_full(exc)
        error = translate(exc, Path("/srv/state"))
        assert isinstance(error, ResourceExhaustedError)
        assert "state store is full (no space left in /srv/state)" in str(error)
        assert "delete still work" in str(error)


def test_other_storage_failures_are_unavailable() -> None:
    error = translate(sqlite3.OperationalError("disk I/O error"), Path("/srv/state"))
    assert isinstance(error, UnavailableError)
    assert str(error) == "the gateway's state store failed (disk I/O error); retry later"
    assert not is_full(sqlite3.DatabaseError("database disk image is malformed"))


@pytest.mark.parametrize(
    ("exc", "kind", "words"),
    [
        (asyncpg.DiskFullError('could not extend file "base/1/2": No space left on device'), ResourceExhaustedError,
         "(Postgres at db:5432/ws) is out of disk space (could not extend file"),
        (asyncpg.OutOfMemoryError("out of memory"), ResourceExhaustedError, "is out of memory (out of memory)"),
        (asyncpg.InsufficientResourcesError("no"), ResourceExhaustedError, "is out of a resource (no)"),
        (asyncpg.ConfigurationLimitExceededError("max_locks"), ResourceExhaustedError, "hit a configured limit"),
        (asyncpg.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"), UnavailableError,
         "is read-only (a standby, or default_transaction_read_only): changes fail until a primary is back"),
        (asyncpg.exceptions.PostgresIOError("could not read block"), UnavailableError,
         "cannot read or write its files"),
        (asyncpg.DeadlockDetectedError("deadlock detected"), UnavailableError,
         "refused the operation: deadlock detected"),
    ],
)  # fmt: skip
def test_postgres_failures_in_a_users_words(exc: Exception, kind: type[Exception], words: str) -> None:
    error = translate_postgres(exc, "db:5432/ws")
    assert type(error) is kind
    assert str(error).startswith("the gateway's state store (Postgres at db:5432/ws)")
    assert words in str(error)
    assert "asyncpg" not in str(error)
