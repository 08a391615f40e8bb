"""`warmshell store migrate`: copy every object of one store into another (typically a gateway's
SQLite file into the Postgres that replicas will share), resource versions included, so clients
holding a version keep compare-and-swapping from it. Idempotent: a rerun copies only what is
missing or older at the destination, so an interrupted copy is finished by running it again."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from warmshell.core.config import StoreConfig
from warmshell.core.errors import InvalidArgumentError
from warmshell.gateway.store import opening, postgres
from warmshell.gateway.store.base import Store

__all__ = ["CopyReport", "copy_objects", "describe", "migrate"]

# A command, unlike a gateway, does not wait for a database for ever: its default wait for one
# that cannot be reached (a gateway's default, 0, is no limit).
COMMAND_STARTUP_TIMEOUT_SECONDS = 30.0


def _bounded(config: StoreConfig | None) -> StoreConfig:
    """`config` (or the defaults) with a limit on waiting for an unreachable database."""
    config = config or StoreConfig()
    if config.startup_timeout_seconds:
        return config
    return config.model_copy(update={"startup_timeout_seconds": COMMAND_STARTUP_TIMEOUT_SECONDS})


@dataclass
class CopyReport:
    """What a copy did, per kind."""

    written: dict[str, int] = field(default_factory=dict)  # new or newer at the source
    unchanged: dict[str, int] = field(default_factory=dict)  # already there at that version or newer

    @property
    def total_written(self) -> int:
        """Objects this copy wrote."""
        return sum(self.written.values())

    @property
    def total_unchanged(self) -> int:
        """Objects the destination already had."""
        return sum(self.unchanged.values())


async def copy_objects(source: Store, destination: Store) -> CopyReport:
    """Restore every object of `source` into `destination`."""
    report = CopyReport()
    for obj in await source.dump():
        counts = report.written if await destination.restore(obj) else report.unchanged
        counts[obj.kind] = counts.get(obj.kind, 0) + 1
    return report


def describe(url: str) -> str:
    """A store URL as it may be shown (a Postgres password never is)."""
    return url if url.startswith("sqlite://") else f"Postgres at {postgres.describe_url(url)}"


async def migrate(from_url: str, to_url: str, *, to_config: StoreConfig | None = None) -> CopyReport:
    """Open both stores (the destination's schema is migrated on open), copy, close.

    Run it while no gateway writes to the source: a write made during the copy may be missed
    (a rerun picks it up)."""
    if from_url == to_url:
        raise InvalidArgumentError("--to", "is the same store as --from")
    source_path = Path(from_url.removeprefix("sqlite://"))
    if from_url.startswith("sqlite://") and not await asyncio.to_thread(source_path.is_file):
        # Opening a SQLite path creates it: an empty source would "succeed" at copying nothing.
        raise InvalidArgumentError("--from", f"no SQLite store at {source_path}")
    source = await opening.open_url(from_url, _bounded(None))
    try:
        destination = await opening.open_url(to_url, _bounded(to_config))
        try:
            return await copy_objects(source, destination)
        finally:
            await destination.aclose()
    finally:
        await source.aclose()
