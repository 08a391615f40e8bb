"""Choosing a store from config: URL rules, where the password comes from, what may be shown of
a URL, and which schema migrations are still to run (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmshell.core.config import StoreConfig, load_config
from warmshell.core.errors import FailedPreconditionError, InvalidArgumentError
from warmshell.gateway.store import opening, postgres, schema, sqlite


def test_sqlite_stays_the_default() -> None:
    assert load_config(None).store.url.get_secret_value() == ""


def test_start_up_waits_for_an_unreachable_database_without_limit_by_default() -> None:
    assert load_config(None).store.startup_timeout_seconds == 0  # 0 = no limit
    assert load_config(None, {"store.startup_timeout_seconds": 30}).store.startup_timeout_seconds == 30
    with pytest.raises(InvalidArgumentError, match="startup_timeout_seconds"):
        load_config(None, {"store.startup_timeout_seconds": -1})


def test_start_up_progress_names_the_store_the_error_and_the_attempts() -> None:
    progress = postgres.StartupProgress(where="db:5432/ws")
    assert progress.problem() is None  # nothing failed yet
    progress.attempts, progress.last_error, progress.waited_seconds = 7, "connection refused", 9.6
    assert progress.problem() == (
        "the store (Postgres at db:5432/ws) is unreachable: connection refused"
        " (7 attempts in 10s so far; still retrying)"
    )


def test_an_unknown_scheme_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidArgumentError, match=r"store\.url") as caught:
        load_config(None, {"store.url": "mysql://db/warmshell"})
    assert "postgresql://" in str(caught.value)


def test_a_password_in_the_url_never_shows_in_the_config() -> None:
    config = load_config(None, {"store.url": "postgresql://u:s3cret-pw@db:5432/warmshell"})
    assert "s3cret-pw" not in repr(config)
    assert "s3cret-pw" not in str(config.model_dump())


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://user:s3cret@db.example:6543/ws", "db.example:6543/ws"),
        ("postgresql://user@10.0.0.1/warmshell", "10.0.0.1:5432/warmshell"),
        ("postgres://:pw@[::1]:5433/x?sslmode=require", "[::1]:5433/x"),
        ("postgresql://u:pw@db1:5432,db2:5432/ws", "db1:5432,db2:5432/ws"),
    ],
)
def test_describe_url_shows_host_port_and_database_only(url: str, shown: str) -> None:
    assert postgres.describe_url(url) == shown


async def test_password_file_wins_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(opening.PASSWORD_ENV, "from-env")
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    assert await opening.read_password(StoreConfig(password_file=str(secret))) == "from-file"
    assert await opening.read_password(StoreConfig()) == "from-env"
    monkeypatch.delenv(opening.PASSWORD_ENV)
    assert await opening.read_password(StoreConfig()) is None


async def test_an_unreadable_password_file_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"store\.password_file: cannot read it"):
        await opening.read_password(StoreConfig(password_file=str(tmp_path / "absent")))


async def test_sqlite_urls_name_an_absolute_path(tmp_path: Path) -> None:
    store = await opening.open_url(f"sqlite://{tmp_path}/s.db")
    try:
        assert isinstance(store, sqlite.SqliteStore)
        assert (tmp_path / "s.db").exists()
    finally:
        await store.aclose()
    with pytest.raises(InvalidArgumentError, match="absolute path"):
        await opening.open_url("sqlite://relative.db")
    with pytest.raises(InvalidArgumentError, match="must start with"):
        await opening.open_url("redis://x")


M1, M2, M3 = (schema.Migration(v, f"m{v}", "") for v in (1, 2, 3))


def test_pending_migrations_are_the_missing_ones_in_order() -> None:
    assert schema.pending_migrations(set(), [M2, M1, M3]) == [M1, M2, M3]
    assert schema.pending_migrations({1}, [M1, M2, M3]) == [M2, M3]
    assert schema.pending_migrations({1, 2, 3}, [M1, M2, M3]) == []


def test_a_schema_from_a_newer_gateway_is_refused() -> None:
    with pytest.raises(FailedPreconditionError, match="version 4, newer than this gateway knows"):
        schema.pending_migrations({1, 4}, [M1, M2])


def test_shipped_migrations_are_numbered_from_one_without_gaps() -> None:
    assert [m.version for m in schema.MIGRATIONS] == list(range(1, len(schema.MIGRATIONS) + 1))


def test_pool_bounds_are_checked_naming_both_fields() -> None:
    with pytest.raises(InvalidArgumentError, match=r"pool_min_size \(5\) must not exceed pool_max_size \(2\)"):
        load_config(None, {"store.pool_min_size": 5, "store.pool_max_size": 2})
