"""Postgres store: the same `objects` table as SQLite, shared by gateway replicas, over an asyncpg
connection pool. Every database failure leaves this module as a domain error: a database that
cannot be reached becomes UnavailableError naming the store (never the password), so callers,
reconcilers and `/healthz` see one kind of temporary failure and the pool reconnects by itself."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import asyncpg

from warmshell.core.config import StoreConfig
from warmshell.core.errors import (
    AlreadyExistsError,
    ConflictError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)
from warmshell.gateway.store import schema, storage_errors
from warmshell.gateway.store.base import NewObject, StoredObject, rows_deleted

__all__ = ["Change", "PostgresStore", "StartupProgress", "describe_url", "open_postgres_store", "parse_change"]

log = logging.getLogger(__name__)

_COLUMNS = "kind, id, name, workspace, resource_version, payload"
# Names sort byte-wise, as in SQLite, whatever collation the database was created with.
_ORDER = ' ORDER BY workspace COLLATE "C", name COLLATE "C"'
_STARTUP_RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0)
# Start-up waiting for a database: every failed attempt is logged up to this many, then at most
# one line every _QUIET_LOG_SECONDS (the others at DEBUG), so minutes of waiting stay readable.
_LOGGED_ATTEMPTS = 5
_QUIET_LOG_SECONDS = 30.0

# Failures that say "the database is not there right now" (as opposed to a bad query): refused
# or dropped connections, timeouts, a server shutting down or starting up, no free connection slot.
_UNREACHABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    # A connection the server terminated while idle (pg_terminate_backend, a restart) can leave
    # the client's protocol state confused on its next use ("another operation is in progress").
    asyncpg.InternalClientError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
    asyncpg.QueryCanceledError,
)
# Failures no retry will fix: wrong credentials, a database or role that does not exist.
_MISCONFIGURED: tuple[type[BaseException], ...] = (
    asyncpg.ClientConfigurationError,  # e.g. an unknown sslmode in the URL
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidPasswordError,
    asyncpg.InvalidCatalogNameError,
)


def describe_url(url: str) -> str:
    """host:port/database of a URL: what messages and logs may show (no user, no password).

    The user and password are cut at the URL's last `@` before anything is parsed: a password
    with an unescaped `/`, `#` or `?` would otherwise end the authority early and be shown
    as a host, port or path."""
    scheme, _, rest = url.partition("://")
    rest = rest.rpartition("@")[2].partition("?")[0].partition("#")[0]
    parts = urlsplit(f"{scheme}://{rest}")
    try:
        host = parts.hostname or "localhost"
        host = f"[{host}]" if ":" in host else host
        return f"{host}:{parts.port or 5432}{parts.path or '/'}"
    except ValueError:  # not one host:port (libpq's multi-host form): everything after the @
        return parts.netloc.rpartition("@")[2] + parts.path


def _why(exc: BaseException, timeout: float) -> str:
    """A failure in words an operator acts on."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is Postgres running and listening there?)"
    if isinstance(exc, TimeoutError | asyncpg.QueryCanceledError):
        return f"no answer within {timeout:g}s"
    if isinstance(exc, asyncpg.CannotConnectNowError | asyncpg.AdminShutdownError | asyncpg.CrashShutdownError):
        return "the database is shutting down or starting up"
    if isinstance(exc, asyncpg.InterfaceError | asyncpg.InternalClientError | asyncpg.PostgresConnectionError):
        return "the connection to the database was lost"
    return str(exc) or type(exc).__name__


@dataclass
class StartupProgress:
    """How opening the store at start is going, for `/healthz` while the gateway waits for it."""

    where: str = ""  # describe_url of the store (never the password)
    attempts: int = 0  # failed attempts so far
    last_error: str = ""
    waited_seconds: float = 0.0

    def problem(self) -> str | None:
        """Why the store is not open yet, once an attempt failed; None before that."""
        if not self.attempts:
            return None
        return (
            f"the store (Postgres at {self.where}) is unreachable: {self.last_error}"
            f" ({self.attempts} attempts in {self.waited_seconds:.0f}s so far; still retrying)"
        )


