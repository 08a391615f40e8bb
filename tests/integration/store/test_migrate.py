"""`warmshell store migrate`: a SQLite state copied into a real Postgres, versions kept, safe to rerun."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.helpers.cli import warmshell_executable
from tests.helpers.postgres import DevPostgres
from tests.integration.store.conftest import SETTINGS
from warmshell.core.config import StoreConfig
from warmshell.gateway.store import migrate, postgres, sqlite


async def _fill_sqlite(path: Path) -> None:
    store = await sqlite.open_sqlite_store(path)
    try:
        await store.create(kind="sandbox", id="s1", name="one", workspace="default", payload='{"n":1}')
        await store.create(kind="sandbox", id="s2", name="two", workspace="team", payload='{"n":2}')
        for version in range(1, 5):  # s2 ends at resource_version 5
            await store.update(kind="sandbox", id="s2", expected_version=version, payload=f'{{"n":{version}}}')
        await store.create(kind="pool", id="p1", name="python", workspace="default", payload="{}")
    finally:
        await store.aclose()


async def test_copy_keeps_every_row_and_version_and_reruns_as_a_no_op(
    tmp_path: Path, dev_postgres: DevPostgres, postgres_url: str
) -> None:
    source_path = tmp_path / "warmshell.db"
    await _fill_sqlite(source_path)
    from_url = f"sqlite://{source_path}"
    to_config = StoreConfig(password_file=str(dev_postgres.password_file))

    first = await migrate.migrate(from_url, postgres_url, to_config=to_config)
    assert (first.written, first.total_unchanged) == ({"pool": 1, "sandbox": 2}, 0)
    again = await migrate.migrate(from_url, postgres_url, to_config=to_config)
    assert (again.total_written, again.unchanged) == (0, {"pool": 1, "sandbox": 2})

    source = await sqlite.open_sqlite_store(source_path)
    target = await postgres.open_postgres_store(postgres_url, password=dev_postgres.password, config=SETTINGS)
    try:
        assert await target.dump() == await source.dump()
        copied = await target.get("sandbox", "s2")
        assert copied is not None
        assert copied.resource_version == 5
        # A change made at the source since (a gateway that kept running) is picked up by a rerun.
        await source.update(kind="sandbox", id="s1", expected_version=1, payload='{"n":10}')
        third = await migrate.migrate(from_url, postgres_url, to_config=to_config)
        assert third.written == {"sandbox": 1}
        assert await target.get("sandbox", "s1") == await source.get("sandbox", "s1")
    finally:
        await source.aclose()
        await target.aclose()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [warmshell_executable(), "store", "migrate", *args], capture_output=True, text=True, timeout=60, check=False
    )


async def test_the_command_as_a_user_types_it(tmp_path: Path, dev_postgres: DevPostgres, postgres_url: str) -> None:
    source_path = tmp_path / "warmshell.db"
    await _fill_sqlite(source_path)
    flags = (
        "--from",
        f"sqlite://{source_path}",
        "--to",
        postgres_url,
        "--password-file",
        str(dev_postgres.password_file),
    )

    done = _cli(*flags)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"copied 3 objects from sqlite://{source_path} to Postgres at 127.0.0.1:")
    assert "(0 already there)" in done.stdout
    rerun = _cli(*flags, "-o", "json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout) == {"written": {}, "unchanged": {"pool": 1, "sandbox": 2}}
    assert dev_postgres.password not in done.stdout + done.stderr + rerun.stdout + rerun.stderr

    missing = tmp_path / "absent.db"
    refused = _cli("--from", f"sqlite://{missing}", "--to", postgres_url)
    assert refused.returncode == 5  # invalid argument
    assert f"--from: no SQLite store at {missing}" in refused.stderr
    assert not missing.exists()  # the refusal did not create an empty store
