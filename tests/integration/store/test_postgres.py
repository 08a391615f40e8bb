"""What only the Postgres store has: schema migrations under an advisory lock, a pool that reports
an unreachable database in plain words, and recovery by itself when the database returns."""

from __future__ import annotations

import asyncio
import socket
import time

import asyncpg
import pytest

from tests.helpers.postgres import DevPostgres
from tests.integration.store.conftest import SETTINGS
from warmshell.core.errors import FailedPreconditionError, UnavailableError
from warmshell.gateway.store import postgres, schema


async def _applied_versions(url: str, password: str) -> list[int]:
    conn = await asyncpg.connect(url, password=password)
    try:
        return [int(r["version"]) for r in await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")]
    finally:
        await conn.close()


async def test_concurrent_starts_apply_each_migration_once(dev_postgres: DevPostgres, postgres_url: str) -> None:
    stores = await asyncio.gather(
        *(postgres.open_postgres_store(postgres_url, password=dev_postgres.password, config=SETTINGS) for _ in range(4))
    )
    try:
        await stores[0].create(kind="sandbox", id="1", name="a", workspace="default", payload="{}")
        assert await stores[3].get("sandbox", "1") is not None
    finally:
        for store in stores:
            await store.aclose()
    assert await _applied_versions(postgres_url, dev_postgres.password) == [m.version for m in schema.MIGRATIONS]


async def test_the_advisory_lock_serialises_migrations(dev_postgres: DevPostgres, postgres_url: str) -> None:
    """Slow, non-idempotent steps on two connections at once: without the lock the second would
    fail on the table the first created, or apply the steps a second time."""
    steps = (
        schema.Migration(1, "slow", "SELECT pg_sleep(0.5); CREATE TABLE only_once (x int)"),
        schema.Migration(2, "counts", "INSERT INTO only_once VALUES (1)"),
    )
    conns = [await asyncpg.connect(postgres_url, password=dev_postgres.password) for _ in range(2)]
    try:
        results = await asyncio.gather(*(schema.apply_migrations(c, steps) for c in conns))
        assert sorted(results) == [[], [1, 2]]
        assert await conns[0].fetchval("SELECT count(*) FROM only_once") == 1
    finally:
        for conn in conns:
            await conn.close()


async def test_a_schema_newer_than_this_gateway_is_refused(dev_postgres: DevPostgres, postgres_url: str) -> None:
    store = await postgres.open_postgres_store(postgres_url, password=dev_postgres.password, config=SETTINGS)
    await store.aclose()
    conn = await asyncpg.connect(postgres_url, password=dev_postgres.password)
    try:
        await conn.execute("INSERT INTO schema_migrations (version, description) VALUES (99, 'from the future')")
    finally:
        await conn.close()
    with pytest.raises(FailedPreconditionError, match=r"version 99, newer .* upgrade this gateway"):
        await postgres.open_postgres_store(postgres_url, password=dev_postgres.password, config=SETTINGS)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_an_unreachable_database_at_start_is_named_and_retried_until_the_budget() -> None:
    url = f"postgresql://warmshell@127.0.0.1:{_closed_port()}/warmshell"
    settings = SETTINGS.model_copy(update={"startup_timeout_seconds": 1.0})
    started = time.monotonic()
    with pytest.raises(UnavailableError) as caught:
        await postgres.open_postgres_store(url, password="hunter2-secret", config=settings)
    message = str(caught.value)
    assert "Postgres at 127.0.0.1:" in message
    assert "connection refused" in message
    assert "attempts" in message
    assert "hunter2-secret" not in message
    assert 0.5 <= time.monotonic() - started < 5


async def test_with_no_start_up_limit_an_unreachable_database_is_retried_quietly_until_cancelled(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """startup_timeout_seconds = 0 (the default): no giving up; progress says how it goes; the
    log has a line for each of the first few attempts, then at most one per quiet period."""
    monkeypatch.setattr(postgres, "_STARTUP_RETRY_DELAYS", (0.01,))
    url = f"postgresql://warmshell@127.0.0.1:{_closed_port()}/warmshell"
    settings = SETTINGS.model_copy(update={"startup_timeout_seconds": 0.0})
    progress = postgres.StartupProgress()
    caplog.set_level("DEBUG", logger=postgres.__name__)
    opening = asyncio.create_task(
        postgres.open_postgres_store(url, password="hunter2-secret", config=settings, progress=progress)
    )
    async with asyncio.timeout(30):
        while progress.attempts < 40:
            assert not opening.done(), opening
            await asyncio.sleep(0.01)
    problem = progress.problem()
    assert problem is not None
    assert problem.startswith(
        f"the store (Postgres at {postgres.describe_url(url)}) is unreachable: connection refused"
    )
    assert "attempts in" in problem
    assert "hunter2-secret" not in problem
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == postgres._LOGGED_ATTEMPTS, warnings  # the quiet period (30 s) has not passed
    assert "logged every 30s from now on" in warnings[-1]
    assert not any("hunter2-secret" in r.getMessage() for r in caplog.records)


async def test_wrong_password_fails_at_once_without_echoing_it(dev_postgres: DevPostgres) -> None:
    started = time.monotonic()
    with pytest.raises(FailedPreconditionError, match="refused this gateway") as caught:
        await postgres.open_postgres_store(dev_postgres.url, password="not-the-password", config=SETTINGS)
    assert "not-the-password" not in str(caught.value)
    assert time.monotonic() - started < SETTINGS.startup_timeout_seconds


async def test_outage_is_unavailable_and_the_pool_recovers_by_itself(own_postgres: DevPostgres) -> None:
    store = await postgres.open_postgres_store(own_postgres.url, password=own_postgres.password, config=SETTINGS)
    try:
        await store.create(kind="sandbox", id="1", name="a", workspace="default", payload="{}")
        own_postgres.stop(keep=True)
        with pytest.raises(UnavailableError, match=r"Postgres at 127\.0\.0\.1:\d+/warmshell\) is unreachable"):
            await store.get("sandbox", "1")
        with pytest.raises(UnavailableError, match="connection refused"):
            await store.ping()
        with pytest.raises(UnavailableError):
            await store.create(kind="sandbox", id="2", name="b", workspace="default", payload="{}")
        own_postgres.restart()
        await store.ping()  # no reopen: the pool reconnects on its own
        row = await store.get("sandbox", "1")
        assert row is not None
        assert (await store.update(kind="sandbox", id="1", expected_version=1, payload="{}")).resource_version == 2
        assert await store.get("sandbox", "2") is None  # the create during the outage did not half-happen
    finally:
        await store.aclose()


async def test_a_database_turned_read_only_refuses_writes_in_plain_words(
    dev_postgres: DevPostgres, postgres_url: str
) -> None:
    """What a client sees after a failover to a standby: reads work, writes are UNAVAILABLE with
    the server's reason (never an asyncpg exception escaping to the caller); a start refuses."""
    store = await postgres.open_postgres_store(postgres_url, password=dev_postgres.password, config=SETTINGS)
    database = postgres_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(dev_postgres.url, password=dev_postgres.password)
    try:
        await store.create(kind="sandbox", id="1", name="a", workspace="default", payload="{}")
        await admin.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            database,
        )
        # The pooled connection was terminated under the store: a read retries on a fresh one.
        assert await store.get("sandbox", "1") is not None
        with pytest.raises(UnavailableError, match=r"is read-only \(a standby.*cannot execute INSERT in a read-only"):
            await store.create(kind="sandbox", id="2", name="b", workspace="default", payload="{}")
        with pytest.raises(UnavailableError, match="read-only"):
            await store.update(kind="sandbox", id="1", expected_version=1, payload="{}")
        with pytest.raises(FailedPreconditionError, match="could not be prepared: cannot execute CREATE TABLE"):
            await postgres.open_postgres_store(postgres_url, password=dev_postgres.password, config=SETTINGS)
    finally:
        await store.aclose()
        await admin.execute(f"ALTER DATABASE {database} RESET default_transaction_read_only")
        await admin.close()