@dataclass(frozen=True)
class Change:
    """One committed write, as another replica hears of it; `kind` "" means "anything may have
    changed" (the listening connection was lost and is back: re-read what you watch)."""

    op: str  # INSERT, UPDATE, DELETE, or "" after a gap
    kind: str
    id: str
    version: int = 0  # the resource_version an INSERT or UPDATE wrote (0: not said)


def parse_change(payload: str) -> Change:
    """A notification on the changes channel (`schema.CHANGES_CHANNEL`), either format."""
    head, _, rest = payload.partition(" ")
    kind, _, id_ = rest.partition(" ")
    op, _, version = head.partition("@")
    return Change(op, kind, id_, int(version) if version.isdigit() else 0)


_LISTEN_RETRY_SECONDS = 1.0
_LISTEN_PING_SECONDS = 10.0


class PostgresStore:
    """`Store` on a Postgres database (schema from `schema.MIGRATIONS`)."""

    def __init__(
        self, pool: asyncpg.Pool, *, where: str, config: StoreConfig, url: str = "", password: str | None = None
    ) -> None:
        self._pool = pool
        self._where = where
        self._config = config
        self._url = url
        self._password = password

    async def follow_changes(
        self,
        on_change: Callable[[Change], None],
        on_progress: Callable[[str], None] | None = None,
        listening: asyncio.Event | None = None,
        on_listening: Callable[[bool], None] | None = None,
    ) -> None:
        """Call `on_change` for every write any replica commits, until cancelled: LISTEN on a
        connection of its own (outside the pool), re-established after a loss, with a gap
        `Change` each time it is back (writes may have been missed meanwhile). `on_progress`
        gets every payload sent with `notify_progress` (by any replica, this one included);
        `listening` is set once the first LISTEN is in place; `on_listening` is told True each
        time a LISTEN is in place (before the gap `Change`), False when it is lost."""
        first = True
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(
                    self._url, password=self._password, timeout=self._config.connect_timeout_seconds
                )
                lost = asyncio.Event()

                def heard(_conn: object, _pid: int, _channel: str, payload: str) -> None:
                    on_change(parse_change(payload))

                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                await conn.add_listener(schema.CHANGES_CHANNEL, heard)
                if on_progress is not None:
                    await conn.add_listener(schema.PROGRESS_CHANNEL, lambda _c, _p, _ch, payload: on_progress(payload))
                if listening is not None:
                    listening.set()
                if on_listening is not None:
                    on_listening(True)
                if not first:
                    on_change(Change("", "", ""))
                first = False
                while not lost.is_set():
                    # A silent network loses nothing visibly: a ping now and then finds it.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), _LISTEN_PING_SECONDS)
                    if not lost.is_set():
                        await conn.fetchval("SELECT 1", timeout=self._config.connect_timeout_seconds)
                log.warning("store at %s: change feed lost; reconnecting", self._where)
            except _UNREACHABLE as exc:
                log.debug("store at %s: change feed unavailable: %s", self._where, exc)
            except asyncpg.PostgresError as exc:
                log.warning("store at %s: change feed refused: %s", self._where, exc)
            finally:
                if on_listening is not None:
                    on_listening(False)
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await asyncio.shield(conn.close(timeout=1.0))
            first = False
            await asyncio.sleep(_LISTEN_RETRY_SECONDS)

    async def notify_progress(self, payloads: list[str]) -> None:
        """Send `payloads` on the progress channel, in one statement (nothing is stored)."""
        async with self._connection() as conn:
            await conn.execute(
                "SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload", schema.PROGRESS_CHANNEL, payloads
            )

    def _unavailable(self, exc: BaseException) -> UnavailableError:
        why = _why(exc, self._config.statement_timeout_seconds)
        return UnavailableError(f"the store (Postgres at {self._where}) is unreachable: {why}")

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        try:
            async with self._pool.acquire(timeout=self._config.connect_timeout_seconds) as conn:
                yield conn
        except _UNREACHABLE as exc:
            # Idle pooled connections to a database that went away are dead too: drop them all,
            # so the first call after it returns gets a fresh connection instead of this error.
            await self._pool.expire_connections()
            raise self._unavailable(exc) from exc
        except asyncpg.UniqueViolationError:
            raise  # the caller's to name (which object already exists)
        except asyncpg.PostgresError as exc:
            # Anything else the server refused: a full disk is RESOURCE_EXHAUSTED, a read-only
            # standby after a failover or a deadlock is temporary (see storage_errors).
            raise storage_errors.translate_postgres(exc, self._where) from exc

    async def _fetch(self, query: str, *args: object) -> list[StoredObject]:
        async with self._connection() as conn:
            rows = await conn.fetch(query, *args)
        return [StoredObject(*tuple(r)) for r in rows]

    async def _read(self, query: str, *args: object) -> list[StoredObject]:
        """`_fetch` for reads, once more on a fresh connection when the pooled one had died
        (a database restart or a terminated backend): reads are safe to repeat, and the first
        call after an outage should not fail for a connection the pool had not noticed was gone."""
        try:
            return await self._fetch(query, *args)
        except UnavailableError as exc:
            if isinstance(exc.__cause__, OSError | TimeoutError):
                raise  # refused or silent: no fresh connection would do better now
            return await self._fetch(query, *args)

    async def create(
        self, *, kind: str, id: str, name: str, workspace: str, payload: str, beside: Sequence[NewObject] = ()
    ) -> StoredObject:
        """Insert at resource_version 1, with `beside` in the same statement (all or none)."""
        args: list[object] = [kind, id, name, workspace, payload]
        for obj in beside:
            args += [obj.kind, obj.id, obj.name, obj.workspace, obj.payload]
        rows = ", ".join(f"(${n}, ${n + 1}, ${n + 2}, ${n + 3}, 1, ${n + 4})" for n in range(1, len(args), 5))
        try:
            async with self._connection() as conn:
                await conn.execute(f"INSERT INTO objects ({_COLUMNS}) VALUES {rows}", *args)
        except asyncpg.UniqueViolationError as exc:
            raise AlreadyExistsError(f"{kind} {workspace}/{name} already exists") from exc
        return StoredObject(kind, id, name, workspace, 1, payload)

    async def get(self, kind: str, id: str) -> StoredObject | None:
        """Look up by id."""
        rows = await self._read(f"SELECT {_COLUMNS} FROM objects WHERE kind = $1 AND id = $2", kind, id)
        return rows[0] if rows else None

    async def get_by_name(self, kind: str, workspace: str, name: str) -> StoredObject | None:
        """Look up by (workspace, name)."""
        rows = await self._read(
            f"SELECT {_COLUMNS} FROM objects WHERE kind = $1 AND workspace = $2 AND name = $3", kind, workspace, name
        )
        return rows[0] if rows else None

    async def list(self, kind: str, workspace: str | None = None) -> builtins.list[StoredObject]:
        """All objects of a kind, ordered by workspace and name (byte-wise)."""
        if workspace is None:
            return await self._read(f"SELECT {_COLUMNS} FROM objects WHERE kind = $1" + _ORDER, kind)
        return await self._read(
            f"SELECT {_COLUMNS} FROM objects WHERE kind = $1 AND workspace = $2" + _ORDER, kind, workspace
        )

    async def update(self, *, kind: str, id: str, expected_version: int, payload: str) -> StoredObject:
        """Compare-and-swap the payload. Under READ COMMITTED a concurrent writer of the same row
        blocks on its lock, then re-checks the version on the new row, so exactly one wins."""
        rows = await self._fetch(
            "UPDATE objects SET payload = $1, resource_version = resource_version + 1, updated_at = now()"
            f" WHERE kind = $2 AND id = $3 AND resource_version = $4 RETURNING {_COLUMNS}",
            payload,
            kind,
            id,
            expected_version,
        )
        if not rows:
            raise ConflictError(f"{kind} {id} is no longer at resource version {expected_version}")
        return rows[0]

    async def delete(
        self, kind: str, id: str, expected_version: int | None = None, *, beside: Sequence[tuple[str, str]] = ()
    ) -> bool:
        """Delete (conditionally when expected_version is given), and `beside` (`rows_deleted`)."""
        if beside:
            return await self._delete_rows(rows_deleted(kind, id, expected_version, beside))
        async with self._connection() as conn:
            if expected_version is None:
                deleted = await conn.fetchval("DELETE FROM objects WHERE kind = $1 AND id = $2 RETURNING 1", kind, id)
            else:
                deleted = await conn.fetchval(
                    "DELETE FROM objects WHERE kind = $1 AND id = $2 AND resource_version = $3 RETURNING 1",
                    kind,
                    id,
                    expected_version,
                )
        if deleted is None and expected_version is not None and await self.get(kind, id):
            raise ConflictError(f"{kind} {id} is no longer at resource version {expected_version}")
        return deleted is not None

    async def _delete_rows(self, rows: builtins.list[tuple[str, str]]) -> bool:
        """Delete `rows` (kind, id) in one statement; whether the first was there."""
        async with self._connection() as conn:
            gone = await conn.fetch(
                "DELETE FROM objects WHERE (kind, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))"
                " RETURNING kind, id",
                [kind for kind, _ in rows],
                [id_ for _, id_ in rows],
            )
        return tuple(rows[0]) in {(row["kind"], row["id"]) for row in gone}

    async def dump(self) -> builtins.list[StoredObject]:
        """Every object of every kind."""
        return await self._read(f"SELECT {_COLUMNS} FROM objects ORDER BY kind, id")

    async def restore(self, obj: StoredObject) -> bool:
        """Write `obj` exactly (its resource_version too) unless the row is already as new."""
        try:
            async with self._connection() as conn:
                written = await conn.fetchval(
                    f"INSERT INTO objects ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"
                    " ON CONFLICT (kind, id) DO UPDATE SET name = EXCLUDED.name, workspace = EXCLUDED.workspace,"
                    " resource_version = EXCLUDED.resource_version, payload = EXCLUDED.payload, updated_at = now()"
                    " WHERE objects.resource_version < EXCLUDED.resource_version RETURNING 1",
                    obj.kind,
                    obj.id,
                    obj.name,
                    obj.workspace,
                    obj.resource_version,
                    obj.payload,
                )
        except asyncpg.UniqueViolationError as exc:
            raise AlreadyExistsError(
                f"{obj.kind} {obj.workspace}/{obj.name} already exists with another id than {obj.id}"
            ) from exc
        return written is not None

    async def ping(self) -> None:
        """One round trip; UnavailableError when the database cannot be reached."""
        async with self._connection() as conn:
            await conn.fetchval("SELECT 1", timeout=self._config.connect_timeout_seconds)

    async def aclose(self) -> None:
        """Close every pooled connection (waiting at most the statement timeout for busy ones)."""
        try:
            await asyncio.wait_for(self._pool.close(), self._config.statement_timeout_seconds)
        except TimeoutError:
            self._pool.terminate()


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """The pool's reset on release, which does nothing: asyncpg's default sends a query (advisory
    unlock, CLOSE ALL, UNLISTEN, RESET ALL) on every release, one more round trip per store call,
    for session state this store never leaves on a pooled connection (LISTEN runs on a connection
    of its own, the migration lock is transaction-scoped, nothing SETs). An open transaction is
    still rolled back by asyncpg before this is called."""


