"""The Postgres store's schema, as numbered migrations applied at start: one transaction under an
advisory lock, so replicas starting together apply each migration exactly once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from warmshell.core.errors import FailedPreconditionError

__all__ = [
    "CHANGES_CHANNEL",
    "LOCK_KEY",
    "MIGRATIONS",
    "PROGRESS_CHANNEL",
    "Migration",
    "apply_migrations",
    "pending_migrations",
]

# Any fixed 64-bit key works; every warmshell gateway on a database must use the same one.
LOCK_KEY = 0x7761726D5F736368  # "warm_sch"
# LISTEN/NOTIFY channel: "<INSERT|UPDATE>@<resource_version> <kind> <id>" or "DELETE <kind> <id>"
# after every committed write (before migration 3, without "@<resource_version>"; a replica
# still running that code reads the op as one it does not know and treats it as a change).
CHANGES_CHANNEL = "warmshell_objects"
# LISTEN/NOTIFY channel for progress lines replicas pass to each other (`gateway.progressfeed`).
PROGRESS_CHANNEL = "warmshell_progress"


@dataclass(frozen=True)
class Migration:
    """One schema step; `sql` runs inside the migration transaction (Postgres DDL is transactional)."""

    version: int
    description: str
    sql: str


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "objects table: compare-and-swap on resource_version, names unique per workspace",
        """
        CREATE TABLE objects (
            kind text NOT NULL,
            id text NOT NULL,
            name text NOT NULL,
            workspace text NOT NULL,
            resource_version bigint NOT NULL,
            payload text NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (kind, id)
        );
        CREATE UNIQUE INDEX objects_by_name ON objects (kind, workspace, name);
        """,
    ),
    Migration(
        2,
        "notify every change of an object on channel warmshell_objects, for the other replicas",
        f"""
        CREATE FUNCTION warmshell_notify_object() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            row_ objects%ROWTYPE;
        BEGIN
            IF TG_OP = 'DELETE' THEN row_ := OLD; ELSE row_ := NEW; END IF;
            PERFORM pg_notify('{CHANGES_CHANNEL}', TG_OP || ' ' || row_.kind || ' ' || row_.id);
            RETURN NULL;
        END $$;
        CREATE TRIGGER objects_notify AFTER INSERT OR UPDATE OR DELETE ON objects
            FOR EACH ROW EXECUTE FUNCTION warmshell_notify_object();
        """,
    ),
    Migration(
        3,
        'say the version an insert or update wrote ("UPDATE@7 kind id"), so a replica tells its own'
        " writes' echoes and rows it already holds from news",
        f"""
        CREATE OR REPLACE FUNCTION warmshell_notify_object() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'DELETE' THEN
                PERFORM pg_notify('{CHANGES_CHANNEL}', 'DELETE ' || OLD.kind || ' ' || OLD.id);
            ELSE
                PERFORM pg_notify(
                    '{CHANGES_CHANNEL}', TG_OP || '@' || NEW.resource_version || ' ' || NEW.kind || ' ' || NEW.id
                );
            END IF;
            RETURN NULL;
        END $$;
        """,
    ),
)


def pending_migrations(applied: set[int], known: Sequence[Migration]) -> list[Migration]:
    """The known migrations not yet applied, in order. A database that has a version this code
    does not know was migrated by a newer gateway: refuse rather than run on a schema we do not know."""
    newest = max((m.version for m in known), default=0)
    unknown = sorted(v for v in applied if v > newest)
    if unknown:
        raise FailedPreconditionError(
            f"the store's schema is at version {unknown[-1]}, newer than this gateway knows ({newest}):"
            " upgrade this gateway"
        )
    return sorted((m for m in known if m.version not in applied), key=lambda m: m.version)


async def apply_migrations(conn: asyncpg.Connection, known: Sequence[Migration] = MIGRATIONS) -> list[int]:
    """Bring the schema up to date; returns the versions this call applied (empty when current).

    The advisory lock is taken before anything else, even the bookkeeping table's creation:
    two concurrent `CREATE TABLE IF NOT EXISTS` can still collide on the catalog."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK_KEY)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, description text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        applied = {int(r["version"]) for r in await conn.fetch("SELECT version FROM schema_migrations")}
        todo = pending_migrations(applied, known)
        for migration in todo:
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, description) VALUES ($1, $2)",
                migration.version,
                migration.description,
            )
    return [m.version for m in todo]
