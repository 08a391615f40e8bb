"""Fixtures: one real Postgres for the session, and each store test run against both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.postgres import DevPostgres, dev_postgres_server
from warmshell.core.config import StoreConfig
from warmshell.gateway.store import postgres, sqlite
from warmshell.gateway.store.base import Store

# Tests fail fast on a database that is down instead of waiting out the production start-up budget.
SETTINGS = StoreConfig(pool_max_size=8, connect_timeout_seconds=3.0, startup_timeout_seconds=5.0)

OpenStore = Callable[[], Awaitable[Store]]


@pytest.fixture(scope="session")
def dev_postgres() -> Iterator[DevPostgres]:
    with dev_postgres_server() as server:
        yield server


@pytest.fixture
def own_postgres() -> Iterator[DevPostgres]:
    """A server of this test's own, to stop and start under a client."""
    with dev_postgres_server() as server:
        yield server


@pytest.fixture
async def postgres_url(dev_postgres: DevPostgres) -> AsyncIterator[str]:
    """A fresh database on the session's server."""
    url = await dev_postgres.create_database()
    try:
        yield url
    finally:
        await dev_postgres.drop_database(url)


@pytest.fixture(params=["sqlite", "postgres"])
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenStore]:
    """Opens a store on this test's backend; every call opens another client of the same data
    (a second gateway replica), and all are closed after the test."""
    opened: list[Store] = []
    if request.param == "sqlite":

        async def opener() -> Store:
            opened.append(await sqlite.open_sqlite_store(tmp_path / "warmshell.db"))
            return opened[-1]

    else:
        server: DevPostgres = request.getfixturevalue("dev_postgres")
        url = await server.create_database()

        async def opener() -> Store:
            opened.append(await postgres.open_postgres_store(url, password=server.password, config=SETTINGS))
            return opened[-1]

    try:
        yield opener
    finally:
        for store in opened:
            await store.aclose()
        if request.param == "postgres":
            await server.drop_database(url)


@pytest.fixture
async def store(open_store: OpenStore) -> Store:
    return await open_store()
