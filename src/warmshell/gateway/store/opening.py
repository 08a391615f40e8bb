"""Choosing and opening the store from `[store]` in the gateway config (or a URL given on the
command line): SQLite in the state directory unless a URL names another."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from warmshell.core.config import StoreConfig
from warmshell.core.errors import InvalidArgumentError
from warmshell.gateway.store import postgres, sqlite
from warmshell.gateway.store.base import Store

__all__ = ["PASSWORD_ENV", "open_store", "open_url", "read_password", "read_url"]

PASSWORD_ENV = "WARMSHELL_STORE_PASSWORD"
_SQLITE = "sqlite://"


async def read_password(config: StoreConfig) -> str | None:
    """`password_file`'s content, else $WARMSHELL_STORE_PASSWORD, else None (the URL's own, or
    libpq's PGPASSWORD / ~/.pgpass as asyncpg reads them)."""
    if config.password_file:
        try:
            text = await asyncio.to_thread(Path(config.password_file).read_text)
        except OSError as exc:
            raise InvalidArgumentError("store.password_file", f"cannot read it: {exc.strerror}") from exc
        return text.rstrip("\r\n")
    return os.environ.get(PASSWORD_ENV) or None


async def open_url(
    url: str, config: StoreConfig | None = None, *, progress: postgres.StartupProgress | None = None
) -> Store:
    """Open `sqlite:///PATH` (everything after `sqlite://` is the path) or `postgresql://…`
    (`progress`: how waiting for an unreachable Postgres is going, see `open_postgres_store`)."""
    config = config or StoreConfig()
    if url.startswith(_SQLITE):
        path = url.removeprefix(_SQLITE)
        if not path.startswith("/"):
            raise InvalidArgumentError("store url", "sqlite URLs name an absolute path: sqlite:///path/to/warmshell.db")
        return await sqlite.open_sqlite_store(Path(path))
    if url.startswith(("postgresql://", "postgres://")):
        return await postgres.open_postgres_store(
            url, password=await read_password(config), config=config, progress=progress
        )
    raise InvalidArgumentError("store url", 'must start with "sqlite:///" or "postgresql://"')


async def read_url(config: StoreConfig) -> str:
    """`url_file`'s content (never shown: it may hold a password), else `url`."""
    if not config.url_file:
        return config.url.get_secret_value()
    try:
        text = await asyncio.to_thread(Path(config.url_file).read_text)
    except OSError as exc:
        raise InvalidArgumentError("store.url_file", f"cannot read it: {exc.strerror}") from exc
    url = text.strip()
    if not url.startswith((_SQLITE, "postgresql://", "postgres://")):
        raise InvalidArgumentError("store.url_file", 'must hold a "sqlite:///" or "postgresql://" URL')
    return url


async def open_store(
    config: StoreConfig, *, default_sqlite: Path, progress: postgres.StartupProgress | None = None
) -> Store:
    """The configured store; SQLite at `default_sqlite` when no URL is set."""
    url = await read_url(config)
    if not url:
        return await sqlite.open_sqlite_store(default_sqlite)
    return await open_url(url, config, progress=progress)