async def open_postgres_store(
    url: str, *, password: str | None, config: StoreConfig, progress: StartupProgress | None = None
) -> PostgresStore:
    """Connect a pool and apply pending schema migrations, retrying an unreachable database for as
    long as it takes (or until `startup_timeout_seconds` have passed, when that is not 0); wrong
    credentials, a missing database, an invalid URL or a read-only server fail at once.
    `progress` is kept up to date with the failed attempts (what `/healthz` reports meanwhile)."""
    where = describe_url(url)
    progress = progress if progress is not None else StartupProgress()
    progress.where = where
    loop = asyncio.get_running_loop()
    started = loop.time()
    limit = config.startup_timeout_seconds
    logged_at: float | None = None
    for attempt in itertools.count(1):
        try:
            store = await _connect_and_migrate(url, password=password, config=config, where=where)
        except _MISCONFIGURED as exc:
            raise FailedPreconditionError(f"the store (Postgres at {where}) refused this gateway: {exc}") from exc
        except (ValueError, OverflowError):
            # asyncpg's own words quote the piece it could not parse, which may be the password.
            raise InvalidArgumentError(
                "store.url",
                f"not a valid postgresql:// URL (Postgres at {where}); percent-encode a password holding"
                " / # ? @ or %, or give it in store.password_file",
            ) from None
        except _UNREACHABLE as exc:
            why = _why(exc, config.connect_timeout_seconds)
            delay = _STARTUP_RETRY_DELAYS[min(attempt, len(_STARTUP_RETRY_DELAYS)) - 1]
            now = loop.time()
            progress.attempts, progress.last_error, progress.waited_seconds = attempt, why, now - started
            if limit and now + delay > started + limit:
                raise UnavailableError(
                    f"the store (Postgres at {where}) is unreachable: {why}"
                    f" (gave up after {attempt} attempts in {limit:g}s)"
                ) from exc
            if attempt <= _LOGGED_ATTEMPTS or logged_at is None or now - logged_at >= _QUIET_LOG_SECONDS:
                logged_at = now
                quiet = f" (logged every {_QUIET_LOG_SECONDS:g}s from now on)" if attempt == _LOGGED_ATTEMPTS else ""
                log.warning(
                    "store at %s unreachable (attempt %d, %.0fs so far): %s; retrying in %gs%s",
                    where,
                    attempt,
                    now - started,
                    why,
                    delay,
                    quiet,
                )
            else:
                log.debug("store at %s unreachable (attempt %d): %s", where, attempt, why)
            await asyncio.sleep(delay)
        except asyncpg.PostgresError as exc:
            # The server answered but refused to prepare the schema (e.g. a read-only standby).
            raise FailedPreconditionError(f"the store (Postgres at {where}) could not be prepared: {exc}") from exc
        else:
            if attempt > 1:
                log.info("store at %s reachable after %d attempts", where, attempt)
            return store
    raise AssertionError("itertools.count does not end")


async def _connect_and_migrate(url: str, *, password: str | None, config: StoreConfig, where: str) -> PostgresStore:
    pool = await asyncpg.create_pool(
        url,
        password=password,
        min_size=config.pool_min_size,
        max_size=config.pool_max_size,
        timeout=config.connect_timeout_seconds,
        command_timeout=config.statement_timeout_seconds,
        # A connection idle this long is closed, so a pool does not sit on stale sockets for hours.
        max_inactive_connection_lifetime=60.0,
        reset=_keep_session,
    )
    try:
        async with pool.acquire(timeout=config.connect_timeout_seconds) as conn:
            applied = await schema.apply_migrations(conn)
    except BaseException:
        pool.terminate()
        raise
    if applied:
        log.info("store at %s: applied schema migrations %s", where, applied)
    return PostgresStore(pool, where=where, config=config, url=url, password=password)
