"""A real Postgres whose disk fills up: the store's table lives in a tablespace on a 1 MiB tmpfs.
Creates fail with RESOURCE_EXHAUSTED in words a user understands (never an asyncpg class), while
get, list and delete go on. (Postgres reuses deleted rows' space only after a vacuum, which on a
disk with not one page left needs the operator to free some first: that is the server's to run.)"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from tests.helpers.postgres import DevPostgres
from tests.integration.store.conftest import SETTINGS
from warmshell.core.errors import ResourceExhaustedError
from warmshell.gateway.store import postgres


def payload() -> str:
    return json.dumps({"x": secrets.token_hex(16 * 1024)})


pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tiny tmpfs needs root")


@pytest.fixture
async def tiny_tablespace(dev_postgres: DevPostgres, postgres_url: str) -> AsyncIterator[str]:
    """The store's migrated `objects` table, moved to a tablespace on a 1 MiB tmpfs."""
    space = dev_postgres.base / f"tiny-{secrets.token_hex(4)}"
    space.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(space)], check=True)
    name = f"tiny_{secrets.token_hex(4)}"
    try:
        owner = (dev_postgres.base / "data").stat()
        os.chown(space, owner.st_uid, owner.st_gid)
        store = await postgres.open_postgres_store(postgres_url, password=dev_postgres.password, config=SETTINGS)
        await store.aclose()  # migrated: the table exists
        admin = await asyncpg.connect(postgres_url, password=dev_postgres.password)
        try:
            await admin.execute(f"CREATE TABLESPACE {name} LOCATION '{space}'")
            await admin.execute(f"ALTER TABLE objects SET TABLESPACE {name}")
            yield postgres_url
            await admin.execute("ALTER TABLE objects SET TABLESPACE pg_default")
            await admin.execute(f"DROP TABLESPACE {name}")
        finally:
            await admin.close()
    finally:
        subprocess.run(["umount", "--lazy", str(space)], check=False)
        space.rmdir()


async def test_a_full_disk_refuses_creates_and_keeps_reads_and_deletes(
    dev_postgres: DevPostgres, tiny_tablespace: str
) -> None:
    store = await postgres.open_postgres_store(tiny_tablespace, password=dev_postgres.password, config=SETTINGS)
    try:
        # Incompressible payloads, so the table (and its TOAST table) grows a page at a time.
        created: list[str] = []
        error: ResourceExhaustedError | None = None
        for number in range(200):
            try:
                await store.create(kind="sandbox", id=str(number), name=f"s{number}", workspace="w", payload=payload())
            except ResourceExhaustedError as exc:
                error = exc
                break
            created.append(str(number))
        assert error is not None, "200 creates of 32 KiB fitted in 1 MiB"
        message = str(error)
        assert message.startswith(f"the gateway's state store (Postgres at {postgres.describe_url(tiny_tablespace)})")
        assert "is out of disk space" in message
        assert "No space left on device" in message
        assert "asyncpg" not in message
        assert created, "some fit before the disk was full"

        assert await store.get("sandbox", created[0]) is not None
        assert len(await store.list("sandbox", "w")) == len(created)
        for sandbox_id in created:
            assert await store.delete("sandbox", sandbox_id) is True
        assert await store.list("sandbox", "w") == []
    finally:
        await store.aclose()


def test_the_tmpfs_is_gone(dev_postgres: DevPostgres) -> None:
    assert not any(Path(dev_postgres.base).glob("tiny-*"))
