"""A real Postgres for tests, started the way a user starts one (`scripts/dev-postgres`), on
loopback and a free port, with a fresh database per test."""

from __future__ import annotations

import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg

__all__ = ["DevPostgres", "dev_postgres_server"]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "dev-postgres"
TIMEOUT_SECONDS = 120.0


def _run(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False
    )
    assert result.returncode == 0, f"dev-postgres {' '.join(args)} failed:\n{result.stdout}{result.stderr}"
    return result.stdout


@dataclass
class DevPostgres:
    """One running server (its own data directory) and the superuser's credentials."""

    base: Path
    url: str  # without the password, as the script prints it

    @property
    def password_file(self) -> Path:
        return self.base / "password"

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    def url_for(self, database: str) -> str:
        return self.url.rsplit("/", 1)[0] + "/" + database

    def stop(self, *, keep: bool = False) -> None:
        """Stop the server (keep=True: `restart()` brings it back on the same port)."""
        _run("stop", "--dir", str(self.base), *(["--keep"] if keep else []))

    def restart(self) -> None:
        _run("start", "--dir", str(self.base))

    async def create_database(self) -> str:
        """A new empty database; returns its URL (password not included)."""
        name = f"t_{secrets.token_hex(6)}"
        conn = await asyncpg.connect(self.url, password=self.password)
        try:
            await conn.execute(f"CREATE DATABASE {name}")
        finally:
            await conn.close()
        return self.url_for(name)

    async def drop_database(self, url: str) -> None:
        conn = await asyncpg.connect(self.url, password=self.password)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")
        finally:
            await conn.close()


@contextmanager
def dev_postgres_server() -> Iterator[DevPostgres]:
    """A server in a new directory under the system temp dir (which the unprivileged server user
    can traverse; pytest's own temp dirs are owner-only), stopped and removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="warmshell-test-postgres-"))
    url = _run("start", "--dir", str(base)).strip().splitlines()[0]
    try:
        yield DevPostgres(base=base, url=url)
    finally:
        _run("stop", "--dir", str(base))
