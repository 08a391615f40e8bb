"""Storage failures become errors a user understands, never an unexplained sqlite3 class."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from warmshell.core.errors import ResourceExhaustedError, UnavailableError
from warmshell.gateway.store.storage_errors import is_full, translate


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
